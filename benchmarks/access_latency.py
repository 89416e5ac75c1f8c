"""Latency of label-only access: in-process (single and batched) and over HTTP (`lucid serve`),
and the timing side channel between released and noised answers.

    python benchmarks/access_latency.py [--run /tmp/crypto-run] [--requests 2000] [--clients 8]
                                        [--side-channel 20000] [--min-response-ms 0] [--report FILE.md]

The run defaults to a Crypto 2x50 run; if it does not exist it is trained first, as with
    lucid train ../shared/data/crypto/train.npz --test-data ../shared/data/crypto/test.npz \
        --arch 2x50 --batch-size 100 --out /tmp/crypto-run
If the run has no bounds.json (not verified yet), a PLACEHOLDER bound is used for timing only:
per class, the 10th percentile of N's test-set confidence (so ~10 % of queries take the noised,
memo-writing path). It is written to a temporary copy of the run, never into the run itself.

Targets (issue 4): <= 0.05 ms/query batched, <= 0.2 ms single query in-process, HTTP p99 <= 10 ms
with 8 concurrent clients. Queries are the run's test inputs, in original units.

Side channel (issue 22): N uniform inputs of the verified domain per path (released / noised,
known offline from N and the bounds), every one new to the memo, asked one per query in one
random interleaved order - in process, then over HTTP on loopback (one keep-alive client); then
the same inputs again (memo hits). Per path: median, p90, p99; Mann-Whitney U and two-sample
Kolmogorov-Smirnov tests between the paths. Target: no test separates them at p < 0.01.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "crypto"


def ensure_run(run: Path) -> None:
    if (run / "run.json").exists():
        return
    if not (SHARED / "train.npz").exists():
        sys.exit(f"{run} does not exist and {SHARED} is missing: train a run first")
    print(f"training {run} (Crypto 2x50; once) ...", file=sys.stderr)
    from lucid.training import train_run

    train_run(str(SHARED / "train.npz"), run, test_data=str(SHARED / "test.npz"), arch="2x50", batch_size=100)


def query_rows(r) -> np.ndarray:
    """The queries: the run's test split, or its training rows when it was trained without one."""
    data = r.data()
    x = data["X_test"] if len(data["X_test"]) else data["X_train"]
    return x.astype(np.float64)


def with_bounds(run: Path, scratch: Path) -> tuple[Path, str]:
    """The run itself if verified, else a scratch copy (links) with a placeholder bounds.json."""
    if (run / "bounds.json").exists():
        return run, "bounds.json of the run (verified)"
    from lucid.network import confidence
    from lucid.rundir import open_run, write_bounds

    copy = scratch / "run"
    copy.mkdir()
    for name in ("run.json", "networks.safetensors", "data.npz"):
        os.symlink((run / name).resolve(), copy / name)
    r = open_run(run)
    stack = r.networks().select([0])
    x = query_rows(r)
    scores = stack.forward(x)[0]
    cls, conf = scores.argmax(1), confidence(scores)
    bounds = {c: (float(np.quantile(conf[cls == c], 0.10)) if (cls == c).any() else None)
              for c in range(r.num_classes)}
    entries = {str(c): {"upper": u, "lower": None, "complete": False, "seconds": 0.0, "nodes": 0}
               for c, u in bounds.items()}
    write_bounds(copy, entries, solver="placeholder (timing only)", options={})
    return copy, f"PLACEHOLDER bounds (10th percentile of test confidence per class, timing only): {bounds}"


def original_units(run: Path) -> np.ndarray:
    from lucid.rundir import open_run

    r = open_run(run)
    x = query_rows(r)
    scaler = r.meta.get("scaler") or {}
    offset = np.asarray(scaler.get("offset", np.zeros(x.shape[1])), dtype=np.float64)
    scale = np.asarray(scaler.get("scale", np.ones(x.shape[1])), dtype=np.float64)
    lo, hi = r.domain
    x = np.clip(x, lo, hi)
    safe = np.where(scale != 0, scale, 1.0)
    return x / safe + offset


