"""How LUCID's cost grows with the data: Adult 2x50 at n training rows, a fixed 4 000-row test split.

  python benchmarks/scaling.py --sizes 1000,2000,4000,8000 [--time-limit 3600] [--workers 2]
  python benchmarks/scaling.py --sizes 1000 --steps train,screen      # only some steps
  python benchmarks/scaling.py --report-only                          # table, fit and plot again

Per n (nested subsets of one seeded permutation of ../shared/data/adult, disjoint from the test
split): training seconds and peak RSS (`lucid train`, paper settings: 2x50, 50 epochs, lr 0.1,
batch 1024), the networks the screen keeps per class at the class's best solver-free leak (lucid
verify's default optimised screen, and the interval screen for comparison), the
verification seconds to upper/lower <= 1.1 per class with the default open-source solver (HiGHS,
`--rel-gap 0.1`) and peak RSS, and test accuracy plain vs LUCID at eps = 0. Then the growth
exponents (least squares on log-log) and the extrapolation to 36 000 rows.

Each step runs in its own process (so its peak RSS is its own) and writes
benchmarks/results/scaling/n<N>-<step>.json; finished steps are skipped on a re-run, and the
report (benchmarks/results/scaling.md, scaling.png) is rewritten after every step.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "adult" / "adult.npz"
RUNS = REPO / "benchmarks" / "runs" / "scaling"
RESULTS = REPO / "benchmarks" / "results" / "scaling"
REPORT = REPO / "benchmarks" / "results" / "scaling.md"
PLOT = REPO / "benchmarks" / "results" / "scaling.png"
TEST_ROWS = 4000
SEED = 0
STEPS = ("train", "screen", "verify", "evaluate")
TARGET_N = 36000
sys.path.insert(0, str(REPO))


def split(n: int) -> tuple[Path, Path]:
    """Nested training subsets: the first n rows of one seeded permutation of the non-test rows."""
    out = RUNS / "data"
    out.mkdir(parents=True, exist_ok=True)
    train, test = out / f"train-{n}.npz", out / "test.npz"
    if not train.exists() or not test.exists():
        from sklearn.model_selection import train_test_split

        with np.load(DATA, allow_pickle=False) as f:
            X, y = np.clip(f["X"].astype(np.float32), 0.0, 1.0), f["y"].astype(np.int64)
        rest_x, test_x, rest_y, test_y = train_test_split(X, y, test_size=TEST_ROWS, stratify=y, random_state=SEED)
        if n > len(rest_y):
            raise SystemExit(f"n = {n} exceeds the {len(rest_y)} non-test rows of {DATA}")
        order = np.random.default_rng(SEED).permutation(len(rest_y))[:n]
        np.savez(train, X=rest_x[order], y=rest_y[order])
        np.savez(test, X=test_x, y=test_y)
    return train, test


def run_dir(n: int) -> Path:
    return RUNS / f"adult-2x50-n{n}"


def step(n: int, name: str, args: argparse.Namespace) -> dict:
    """One step, in this process (the driver runs it as a subprocess)."""
    from lucid.verify import verify_run
    from lucid.rundir import open_run

    run = run_dir(n)
    t0 = time.perf_counter()
    if name == "train":
        from lucid.training import train_run

        train, test = split(n)
        train_run(str(train), run, arch="2x50", epochs=50, lr=0.1, batch_size=1024, seed=SEED,
                  test_data=str(test), progress=False, scheduler=args.scheduler)
        out = {"seconds": time.perf_counter() - t0, "networks": n + 1}
    elif name == "screen":
        from lucid.analysis.problem import VerificationProblem
        from lucid.analysis.screen import Screen, screen_upper_bounds
        from lucid.witness.search import search_class_witness

        problem = VerificationProblem.from_run(open_run(run), with_points=True)
        positions = np.arange(1, len(problem.stack))
        screen = Screen(problem, "optimised")  # lucid verify's default screen
        out = {"classes": {}}
        for c in range(problem.num_classes):
            found = search_class_witness(problem, c, positions, points=problem.points)
            level = -math.inf if found is None else float(found.confidence)
            t = time.perf_counter()
            interval = screen_upper_bounds(problem, c, positions)
            interval_s = time.perf_counter() - t
            t = time.perf_counter()
            screened = screen.initial(c, positions)
            above = positions[screened > level]
            if len(above) and found is not None:
                screened[above - 1] = np.minimum(screened[above - 1], screen.refine(c, above, level))
            screen_s = time.perf_counter() - t
            out["classes"][str(c)] = {"lower": None if found is None else level, "networks": int(len(positions)),
                                      "kept": int(np.sum(screened > level)), "screen_seconds": screen_s,
                                      "kept_interval": int(np.sum(interval > level)), "interval_seconds": interval_s}
        out["seconds"] = time.perf_counter() - t0
    elif name == "verify":
        result = verify_run(run, solver="highs", rel_gap=0.1, time_limit=args.time_limit * 2, workers=args.workers,
                            progress=False)
        out = {"seconds": time.perf_counter() - t0, "bounds": result["bounds"]}
    elif name == "evaluate":
        from lucid.access.evaluate import evaluate_run

        result, _ = evaluate_run(run, [("0", 0.0)], seed=SEED)
        out = {"seconds": time.perf_counter() - t0, "accuracy": result["accuracy"]}
    else:
        raise SystemExit(f"unknown step {name}")
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def result_path(n: int, name: str) -> Path:
    return RESULTS / f"n{n}-{name}.json"


def load_results() -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for path in sorted(RESULTS.glob("n*-*.json")):
        n, name = path.stem[1:].split("-", 1)
        out.setdefault(int(n), {})[name] = json.loads(path.read_text())
    return out


def fit(ns: list[int], values: list[float]) -> tuple[float, float] | None:
    """(exponent, constant) of values ~ constant * n^exponent, by least squares on logs."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v and v > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    b, a = np.polyfit(x, y, 1)
    return float(b), float(math.exp(a))


