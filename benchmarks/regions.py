"""Region-wise decision bounds against one global bound per class (`lucid verify --regions K`).

  python benchmarks/regions.py                       # every workload, K = 1 4 16 64 256
  python benchmarks/regions.py --workloads breast_cancer-2x10 --ks 1,16 --time-limit 60
  python benchmarks/regions.py --report-only
  python benchmarks/regions.py --refresh             # evaluate the finished runs again (and time their queries)

Per workload the data are split (seeded) into train / public / test, disjoint: the networks are
trained on train, the boxes are weighed by the public split (`--public-inputs`), and the
evaluation uses the test split, which neither saw. Every K gets the same `--time-limit` (the whole
verification, root box included), then `lucid evaluate` at ε = 0, 0.2, 1: noised share and
accuracy of LUCID with the regions, with its own global bounds (the leaves' maximum) and
Naive-iDP (the exact leaking set of the test inputs), single-query access time in process, and
where the verification's time went (root box, other boxes). A released test input on which some
network disagrees with N would be a counterexample to the bounds: it is counted and must be 0.

Resumable: each (workload, K) result is benchmarks/results/regions/<workload>-K<k>.json; a
finished one is skipped. Runs live in benchmarks/runs/regions/ (trained once per workload).
The report is benchmarks/results/regions.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUNS = REPO / "benchmarks" / "runs" / "regions"
RESULTS = REPO / "benchmarks" / "results" / "regions"
REPORT = REPO / "benchmarks" / "results" / "regions.md"
EPSILONS = [("0", 0.0), ("0.2", 0.2), ("1", 1.0)]

# name: (data set, arch, batch size, epochs, lr)
WORKLOADS = {
    "adult3k-2x50": ("adult", "2x50", 100, 50, 0.1),
    "crypto-2x50": ("crypto", "2x50", 100, 50, 0.1),
    "breast_cancer-2x10": ("breast_cancer", "2x10", 32, 50, 0.1),
    "digits-2x20": ("digits", "2x20", 64, 50, 0.1),
}


def splits(dataset: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """train / public / test, disjoint and seeded."""
    from sklearn.model_selection import train_test_split

    if dataset == "crypto":  # the paper's exact training split; its test split halved into public / test
        with np.load(DATA / "crypto" / "train.npz") as a, np.load(DATA / "crypto" / "test.npz") as b:
            xa, ya, xb, yb = a["X"], a["y"], b["X"], b["y"]
        xp, xt, yp, yt = train_test_split(xb, yb, test_size=0.5, stratify=yb, random_state=seed)
    else:
        if dataset == "adult":
            with np.load(DATA / "adult" / "adult.npz") as f:
                X, y = f["X"], f["y"]
            sizes = (3000, 2000, 1000)
        else:
            from sklearn import datasets

            X, y = getattr(datasets, f"load_{dataset}")(return_X_y=True)
            n = len(y)
            sizes = (int(0.6 * n), int(0.2 * n), n - int(0.6 * n) - int(0.2 * n))
        xa, rest_x, ya, rest_y = train_test_split(X, y, train_size=sizes[0], stratify=y, random_state=seed)
        xp, xt, yp, yt = train_test_split(rest_x, rest_y, train_size=sizes[1], test_size=sizes[2], stratify=rest_y,
                                          random_state=seed)
    clip = (lambda x: np.clip(np.asarray(x, np.float32), 0, 1)) if dataset in ("crypto", "adult") else (
        lambda x: np.asarray(x, np.float32))  # the shared files hold a few -1e-16 entries
    return {"train": (clip(xa), np.asarray(ya, np.int64)), "public": (clip(xp), np.asarray(yp, np.int64)),
            "test": (clip(xt), np.asarray(yt, np.int64))}


def prepare(name: str) -> Path:
    """The workload's trained run (once) and its split files."""
    dataset, arch, batch, epochs, lr = WORKLOADS[name]
    root = RUNS / name
    run = root / "run"
    if (run / "run.json").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    for split, (X, y) in splits(dataset).items():
        np.savez(root / f"{split}.npz", X=X, y=y)
    cmd = [sys.executable, "-m", "lucid", "train", str(root / "train.npz"), "--out", str(run), "--arch", arch,
           "--batch-size", str(batch), "--epochs", str(epochs), "--lr", str(lr), "--test-data",
           str(root / "test.npz"), "--no-progress"]
    if dataset in ("crypto", "adult"):  # the paper's domain: [0, 1] per feature
        d = np.load(root / "train.npz")["X"].shape[1]
        (root / "domain.json").write_text(json.dumps({"lower": [0.0] * d, "upper": [1.0] * d}))
        cmd += ["--domain", str(root / "domain.json")]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    (root / "train_seconds.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
    return root


def scratch(root: Path, k: int) -> Path:
    path = root / f"K{k}"
    path.mkdir(exist_ok=True)
    for f in ("run.json", "networks.safetensors", "data.npz"):
        if not (path / f).exists():
            os.symlink((root / "run" / f).resolve(), path / f)
    return path


def time_split(run: Path) -> dict:
    events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
    boxes = [e for e in events if e["event"] == "region"]
    if not boxes:
        done = [e["t"] for e in events if e["event"] == "finished"]
        return {"root_s": done[-1] if done else None, "boxes": 1, "other_boxes_s": 0.0}
    return {"root_s": sum(e["seconds"] for e in boxes if e["box"] == 0), "boxes": len(boxes),
            "other_boxes_s": round(sum(e["seconds"] for e in boxes if e["box"] != 0), 1),
            "skipped_boxes": sum(1 for e in boxes if e.get("skipped"))}


def why_noised(run: Path) -> dict:
    """What keeps the over-noised test inputs (noised, yet no network disagrees) noised: their box's
    bound is exact for the box (the box's shape: a leak elsewhere in the box is that high), or its
    verification was cut short (time), or the box was never verified (it keeps its parent's), or
    it is the rest of a carve (which keeps its parent's box and bound until carved in turn)."""
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.access.evaluate import leaking_set
    from lucid.access.memo import Memo
    from lucid.network import NetworkFile, confidence
    from lucid.rundir import open_run

    r = open_run(run)
    clf = LabelOnlyClassifier(r, epsilon=1.0, memo=Memo(None))
    x = np.clip(np.asarray(r.data()["X_test"], np.float64), clf.domain_lower, clf.domain_upper) + 0.0
    cls, noised = clf.decide(x)
    over = noised & ~leaking_set(NetworkFile(r.path, r.meta), x)
    out = {"over_noised": int(over.sum()), "box_exact": 0, "box_cut_short": 0, "box_not_verified": 0,
           "box_rest": 0, "confidence_over_bound": []}
    tree = clf.regions
    if tree is None:
        return out
    leaf = tree.locate(x)
    conf = confidence(clf.scores(x))
    for i in np.flatnonzero(over):
        node, c = int(leaf[i]), int(cls[i])
        key = ("box_rest" if tree.inherits_box(node) else "box_not_verified" if not tree.verified[node] else
               "box_exact" if tree.complete[node][c] else "box_cut_short")
        out[key] += 1
        bound = tree.bound_upper[node][c]
        out["confidence_over_bound"].append(round(float(conf[i] / bound), 3) if bound > 0 else None)
    return out


def run_one(name: str, k: int, args: argparse.Namespace) -> None:
    from lucid.access.evaluate import evaluate_run

    out = RESULTS / f"{name}-K{k}.json"
    if out.exists():
        record = json.loads(out.read_text())
        if args.refresh and (RUNS / name / f"K{k}" / "bounds.json").exists():  # the evaluation again
            result, plot = evaluate_run(RUNS / name / f"K{k}", EPSILONS, seed=0)
            record.update(noised=result["noised_fraction"], accuracy=result["accuracy"],
                          expected_accuracy=result["expected_accuracy"],
                          single_query_ms=result["access_ms"]["lucid_single_query"],
                          batched_ms=result["access_ms"]["lucid"],
                          released_but_leaking=plot["released_but_leaking"], why_noised=why_noised(RUNS / name / f"K{k}"))
            out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name} K={k}: done before", file=sys.stderr)
        return
    if args.refresh:  # only the finished runs are evaluated again; nothing new is verified
        return

    root = prepare(name)
    run = scratch(root, k)
    cmd = [sys.executable, "-m", "lucid", "verify", str(run), "--time-limit", str(args.time_limit), "--quiet",
           "--workers", str(args.workers)]
    if k > 1:
        cmd += ["--regions", str(k), "--public-inputs", str(root / "public.npz")]
    if (run / "verify.checkpoint.json").exists() and not (run / "bounds.json").exists():
        cmd.append("--resume")
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    wall = time.monotonic() - t0
    result, plot = evaluate_run(run, EPSILONS, seed=0)
    bounds = json.loads((run / "bounds.json").read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "workload": name, "K": k, "time_limit": args.time_limit, "workers": args.workers, "verify_wall_s": round(wall, 1),
        "leaves": bounds.get("regions", {}).get("leaves", 1), "global_bounds": bounds["bounds"],
        "noised": result["noised_fraction"], "accuracy": result["accuracy"],
        "expected_accuracy": result["expected_accuracy"],
        "single_query_ms": result["access_ms"]["lucid_single_query"], "batched_ms": result["access_ms"]["lucid"],
        "released_but_leaking": plot["released_but_leaking"], "time": time_split(run), "why_noised": why_noised(run),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name} K={k}: noised {record['noised']}, {wall:.0f} s", file=sys.stderr)