def in_process(run: Path, x: np.ndarray, memo: Path, repeats: int) -> dict:
    from lucid.access import LabelOnlyClassifier

    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, memo=memo)
    noised = clf.decide(clf.to_network_space(x))[1]
    clf.predict(x)  # warm-up; also fills the memo, as in a long-running service
    single, cpu = [], []
    for _ in range(repeats):
        for i in range(len(x)):
            c0, t0 = time.thread_time_ns(), time.perf_counter()
            clf.predict(x[i : i + 1])
            single.append(time.perf_counter() - t0)
            cpu.append(time.thread_time_ns() - c0)
    single_ms = np.asarray(single) * 1e3
    # CPU time of the query's thread: what a query costs on an idle machine (wall time on a
    # shared machine also counts waiting for a core).
    cpu_ms = np.asarray(cpu) * 1e-6
    branch = np.tile(noised, repeats)
    big = x[np.random.default_rng(0).integers(0, len(x), size=100_000)]
    t0 = time.perf_counter()
    clf.predict(big)
    batched_big = (time.perf_counter() - t0) * 1e3 / len(big)
    t0 = time.perf_counter()
    for _ in range(repeats):
        clf.predict(x)
    batched_split = (time.perf_counter() - t0) * 1e3 / (len(x) * repeats)
    clf.close()
    return {
        "queries": len(x),
        "noised_fraction": float(noised.mean()),
        "single_ms_mean": float(single_ms.mean()),
        "single_ms_p50": float(np.percentile(single_ms, 50)),
        "single_ms_p99": float(np.percentile(single_ms, 99)),
        "single_cpu_ms_mean": float(cpu_ms.mean()),
        "single_cpu_ms_p50": float(np.percentile(cpu_ms, 50)),
        "single_ms_mean_released": float(single_ms[~branch].mean()) if (~branch).any() else None,
        "single_ms_mean_noised": float(single_ms[branch].mean()) if branch.any() else None,
        "batched_ms_per_query_test_split": batched_split,
        "batched_ms_per_query_100k": batched_big,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(port: int, rows: list, t: int, count: int) -> tuple[list[float], int, float, float]:
    """One keep-alive connection, closed loop. A raw-socket HTTP/1.1 client: http.client costs
    several times more CPU per request, which on 2 cores is taken from the server under test."""
    requests = []
    for j in range(count):
        body = json.dumps({"inputs": [rows[(t * 7919 + j) % len(rows)]]}).encode()
        head = (f"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        requests.append(head + body)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies, failures = [], 0
    started = time.time()
    for request in requests:
        t0 = time.perf_counter()
        sock.sendall(request)
        status = _read_response(sock)
        latencies.append(time.perf_counter() - t0)
        failures += status != 200
    sock.close()
    return latencies, failures, started, time.time()


def _read_response(sock: socket.socket) -> int:
    """Read one HTTP/1.1 response with a Content-Length body; return its status code."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.strip().lower() == b"content-length")
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        rest += chunk
    return int(lines[0].split()[1])


def over_http(run: Path, x: np.ndarray, memo: Path, clients: int, requests: int) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lucid", "serve", str(run), "--epsilon", "1", "--port", str(port),
                             "--memo", str(memo)], cwd=ROOT)
    try:
        _wait_healthy(port, proc)
        rows = x.tolist()
        per_client = requests // clients
        # One process per client: client threads would share a GIL and inflate the latencies.
        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            outcomes = pool.starmap(_client, [(port, rows, t, per_client) for t in range(clients)])
        # Wall time of the load itself (from the first client's start), not of spawning clients.
        wall = max(o[3] for o in outcomes) - min(o[2] for o in outcomes)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    lat = np.concatenate([np.asarray(o[0]) for o in outcomes]) * 1e3
    return {
        "clients": clients,
        "requests": int(lat.size),
        "failures": int(sum(o[1] for o in outcomes)),
        "throughput_rps": float(lat.size / wall),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(statistics.fmean(lat)),
    }


def side_channel_inputs(run: Path, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """n released and n noised distinct uniform inputs (original units), and the noised share."""
    from lucid.access import LabelOnlyClassifier

    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    rng = np.random.default_rng(seed)
    lo, hi = clf.domain_lower, clf.domain_upper
    released, noised, drawn, hits = [], [], 0, 0
    while sum(map(len, released)) < n or sum(map(len, noised)) < n:
        xn = lo + (hi - lo) * rng.random((200_000, len(lo)))
        mask = clf.decide(xn)[1]
        released.append(xn[~mask])
        noised.append(xn[mask])
        drawn, hits = drawn + len(xn), hits + int(mask.sum())
        if drawn > 50_000_000:
            raise SystemExit(f"fewer than {n} inputs of one path among {drawn} uniform ones")
    clf.close()
    safe = np.where(clf.scale != 0, clf.scale, 1.0)
    to_orig = lambda a: a / safe + clf.offset  # noqa: E731
    return to_orig(np.vstack(released)[:n]), to_orig(np.vstack(noised)[:n]), hits / drawn


def _compare(ms: np.ndarray, is_noised: np.ndarray) -> dict:
    from scipy.stats import ks_2samp, mannwhitneyu

    a, b = ms[~is_noised], ms[is_noised]
    out = {}
    for name, v in (("released", a), ("noised", b)):
        out[name] = {"n": int(v.size), "median_ms": float(np.median(v)), "p90_ms": float(np.percentile(v, 90)),
                     "p99_ms": float(np.percentile(v, 99)), "mean_ms": float(v.mean())}
    out["mann_whitney_p"] = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    out["ks_p"] = float(ks_2samp(a, b).pvalue)
    # Calibration (A/A): the released queries split into two random halves, same tests.
    half = np.random.default_rng(12345).random(a.size) < 0.5
    out["aa_mann_whitney_p"] = float(mannwhitneyu(a[half], a[~half], alternative="two-sided").pvalue)
    out["aa_ks_p"] = float(ks_2samp(a[half], a[~half]).pvalue)
    return out


def side_channel_in_process(run: Path, rel: np.ndarray, noi: np.ndarray, memo: Path, min_response_ms: float = 0.0,
                            seed: int = 1) -> dict:
    from lucid.access import ClassifierOptions, LabelOnlyClassifier

    x = np.vstack([rel, noi])
    is_noised = np.r_[np.zeros(len(rel), bool), np.ones(len(noi), bool)]
    order = np.random.default_rng(seed).permutation(len(x))
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, memo=memo,
                                       options=ClassifierOptions(min_response_ms=min_response_ms))
    assert (clf.decide(clf.to_network_space(x))[1] == is_noised).all()
    warm = np.random.default_rng(seed + 1).random((2000, x.shape[1]))  # new to the memo, not measured
    for i in range(len(warm)):
        clf.predict(warm[i : i + 1] * (clf.domain_upper - clf.domain_lower) + clf.domain_lower)
    # The queries are stored in the order they are asked: with all released rows in one half of
    # an array and all noised rows in the other, the two halves' memory (e.g. huge pages or not)
    # alone separated the paths, and two halves of the released rows alike (A/A).
    asked = np.ascontiguousarray(x[order])
    result = {}
    for phase in ("new", "repeat"):
        ms = np.empty(len(x))
        for j, i in enumerate(order):
            row = asked[j : j + 1]
            t0 = time.perf_counter()
            clf.predict(row)
            ms[i] = (time.perf_counter() - t0) * 1e3
        result[phase] = _compare(ms, is_noised)
    clf.close()
    return result


def side_channel_http(run: Path, rel: np.ndarray, noi: np.ndarray, memo: Path, min_response_ms: float,
                      seed: int = 2) -> dict:
    x = np.vstack([rel, noi])
    is_noised = np.r_[np.zeros(len(rel), bool), np.ones(len(noi), bool)]
    order = np.random.default_rng(seed).permutation(len(x))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lucid", "serve", str(run), "--epsilon", "1", "--port", str(port),
                             "--memo", str(memo), "--min-response-ms", str(min_response_ms)], cwd=ROOT)
    result = {}
    try:
        _wait_healthy(port, proc)
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rows = x.tolist()
        for phase in ("new", "repeat"):
            ms = np.empty(len(x))
            for i in order:
                body = json.dumps({"inputs": [rows[i]]}).encode()
                request = (f"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
                t0 = time.perf_counter()
                sock.sendall(request)
                status = _read_response(sock)
                ms[i] = (time.perf_counter() - t0) * 1e3
                if status != 200:
                    raise SystemExit(f"HTTP {status} in the side-channel run")
            result[phase] = _compare(ms, is_noised)
        sock.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return result


def _wait_healthy(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the server did not start")
        time.sleep(0.2)


def side_channel_lines(where: str, res: dict) -> list[str]:
    lines = []
    for phase, r in res.items():
        label = "new inputs (memo misses)" if phase == "new" else "the same inputs again (memo hits)"
        verdict = "separated" if min(r["mann_whitney_p"], r["ks_p"]) < 0.01 else "not separated"
        lines.append(f"| {where}, {label} | {r['released']['median_ms']:.4f} / {r['released']['p90_ms']:.4f} / "
                     f"{r['released']['p99_ms']:.4f} | {r['noised']['median_ms']:.4f} / {r['noised']['p90_ms']:.4f} / "
                     f"{r['noised']['p99_ms']:.4f} | {r['mann_whitney_p']:.3g} | {r['ks_p']:.3g} | {verdict} | "
                     f"{r['aa_mann_whitney_p']:.3g} / {r['aa_ks_p']:.3g} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=Path("/tmp/crypto-run"))
    ap.add_argument("--repeats", type=int, default=3, help="passes over the test split (in-process)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4000, help="HTTP requests in total (one input each)")
    ap.add_argument("--side-channel", type=int, default=20_000, metavar="N",
                    help="single queries per path for the side-channel section (0: skip it)")
    ap.add_argument("--min-response-ms", type=float, nargs="*", default=[0.0],
                    help="--min-response-ms values of the server in the HTTP side-channel runs (one run each)")
    ap.add_argument("--inproc-min-response-ms", type=float, nargs="*", default=[0.0],
                    help="min_response_ms values of the classifier in the in-process side-channel runs (one run each)")
    ap.add_argument("--skip-latency", action="store_true", help="only the side-channel section")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the side-channel inputs; each run then gets its own interleaving order")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None, help="write the side-channel table as markdown")
    args = ap.parse_args()

    ensure_run(args.run)
    scratch = Path(tempfile.mkdtemp(prefix="lucid-latency-"))
    try:
        run, note = with_bounds(args.run, scratch)
        print(note)
        x = original_units(run)
        results = {"run": str(args.run), "bounds": note, "cpu_count": os.cpu_count(),
                   "load_average": os.getloadavg()}
        if not args.skip_latency:
            results["in_process"] = in_process(run, x, scratch / "memo-inproc.sqlite", args.repeats)
            results["http"] = over_http(run, x, scratch / "memo-http.sqlite", args.clients, args.requests)
        if args.side_channel:
            rel, noi, share = side_channel_inputs(run, args.side_channel, seed=args.seed)
            sc = {"per_path": args.side_channel, "uniform_noised_share": share, "seed": args.seed}
            # A distinct interleaving per run: one fixed order would meet deterministic periodic
            # events (garbage collection, LRU flushes, WAL checkpoints) at the same positions in
            # every run and make the runs' tests dependent.
            for k, d in enumerate(args.inproc_min_response_ms):
                sc[f"in_process_min_response_{d:g}ms"] = side_channel_in_process(
                    run, rel, noi, scratch / f"memo-sc-inproc-{d:g}.sqlite", d, seed=1000 * args.seed + 1 + k)
            for k, d in enumerate(args.min_response_ms):
                sc[f"http_min_response_{d:g}ms"] = side_channel_http(run, rel, noi, scratch / f"memo-sc-{d:g}.sqlite", d,
                                                                 seed=1000 * args.seed + 101 + k)
            sc["load_average_after"] = os.getloadavg()
            results["side_channel"] = sc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{results['cpu_count']} cores, load average {results['load_average'][0]:.1f} at the start")
    if "side_channel" in results:
        sc = results["side_channel"]
        table = [f"{sc['per_path']} single queries per path, uniform inputs of the verified domain "
                 f"({100 * sc['uniform_noised_share']:.1f} % of uniform inputs are noised); one random interleaved order.",
                 "", "| where | released: median / p90 / p99 ms | noised: median / p90 / p99 ms | Mann-Whitney p | KS p | "
                 "at p < 0.01 | A/A p (MW / KS) |", "|---|---|---|---|---|---|---|"]
        for key, res in sc.items():
            if key.startswith("in_process_min_response_"):
                d = key[len("in_process_min_response_"):-2]
                table += side_channel_lines(f"in process, min_response_ms {d}", res)
        for key, res in sc.items():
            if key.startswith("http_min_response_"):
                d = key[len("http_min_response_"):-2]
                table += side_channel_lines(f"HTTP, 1 client, --min-response-ms {d}", res)
        print("\n".join(table))
        if args.report:
            args.report.write_text("\n".join(table) + "\n")
    if args.skip_latency:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    ip, h = results["in_process"], results["http"]
    print(f"in-process, {ip['queries']} test queries ({100 * ip['noised_fraction']:.1f} % noised):")
    print(f"  single query: mean {ip['single_ms_mean']:.4f} ms, p50 {ip['single_ms_p50']:.4f} ms, "
          f"p99 {ip['single_ms_p99']:.4f} ms (released {ip['single_ms_mean_released']}, "
          f"noised {ip['single_ms_mean_noised']})   target <= 0.2 ms")
    print(f"  single query CPU time: mean {ip['single_cpu_ms_mean']:.4f} ms, p50 {ip['single_cpu_ms_p50']:.4f} ms")
    print(f"  batched: {ip['batched_ms_per_query_test_split']:.5f} ms/query (test split), "
          f"{ip['batched_ms_per_query_100k']:.5f} ms/query (100k batch)   target <= 0.05 ms")
    print(f"HTTP, {h['clients']} clients x {h['requests'] // h['clients']} requests: {h['throughput_rps']:.0f} req/s, "
          f"p50 {h['p50_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms, failures {h['failures']}   target p99 <= 10 ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
