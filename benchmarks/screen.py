"""Screen benchmark (issue 19): how many leave-one-out networks each screen discards, and how fast.

For every workload and class: the share of the networks N_-i whose sound upper bound on
beta*_{c,{i}} is <= the class's lower bound LB (such a network can never raise the class's bound,
so the BaB drops it), for
  (a) interval:  today's `lucid.analysis.screen.screen_upper_bounds` (interval difference propagation),
  (b) symbolic:  `lucid.bounds.stack_screen.symbolic_screen`, lambda = 1, CROWN slopes,
  (c) optimised: the same with projected Adam steps on lambda and the alpha slopes,
  (d) LP:        the LP relaxation of each singleton's own MILP (encoder with relax_all=True,
                 HiGHS, plus the verifier's safety margin) on a random sample: the ceiling,
and the seconds each screen takes for all networks (d: per network).

  python benchmarks/screen.py --prepare                    # train the workloads into runs/
  python benchmarks/screen.py --workloads crypto-2x50,adult-2x50 --lp-sample 40

LB per class: the final lower bound recorded by a finished verification of the same training
(benchmarks/results/paper_tables.md / idle_machine.md), and, independently, the confidence of N at a
replayed leak found by `lucid.witness.search.search_node_witness` on these networks (a true lower bound of
max_i beta*_{c,{i}}, whatever the training). The table uses the larger of the two where the
witness confirms the networks are the recorded ones, else the replayed one (see --lb).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RUNS = ROOT / "runs"

# Final lower bounds of finished verifications (same training settings, seed 0):
# crypto-2x50: idle_machine.md "Branch-and-bound (issue 6)" (lower 0.944143 / 0.279948);
# adult-2x50: idle_machine.md sessions 9/10 (best replayed leaks 0.01875 / 0.02945).
# crypto-2x100: verify_e2e.md (class 0 finished at 0.934666; class 1's lower bound at its 30-minute limit).
# digits-2x20: the finished verification of 2026-11-25 (verify_e2e.md, every class at u/l <= 1.1), but
# class 9, where a time-limited verification of 2026-11-24 had replayed a higher leak (2.75133); all
# rounded down.
# Every workload also takes the best lower bound in runs/NAME/bounds*.json of the verifications run on it.
RECORDED_LB = {"crypto-2x50": {0: 0.944143, 1: 0.279948}, "adult-2x50": {0: 0.01875, 1: 0.02945},
               "crypto-2x100": {0: 0.934666, 1: 0.295229},
               "digits-2x20": {0: 2.98785, 1: 2.3934, 2: 2.40814, 3: 2.60726, 4: 2.72105, 5: 3.72224,
                               6: 3.09835, 7: 2.54385, 8: 1.98914, 9: 2.75133}}

WORKLOADS = {
    "crypto-2x50": dict(arch="2x50", batch_size=100),
    "adult-2x50": dict(arch="2x50", batch_size=1024),
    "digits-2x20": dict(arch="2x20", batch_size=100),
    "crypto-2x100": dict(arch="2x100", batch_size=100),
    "crypto-4x30": dict(arch="4x30", batch_size=100),
}


def _splits(name: str) -> tuple[Path, Path]:
    out = RUNS / "data"
    out.mkdir(parents=True, exist_ok=True)
    if name.startswith("crypto"):
        return DATA / "crypto" / "train.npz", DATA / "crypto" / "test.npz"
    from sklearn.model_selection import train_test_split

    if name.startswith("adult"):  # as benchmarks/paper_tables.py: 4000 / 4000 rows, stratified, seed 0
        with np.load(DATA / "adult" / "adult.npz", allow_pickle=False) as f:
            X, y = f["X"], f["y"]
        xa, xb, ya, yb = train_test_split(X, y, train_size=4000, test_size=4000, stratify=y, random_state=0)
    elif name.startswith("digits"):
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        xa, xb, ya, yb = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    else:
        raise ValueError(name)
    paths = []
    for part, xs, ys in (("train", xa, ya), ("test", xb, yb)):
        p = out / f"{name.split('-')[0]}-{part}.npz"
        if not p.exists():
            np.savez(p, X=np.clip(np.asarray(xs, dtype=np.float32), 0, 1), y=np.asarray(ys, dtype=np.int64))
        paths.append(p)
    return paths[0], paths[1]


def prepare(names: list[str]) -> None:
    from lucid.training import train_run

    for name in names:
        train, test = _splits(name)
        cfg = WORKLOADS[name]
        train_run(str(train), RUNS / name, arch=cfg["arch"], batch_size=cfg["batch_size"], test_data=str(test),
                  progress=False)
        print(f"trained {name}", flush=True)


# ------------------------------------------------------------------------------------ measuring

def lp_singleton_bound(problem, cls: int, position: int) -> float:
    """(d): the LP relaxation (every ReLU relaxed) of the singleton's own MILP, as the verifier
    builds it, solved by HiGHS; its dual bound plus the verifier's safety margin."""
    from lucid.hyper import hyper_network
    from lucid.analysis.encode import EncoderInputs, EncodingOptions, encode_idp, possible_targets
    from lucid.analysis.problem import node_difference_bounds
    from lucid.analysis.soundness import user_bound
    from lucid.solvers import solve
    from lucid.solvers.base import SolverOptions

    hyper = hyper_network(problem.stack, [position])
    diff = node_difference_bounds(problem, hyper)
    targets = possible_targets(cls, diff.hyper)
    if not targets:
        return -math.inf
    model = encode_idp(EncoderInputs.for_node(problem, hyper, diff), cls, EncodingOptions(), targets=targets,
                       relax_all=True)
    if model is None:
        return -math.inf
    return float(user_bound(solve(model, "highs", SolverOptions()), model))