def render() -> str:
    rows = sorted((json.loads(p.read_text()) for p in RESULTS.glob("*.json")), key=lambda r: (r["workload"], r["K"]))
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    lines = ["# Region-wise decision bounds (`benchmarks/regions.py`)", "",
             "Same `--time-limit` for every K of a workload (the whole verification). Noised: share of the test "
             "inputs LUCID noises (regions), with the same run's global bounds, and Naive-iDP's exact leaking share. "
             "Accuracy at ε = 0 / 0.2 / 1 (%), expected over the mechanism's draws. Single query: in-process "
             "`predict_network_space` of one row (a memo hit), measured by each row's run on that run's machine "
             "and code: machines differ by up to 2.5x between sessions, so compare single queries only within "
             "one session's figures in regions_findings.md.", "",
             "| workload | K | leaves | limit s | noised regions | noised global | noised Naive-iDP | acc regions | "
             "acc global | acc Naive-iDP | single query ms | root s / other boxes s (boxes) | released but leaking | "
             "over-noised: box exact / cut short / not verified / rest of a carve | run (UTC) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, nf, t = r.get("expected_accuracy", r["accuracy"]), r["noised"], r["time"]
        accs = lambda key: " / ".join(pct(a[key][e]) for e, _ in EPSILONS) if key in a else "–"  # noqa: E731
        glob = "lucid_global" if "lucid_global" in a else "lucid"
        lines.append(
            f"| {r['workload']} | {r['K']} | {r['leaves']} | {r['time_limit']:g} | {pct(nf['lucid'])} | "
            f"{pct(nf.get('lucid_global', nf['lucid']))} | {pct(nf['naive_idp'])} | {accs('lucid')} | {accs(glob)} | "
            f"{accs('naive_idp')} | {r['single_query_ms']:.3f} | {t['root_s'] or 0:.0f} / {t['other_boxes_s']:.0f} "
            f"({t['boxes']}) | {r['released_but_leaking']} | {_why(r)} | {r.get('date', '–')} |")
    if rows:
        lines += ["", f"Machine: {rows[-1]['machine']}; workers {rows[-1]['workers']}.",
                  "", "What bounds each missed target, and the choices behind these runs: "
                  "[regions_findings.md](regions_findings.md)."]
    return "\n".join(lines) + "\n"


def _why(r: dict) -> str:
    w = r.get("why_noised")
    if not w or r["K"] == 1:
        return f"{w['over_noised']} (one global bound)" if w else "–"
    return f"{w['over_noised']}: {w['box_exact']} / {w['box_cut_short']} / {w['box_not_verified']} / {w.get('box_rest', '–')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--ks", default="1,4,16,64,256")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--refresh", action="store_true", help="evaluate finished runs again (same bounds)")
    args = parser.parse_args()
    if not args.report_only:
        for name in args.workloads.split(","):
            if WORKLOADS[name][0] in ("crypto", "adult") and not DATA.exists():
                print(f"{name}: {DATA} is absent, skipped", file=sys.stderr)
                continue
            for k in (int(v) for v in args.ks.split(",")):
                run_one(name, k, args)
                REPORT.write_text(render())
    REPORT.write_text(render())
    print(REPORT.read_text())


if __name__ == "__main__":
    main()
