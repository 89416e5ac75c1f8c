"""Benchmark of `lucid verify` on Crypto 2x50 (all 2800 leave-one-out networks), paper Table 4 style.

Part 1 — anytime: the full method (md + RiS + BaB + screening + witness lower bounds), both classes,
HiGHS, 2 workers, one long run; reports per class [lower, upper] and upper/lower at 5/15/30/60 min.
Part 2 — ablation under one equal time budget: naive (one MILP per network), H (one hyper-network,
no md), HM (+ matching dependencies), HMRiS (+ relax-if-similar), HMB (BaB, md, no RiS), full.
For the naive variant it also reports how many networks were solved in the budget and the
extrapolated time to finish, to compare with the time the full method needs for the same bound.

Each variant runs in its own scratch run directory (links to the run's files), so logs and bounds
of every variant are kept: OUT/<variant>/verify.log.jsonl, OUT/<variant>/bounds.json.

  python benchmarks/verify_crypto.py --run /tmp/crypto-2x50 --out /tmp/verify-bench \
      --anytime 300,900,1800,3600 --budget 600 --workers 2
(a missing --run is trained first with `lucid train` settings of the paper: 2x50, 50 epochs, batch 100.)
Writes a markdown report to benchmarks/results/verify_crypto.md (override with --report).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "crypto"

VARIANTS = {
    # name: verify_run keyword arguments (paper Table 4 naming)
    "naive": dict(naive=True, md=False, ris=False, screen=False, search=False),
    "H": dict(bab=False, md=False, ris=False, screen=False, search=False),
    "HM": dict(bab=False, md=True, ris=False, screen=False, search=False),
    "HMRiS": dict(bab=False, md=True, ris=True, screen=False, search=False),
    "HMB": dict(bab=True, md=True, ris=False, screen=False, search=False),
    "full": dict(bab=True, md=True, ris=True, screen=True, search=True),
}


def ensure_run(run: Path, networks: int | None) -> Path:
    if not (run / "run.json").exists():
        from lucid.training import train_run

        if not DATA.exists():
            sys.exit(f"{DATA} is missing: the Crypto data set is needed to train the benchmark run")
        print(f"training {run} (Crypto 2x50, paper settings) ...", flush=True)
        train_run(str(DATA / "train.npz"), run, arch="2x50", epochs=50, lr=0.1, weight_decay=1e-5,
                  batch_size=100, test_data=str(DATA / "test.npz"))
    if networks is None:
        return run
    return subset_run(run, networks)


def subset_run(run: Path, networks: int) -> Path:
    """A run with N and only the first `networks` leave-one-out networks (for quick trials)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    out = run.parent / f"{run.name}-first{networks}"
    if (out / "run.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(run / "networks.safetensors"))
    save_file({k: np.ascontiguousarray(v[: networks + 1]) for k, v in tensors.items()}, str(out / "networks.safetensors"))
    for name in ("run.json", "data.npz"):
        shutil.copy(run / name, out / name)
    return out


def scratch(run: Path, out: Path, name: str) -> Path:
    """A fresh directory that shares the run's files (and N's cached bounds) but not its outputs."""
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for name_ in ("run.json", "networks.safetensors", "data.npz"):
        os.symlink((run / name_).resolve(), d / name_)
    if (run / "cache").is_dir():
        shutil.copytree(run / "cache", d / "cache")
    return d


def anytime_at(events: list[dict], cls: int, t: float) -> tuple[float | None, float | None]:
    lower = upper = None
    for e in events:
        if e.get("event") == "anytime" and e.get("class") == cls and float(e["t"]) <= t:
            lower = None if e["lower"] is None else float(e["lower"])
            upper = None if e["upper"] is None else float(e["upper"])
    return lower, upper


def time_to_upper(events: list[dict], cls: int, target: float) -> float | None:
    for e in events:
        if e.get("event") == "anytime" and e.get("class") == cls and e["upper"] is not None:
            if float(e["upper"]) <= target:
                return float(e["t"])
    return None


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4f}"


def ratio(lower, upper) -> str:
    if lower is None or upper is None or lower <= 0 or math.isinf(upper):
        return "-"
    return f"{upper / lower:.3f}"


