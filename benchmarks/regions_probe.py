"""What a box around data can prove on a regions workload (default Adult 3k): the geometry behind
benchmarks/results/regions_findings.md.

  python benchmarks/regions_probe.py [--workload adult3k-2x50] [--points 12] [--radii 0.05,0.1,0.2]
  python benchmarks/regions_probe.py --points 6 --radii 0.05,0.1 --verify 120

Needs the workload's run (benchmarks/regions.py trains it). Prints
- how far the test inputs lie from the nearest public input (L-inf, in the domain's units),
- the share of test inputs whose confidence is at most a few levels (what a box of that bound
  would still noise),
- for a seeded sample of over-noised test inputs (noised under the root's bound, yet no network
  disagrees there): the symbolic screen's bound (max over all leave-one-out networks) over L-inf
  boxes of each radius centred on the input, against the input's confidence. A box's bound must
  be below the confidence to release the input; the screen is the first and cheapest step of a
  box's verification, so this is what a box of that size gets in about two seconds;
- with --verify S: each such box verified for the input's class by the whole engine (screen,
  splitting tier, MILPs, leak search; --rel-gap 0.1, one worker, S seconds): [lower, upper]. The
  lower end is a replayed leak inside the box, so where it is at or above the input's confidence
  no sound bound of that box, however exact, releases the input.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regions as bench  # noqa: E402


def verify_box(box, cls: int, seconds: float, solver: str) -> tuple[float, float, bool]:
    """The engine's [lower, upper] on class `cls`'s bound over the box problem `box` (one worker,
    --rel-gap 0.1, `seconds` in all) and whether the class finished."""
    from functools import partial

    import lucid.bab.engine as bab_engine
    import lucid.bab.workers as executors
    import lucid.witness.search as witness_search
    from lucid.analysis.screen import Screen
    from lucid.bab.partition import FlatParameters
    from lucid.settings import VerifySettings

    settings = VerifySettings(solver=solver, workers=1, time_limit=seconds, rel_gap=0.1, progress=False)
    executor = executors.ThreadExecutor(lambda *a, **kw: executors.analyse_with(box, settings, *a, **kw), 1)
    screen = Screen(box, settings.screen, settings.device)
    try:
        engine = bab_engine.Engine(executor, [cls], len(box.stack), settings, params=FlatParameters(box.stack),
                                   screen=screen.initial, refine=screen.refine,
                                   search=partial(witness_search.search_class_witness, box, points=None))
        engine.run()
    finally:
        executor.close()
    cs = engine.states[cls]
    return (-np.inf if cs.lower is None else cs.lower), cs.upper, cs.complete


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="adult3k-2x50", choices=sorted(bench.WORKLOADS))
    p.add_argument("--points", type=int, default=12)
    p.add_argument("--radii", default="0.05,0.1,0.2")
    p.add_argument("--root-bound", type=float, default=2.2, help="The root's bound the sample is noised under.")
    p.add_argument("--verify", type=float, default=0.0, help="Seconds of the whole engine per box (0: screen only).")
    p.add_argument("--solver", default="highs")
    args = p.parse_args()

    from lucid.access.evaluate import leaking_set
    from lucid.analysis.problem import VerificationProblem
    from lucid.analysis.screen import Screen
    from lucid.network import NetworkFile, confidence
    from lucid.rundir import open_run, read_scaler

    root_dir = bench.RUNS / args.workload
    run = open_run(root_dir / "run")
    offset, scale = read_scaler(run)
    lower, upper = run.domain
    units = lambda name: np.clip((np.load(root_dir / f"{name}.npz")["X"] - offset) * scale, lower, upper)  # noqa: E731
    test, public = units("test").astype(np.float64), units("public").astype(np.float64)
    width = np.where(upper > lower, upper - lower, 1.0)
    nearest = (np.abs(test[:, None, :] - public[None, :, :]) / width).max(axis=2).min(axis=1)
    print("test inputs within L-inf r of a public input:",
          ", ".join(f"r {r}: {np.mean(nearest <= r):.1%}" for r in (0.05, 0.1, 0.2, 0.3, 0.5)))
    root = VerificationProblem.from_run(run)
    scores = root.stack.select(slice(0, 1)).forward(test)[0]
    conf, cls = confidence(scores), scores.argmax(axis=1)
    print("test inputs with confidence <= b:", ", ".join(f"b {b}: {np.mean(conf <= b):.1%}"
                                                           for b in (0.3, 0.6, 1.0, 1.5, args.root_bound)))
    over = np.flatnonzero((conf <= args.root_bound) & ~leaking_set(NetworkFile(run.path, run.meta), test))
    pick = np.random.default_rng(0).choice(over, min(args.points, len(over)), replace=False)
    positions = np.arange(1, len(root.stack))
    for i in pick:
        cells = [f"test input {i}: class {cls[i]}, confidence {conf[i]:.3f}"]
        for r in (float(v) for v in args.radii.split(",")):
            lo, hi = np.clip(test[i] - r * width, lower, upper), np.clip(test[i] + r * width, lower, upper)
            box = VerificationProblem.from_stack(root.stack, lo, hi, bounds=root.bounds_method)
            t0 = time.monotonic()
            b = Screen(box, "symbolic").initial(int(cls[i]), positions)
            cells.append(f"r {r}: {b.max():.3f} ({int((b > conf[i]).sum())} networks above, "
                         f"{time.monotonic() - t0:.1f} s)")
            if args.verify > 0:
                t0 = time.monotonic()
                low, up, done = verify_box(box, int(cls[i]), args.verify, args.solver)
                cells.append(f"verified [{low:.3f}, {up:.3f}]{'' if done else ' (open)'} in {time.monotonic() - t0:.0f} s")
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