def _run_lower_bound(name: str, cls: int) -> float | None:
    """The best lower bound any (possibly time-limited) `lucid verify` wrote into runs/NAME/bounds*.json
    (e.g. bounds.json of all classes and a copied bounds-classes-2-9.json of a longer run on two):
    N's confidence at a replayed leak, so a true lower bound whether or not the class finished."""
    found = []
    for path in sorted((RUNS / name).glob("bounds*.json")):
        entry = json.loads(path.read_text())["bounds"].get(str(cls))
        lower = None if entry is None else entry.get("lower")
        if isinstance(lower, (int, float)) and math.isfinite(lower):
            found.append(float(lower))
    return max(found, default=None)


def lower_bounds(name: str, problem, classes) -> dict[int, dict]:
    from lucid.witness.replay import LeakQuery
    from lucid.witness.search import search_node_witness

    out = {}
    positions = np.arange(1, len(problem.stack))
    for c in classes:
        t0 = time.perf_counter()
        w = search_node_witness(LeakQuery(problem.stack, positions, c, problem.lower, problem.upper))
        replayed = -math.inf if w is None else float(w.confidence)
        found = [v for v in (RECORDED_LB.get(name, {}).get(c), _run_lower_bound(name, c)) if v is not None]
        recorded = max(found) if found else None
        out[c] = {"replayed": replayed, "recorded": recorded, "search_s": time.perf_counter() - t0}
    return out