def verify_seconds(res: dict, c: str) -> float | None:
    b = res.get("verify", {}).get("bounds", {}).get(c)
    if not b or not b.get("complete"):
        return None
    return float(b["seconds"])


def _unfinished(res: dict, c: str) -> str:
    """What an unfinished (or missing) verification reached: upper/lower when it stopped."""
    b = res.get("verify", {}).get("bounds", {}).get(c)
    if not b:
        return "-"
    if b.get("upper") is None or not b.get("lower"):
        return f"not done ({_fmt(b.get('seconds'))} s)"
    return f"u/l {b['upper'] / b['lower']:.2f} at {_fmt(b.get('seconds'))} s"


def report(args: argparse.Namespace) -> None:
    from lucid.atomic import write_text_atomic

    results = load_results()
    ns = sorted(results)
    lines = ["# Scaling: Adult 2x50, n training rows, 4 000 test rows", "",
             f"Command: `python benchmarks/scaling.py --sizes {','.join(map(str, ns))}`. Each step in its own process; "
             "peak RSS is that process's (verify: the driver; its worker processes map the same float64 networks "
             "from RUN/cache/). Verification: HiGHS, `--rel-gap 0.1` (done = upper/lower <= 1.1), "
             f"{args.workers} workers.", "",
             "| n | train s | train RSS MiB | kept by the optimised (interval) screen, class 0 / 1 | verify s class 0 | verify s class 1 | "
             "verify RSS MiB | acc plain | acc LUCID eps=0 |", "|---|---|---|---|---|---|---|---|---|"]
    for n in ns:
        r = results[n]
        tr, sc, ev = r.get("train", {}), r.get("screen", {}), r.get("evaluate", {})
        kept = " / ".join(f"{v['kept']} ({v.get('kept_interval', '-')}) of {v['networks']}"
                          for _, v in sorted(sc.get("classes", {}).items())) or "-"
        vs = [verify_seconds(r, c) for c in ("0", "1")]
        acc = ev.get("accuracy", {})
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            n, _fmt(tr.get("seconds")), _fmt(tr.get("peak_rss_mib")), kept,
            *(_unfinished(r, c) if v is None else _fmt(v) for v, c in zip(vs, ("0", "1"))),
            _fmt(r.get("verify", {}).get("peak_rss_mib")), _pct(acc.get("plain")), _pct(acc.get("lucid", {}).get("0"))))
    lines += ["", "## Growth and extrapolation to 36 000 rows", ""]
    series = {"training seconds": [(n, results[n].get("train", {}).get("seconds")) for n in ns]}
    for c in ("0", "1"):
        series[f"verification seconds, class {c}"] = [(n, verify_seconds(results[n], c)) for n in ns]
    for c in ("0", "1"):
        # without a solver-free leak of positive confidence the screen has no level to discard below
        # (n = 1000: none for class 0, one at -0.63 for class 1): not a point of the curve
        series[f"networks kept by the screen, class {c}"] = [
            (n, v.get("kept") if (v.get("lower") or 0) > 0 else None)
            for n in ns for v in [results[n].get("screen", {}).get("classes", {}).get(c, {})]]
    for name, pts in series.items():
        pts = [(n, v) for n, v in pts if v]
        f = fit([n for n, _ in pts], [v for _, v in pts])
        if f is None:
            lines.append(f"- {name}: fewer than two measured sizes")
            continue
        b, a = f
        at = a * TARGET_N ** b
        extra = f"; 16 workers: {at / 8:.3g} (assuming perfect scaling from 2 to 16 workers)" if "seconds" in name else ""
        lines.append(f"- {name}: exponent {b:.2f} (from n = {', '.join(str(n) for n, _ in pts)}); at 36 000 rows on "
                     f"2 cores: {at:.3g}{extra}")
    lines.append("")
    notes = RESULTS / "NOTES.md"  # hand-written context of the measured rows, kept across re-runs
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    write_text_atomic(REPORT, "\n".join(lines) + "\n")
    _plot(series)


def _plot(series: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in series.items():
        pts = [(n, v) for n, v in pts if v]
        if pts:
            ax.loglog(*zip(*pts), marker="o", label=name)
    ax.set_xlabel("training rows n")
    ax.set_ylabel("seconds / networks")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=120)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,2000,4000,8000")
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--time-limit", type=float, default=3600.0, help="verification seconds per class")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scheduler", default=None, help="train on this Dask cluster (tcp://… or local:N)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:  # the child process of one step
        out = step(args.n, args.step, args)
        RESULTS.mkdir(parents=True, exist_ok=True)
        result_path(args.n, args.step).write_text(json.dumps(out, indent=1) + "\n")
        return
    if not args.report_only:
        if not DATA.exists():
            raise SystemExit(f"{DATA} is missing")
        for n in [int(s) for s in args.sizes.split(",")]:
            for name in args.steps.split(","):
                if result_path(n, name).exists():
                    continue
                print(f"n = {n}: {name} ...", flush=True)
                cmd = [sys.executable, __file__, "--step", name, "--n", str(n), "--time-limit", str(args.time_limit),
                       "--workers", str(args.workers)] + (["--scheduler", args.scheduler] if args.scheduler else [])
                subprocess.run(cmd, check=True)
                report(args)
    report(args)
    print(REPORT.read_text())


if __name__ == "__main__":
    main()