def write_report(path: Path, lines: list[str]) -> None:
    """Rewritten after every stage, so a long run cut short still leaves its figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=Path("/tmp/crypto-2x50"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/verify-bench"))
    ap.add_argument("--report", type=Path, default=REPO / "benchmarks" / "results" / "verify_crypto.md")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--anytime", default="300,900,1800,3600", help="report points (seconds) of the full run")
    ap.add_argument("--budget", type=float, default=600, help="equal time limit of each ablation variant")
    ap.add_argument("--node-time-limit", type=float, default=60)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--networks", type=int, default=None, help="use only the first N leave-one-out networks")
    ap.add_argument("--skip-anytime", action="store_true")
    args = ap.parse_args()

    from lucid.verify import verify_run
    from lucid.bab.events import read_events

    run = ensure_run(args.run, args.networks)
    args.out.mkdir(parents=True, exist_ok=True)
    points = [float(x) for x in args.anytime.split(",") if x]
    common = dict(solver=args.solver, workers=args.workers, node_time_limit=args.node_time_limit, progress=True)
    lines = [
        "# `lucid verify` on Crypto 2x50",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Machine: {platform.platform()}, {os.cpu_count()} cores; solver {args.solver}, {args.workers} workers, "
        f"node time limit {args.node_time_limit}s; run {run} ({json.loads((run / 'run.json').read_text())['train_size']} "
        "leave-one-out networks).",
        "",
    ]
    results = {}
    if not args.skip_anytime:
        d = scratch(run, args.out, "full-anytime")
        t0 = time.time()
        res = verify_run(d, time_limit=max(points), **common, **{k: v for k, v in VARIANTS["full"].items()})
        wall = time.time() - t0
        events = read_events(d / "verify.log.jsonl")
        lines += ["## Anytime bounds of the full method", "",
                  "| class | " + " | ".join(f"{p / 60:g} min [lower, upper] (u/l)" for p in points) + " | final |",
                  "|---|" + "---|" * (len(points) + 1)]
        for c, b in res["bounds"].items():
            cells = []
            for p in points:
                lo, up = anytime_at(events, int(c), p)
                cells.append(f"[{fmt(lo)}, {fmt(up)}] ({ratio(lo, up)})")
            cells.append(f"[{fmt(b['lower'])}, {fmt(b['upper'])}] {'complete' if b['complete'] else 'stopped'} "
                         f"after {b['seconds']:.0f}s, {b['nodes']} nodes")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines += ["", f"(wall time {wall:.0f}s)", ""]
        results["full-anytime"] = res
        write_report(args.report, lines)

    names = [v for v in args.variants.split(",") if v]
    if names:
        lines += [f"## Ablation under an equal budget of {args.budget:g}s", "",
                  "| variant | class | lower | upper | upper/lower | complete | nodes | seconds |",
                  "|---|---|---|---|---|---|---|---|"]
    full_log = args.out / "full" / "verify.log.jsonl"
    for name in names:
        if name == "full" and "full-anytime" in results and args.budget <= max(points):
            # The anytime run is the full method with a longer limit: read its state at the budget.
            events = read_events(args.out / "full-anytime" / "verify.log.jsonl")
            full_log = args.out / "full-anytime" / "verify.log.jsonl"
            for c in results["full-anytime"]["bounds"]:
                lo, up = anytime_at(events, int(c), args.budget)
                nodes = sum(1 for e in events if e["event"] == "solved" and e["class"] == int(c)
                            and float(e["t"]) <= args.budget)
                lines.append(f"| full (anytime run at {args.budget:g}s) | {c} | {fmt(lo)} | {fmt(up)} | {ratio(lo, up)} "
                             f"| - | {nodes} | {args.budget:.0f} |")
            results["full"] = results["full-anytime"]
            continue
        d = scratch(run, args.out, name)
        t0 = time.time()
        res = verify_run(d, time_limit=args.budget, **common, **VARIANTS[name])
        results[name] = res
        for c, b in res["bounds"].items():
            lines.append(f"| {name} | {c} | {fmt(b['lower'])} | {fmt(b['upper'])} | {ratio(b['lower'], b['upper'])} "
                         f"| {b['complete']} | {b['nodes']} | {b['seconds']:.0f} |")
        print(f"{name}: {json.dumps(res['bounds'])} ({time.time() - t0:.0f}s)", flush=True)
        write_report(args.report, lines)
    if "naive" in results and "full" in results:
        lines += ["", "### Naive vs full: time to a certified bound", ""]
        naive_events = read_events(args.out / "naive" / "verify.log.jsonl")
        full_events = read_events(full_log)
        total = next(e["networks"] for e in naive_events if e["event"] == "started")
        for c, b in results["naive"]["bounds"].items():
            solved = sum(1 for e in naive_events if e["event"] == "solved" and e["class"] == int(c))
            fb = results["full"]["bounds"][c]
            if b["complete"] and b["upper"] is not None:
                full_t = time_to_upper(full_events, int(c), b["upper"] + 1e-9)
                speed = "-" if not full_t else f"{b['seconds'] / max(full_t, 1e-3):.1f}x"
                lines.append(f"- class {c}: naive certified {fmt(b['upper'])} after {b['seconds']:.0f}s; full reached "
                             f"it after {'(not within its run)' if full_t is None else f'{full_t:.0f}s'} "
                             f"(speed-up {speed})")
            else:
                # Naive certifies nothing before every network is solved: its time to any bound is
                # at least the extrapolated total.
                naive_t = args.budget * total / max(solved, 1)
                lines.append(f"- class {c}: naive solved {solved}/{total} networks in {args.budget:g}s and certifies "
                             f"no bound before all are solved (extrapolated >= {naive_t:.0f}s); full certified "
                             f"upper {fmt(fb['upper'])} (lower {fmt(fb['lower'])}) within {fb['seconds']:.0f}s")
    write_report(args.report, lines)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