def measure(name: str, classes, lp_sample: int, steps: int, threads: int, lr: float = 0.02, seed: int = 0) -> dict:
    import torch

    from lucid.bounds.stack_screen import symbolic_screen
    from lucid.bounds.symbolic import ScreenOptions
    from lucid.rundir import open_run
    from lucid.analysis.problem import VerificationProblem
    from lucid.analysis.screen import screen_upper_bounds

    torch.set_num_threads(threads)
    problem = VerificationProblem.from_run(open_run(RUNS / name))
    n = len(problem.stack) - 1
    positions = np.arange(1, n + 1)
    classes = list(range(problem.num_classes)) if classes is None else classes
    lbs = lower_bounds(name, problem, classes)
    rows = []
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(positions, size=min(lp_sample, n), replace=False))
    for c in classes:
        lb = lbs[c]
        level = lb["replayed"] if lb["recorded"] is None else max(lb["replayed"], lb["recorded"])
        res = {"class": c, "networks": n, "lb": level, **lb}
        for key, fn in (
            ("interval", lambda: screen_upper_bounds(problem, c, positions)),
            ("symbolic", lambda: symbolic_screen(problem, c, positions)),
            ("sym_ivmid", lambda: symbolic_screen(problem, c, positions, ScreenOptions(intermediate="interval"))),
            ("optimised", lambda: symbolic_screen(problem, c, positions, ScreenOptions(steps=steps, lr=lr), cutoff=level)),
        ):
            t0 = time.perf_counter()
            b = fn()
            res[key] = {"seconds": time.perf_counter() - t0, "discarded": float(np.mean(b <= level)),
                        "survivors": int(np.sum(b > level)), "median": float(np.median(b)),
                        "sample_discarded": float(np.mean(b[sample - 1] <= level))}
            res[key + "_bounds"] = b
            print(f"{name} class {c} {key}: {res[key]}", flush=True)
        t0 = time.perf_counter()
        lp = np.array([lp_singleton_bound(problem, c, int(p)) for p in sample])
        res["lp"] = {"seconds_per_network": (time.perf_counter() - t0) / max(len(sample), 1),
                     "sample": int(len(sample)), "sample_discarded": float(np.mean(lp <= level)),
                     "median": float(np.median(lp)) if len(lp) else math.nan}
        # how the sampled networks compare, bound by bound
        res["lp_vs"] = {k: float(np.median(res[k + "_bounds"][sample - 1] / np.where(lp > 0, lp, np.nan)))
                        for k in ("interval", "symbolic", "optimised")} if len(lp) else {}
        print(f"{name} class {c} lp: {res['lp']} ratio to LP (median) {res['lp_vs']}", flush=True)
        for k in ("interval", "symbolic", "sym_ivmid", "optimised"):
            res.pop(k + "_bounds")
        rows.append(res)
    return {"workload": name, "rows": rows, "input_dim": problem.stack.input_dim,
            "layers": problem.stack.layer_sizes}


def _stamps(result: dict) -> list[tuple[str, str, str]]:
    """(command, date, commit) of every measurement in a workload's result, oldest rows first."""
    rows = [tuple(row["measured"][k] for k in ("command", "date", "commit")) for row in result["rows"] if "measured" in row]
    return rows + [(result["command"], result["date"], result["commit"])]


def report(results: list[dict], path: Path, steps: int, threads: int) -> None:
    """Write the table of `results` (each stamped with the command, date and commit that measured it)."""
    import torch

    cpu = platform.processor() or platform.machine()
    lines = [
        "# Screen benchmark (issue 19): leave-one-out networks discarded without a solver",
        "",
        *[f"- `{cmd}` ({when}; commit {commit})" for cmd, when, commit
          in dict.fromkeys(stamp for r in results for stamp in _stamps(r))],
        f"- Machine: {platform.platform()}, {cpu}, torch {torch.__version__}, {threads} torch thread(s), CPU, float64 "
        "(shared with other jobs: timings are upper estimates)",
        f"- (a) interval = `screen_upper_bounds`; (b) symbolic = `symbolic_screen`, lambda = 1; (c) optimised = "
        f"`symbolic_screen(steps={steps}, lr=0.02, cutoff=LB)` (only the networks whose (b) bound is above LB are "
        "optimised, so its seconds include (b)'s work again; the medians of (c) mix optimised and start bounds); (d) LP = LP relaxation of each sampled singleton's own MILP (HiGHS), "
        "the ceiling. 'discarded' = share of all leave-one-out networks with bound <= LB; (d) and 'sample' "
        "columns are on the same random sample of networks.",
        "- LB: the larger of the recorded lower bound of a verification of the same training (RECORDED_LB in "
        "benchmarks/screen.py: benchmarks/results/idle_machine.md, verify_e2e.md; else runs/NAME/bounds*.json of "
        "time-limited `lucid verify` runs) and N's confidence at the replayed leak of `search_node_witness` over all "
        "networks (both true lower bounds for these networks).",
        "",
        "| workload | class | networks | LB (recorded / replayed) | (a) interval discarded, s | (b) symbolic discarded, s "
        "| (c) optimised discarded, s | sample: (a) / (b) / (c) / (d) LP | (d) s per network | median bound (a) / (b) / (c) / (d) "
        "| (b) with interval intermediates: discarded, s, median |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in r["rows"]:
            rec = "–" if row["recorded"] is None else f"{row['recorded']:.6g}"
            cells = [f"{100 * row[k]['discarded']:.1f} % ({row[k]['survivors']} left), {row[k]['seconds']:.1f} s"
                     for k in ("interval", "symbolic", "optimised")]
            samp = " / ".join(f"{100 * row[k]['sample_discarded']:.0f} %" for k in ("interval", "symbolic", "optimised", "lp"))
            med = " / ".join(f"{row[k]['median']:.4g}" for k in ("interval", "symbolic", "optimised", "lp"))
            lines.append(f"| {r['workload']} ({'-'.join(map(str, r['layers']))}) | {row['class']} | {row['networks']} | "
                         f"{rec} / {row['replayed']:.6g} | {cells[0]} | {cells[1]} | {cells[2]} | {samp} (n={row['lp']['sample']}) | "
                         f"{row['lp']['seconds_per_network']:.2f} | {med} | {100 * row['sym_ivmid']['discarded']:.1f} %, "
                         f"{row['sym_ivmid']['seconds']:.1f} s, {row['sym_ivmid']['median']:.4g} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "\n".join(lines) + "\n"
    if path.exists():  # keep the notes written below the table by hand
        old = path.read_text()
        marker = "\n## Notes"
        if marker in old:
            body += old[old.index(marker):]
    path.write_text(body)
    (path.with_suffix(".json")).write_text(json.dumps(results, indent=1, default=float))


def timing(name: str, cls: int, lb: float, steps: int, threads: int, repeats: int) -> dict:
    """Wall and process-CPU seconds of (a), (b), (c) for all networks of a workload: the minimum
    over `repeats` runs (the machine is shared: the minimum is the least disturbed run)."""
    import torch

    from lucid.bounds.stack_screen import symbolic_screen
    from lucid.bounds.symbolic import ScreenOptions
    from lucid.rundir import open_run
    from lucid.analysis.problem import VerificationProblem
    from lucid.analysis.screen import screen_upper_bounds

    torch.set_num_threads(threads)
    problem = VerificationProblem.from_run(open_run(RUNS / name))
    positions = np.arange(1, len(problem.stack))
    out = {}
    for key, fn in (
        ("interval", lambda: screen_upper_bounds(problem, cls, positions)),
        ("symbolic", lambda: symbolic_screen(problem, cls, positions)),
        ("optimised", lambda: symbolic_screen(problem, cls, positions, ScreenOptions(steps=steps), cutoff=lb)),
    ):
        walls, cpus = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        out[key] = {"wall_min": min(walls), "wall_max": max(walls), "cpu_min": min(cpus)}
        print(f"timing {name} class {cls} {key}: {out[key]}", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", action="store_true", help="train the workloads into runs/ first")
    p.add_argument("--workloads", default="crypto-2x50,adult-2x50,digits-2x20")
    p.add_argument("--classes", default=None, help="comma list (default: all)")
    p.add_argument("--lp-sample", type=int, default=40)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "screen.md"))
    p.add_argument("--timing", default=None, metavar="WORKLOAD:CLASS:LB",
                   help="only time (a), (b), (c) on all networks, min over --repeats runs")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.timing:
        name, cls, lb = args.timing.split(":")
        timing(name, int(cls), float(lb), args.steps, args.threads, args.repeats)
        return
    names = args.workloads.split(",")
    if args.prepare:
        prepare(names)
    classes = None if args.classes is None else [int(c) for c in args.classes.split(",")]
    report_path = Path(args.report)
    saved = report_path.with_suffix(".json")
    # Earlier rows of other workloads stay in the table (a workload measured again replaces its row;
    # with --classes, only those classes' rows).
    earlier = json.loads(saved.read_text()) if saved.exists() else []
    results = [r for r in earlier if r["workload"] not in names]
    kept = {r["workload"]: [{**row, "measured": row.get("measured") or {k: r[k] for k in ("command", "date", "commit")}}
                            for row in r["rows"] if classes is not None and row["class"] not in classes]
            for r in earlier if r["workload"] in names}
    stamp = {"command": "python benchmarks/screen.py " + " ".join(sys.argv[1:] if argv is None else argv),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=ROOT).stdout.strip()}
    for name in names:
        result = {**measure(name, classes, args.lp_sample, args.steps, args.threads), **stamp}
        result["rows"] = sorted(kept.get(name, []) + result["rows"], key=lambda row: row["class"])
        results.append(result)
        report(results, report_path, args.steps, args.threads)


if __name__ == "__main__":
    main()
