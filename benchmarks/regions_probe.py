"""What a box around data can prove on a regions workload (default Adult 3k): the geometry behind
benchmarks/results/regions_findings.md.

  python benchmarks/regions_probe.py [--workload adult3k-2x50] [--points 12] [--radii 0.05,0.1,0.2]
  python benchmarks/regions_probe.py --points 6 --radii 0.05,0.1 --verify 120
  python benchmarks/regions_probe.py --decide 300 --k 256 --points 8 [--part 1/2] [--radius 0.1]

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

With --decide S --k K it asks instead, for a seeded sample of the test inputs that the K run
(benchmarks/regions.py's) over-noises, whether the exact bound of the box the run put each one in
is below its confidence: the whole engine verifies the input's class over that box (the box
`lucid verify --regions` verified the leaf over) with the input's confidence as the class's
target, so every MILP only has to prove its networks below it (one worker, S seconds). Verdicts:
"leak" (a replayed leaking input of the box is at least as confident: no bound of that box, exact
or not, releases the input; only another box could), "released" (the box's exact bound is below
the confidence: a tighter verification of the same box would release it), "open" (neither within
S seconds: the interval [lower, upper] brackets the exact bound). With --radius r, the box is an
L-inf box of radius r around the input instead (what the smallest boxes could release).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regions as bench  # noqa: E402


class _Decided(Exception):
    """A leak at or above the target was replayed: the question `--decide` asks is answered."""


def verify_box(box, cls: int, seconds: float, solver: str, target: float | None = None) -> tuple[float, float, bool]:
    """The engine's [lower, upper] on class `cls`'s bound over the box problem `box` (one worker,
    `seconds` in all) and whether the class finished: to within 10 % (--rel-gap 0.1), or with a
    `target`, until the bound is proved at or below it or a leak at or above it is replayed.
    `known_lower`: a leak's confidence already replayed in the box (the run's)."""
    from functools import partial

    import lucid.bab.engine as bab_engine
    import lucid.bab.workers as executors
    import lucid.witness.search as witness_search
    from lucid.analysis.screen import Screen
    from lucid.bab.hooks import EngineHooks
    from lucid.bab.partition import FlatParameters
    from lucid.bab.state import ClassState
    from lucid.settings import VerifySettings

    settings = VerifySettings(solver=solver, workers=1, time_limit=seconds, rel_gap=0.1 if target is None else 0.0,
                              progress=False)
    states = {cls: ClassState(cls=cls, target=target)}

    def stop_at_leak(engine) -> None:
        lower = engine.states[cls].lower
        if target is not None and lower is not None and lower >= target:
            raise _Decided
    executor = executors.ThreadExecutor(lambda *a, **kw: executors.analyse_with(box, settings, *a, **kw), 1)
    screen = Screen(box, settings.screen, settings.device)
    try:
        engine = bab_engine.Engine(executor, [cls], len(box.stack), settings, params=FlatParameters(box.stack),
                                   hooks=EngineHooks(screen=screen.initial, refine=screen.refine,
                                                     search=partial(witness_search.search_class_witness, box,
                                                                    points=None),
                                                     on_progress=stop_at_leak),
                                   states=states)
        try:
            engine.run()
        except _Decided:
            pass
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
    p.add_argument("--decide", type=float, default=0.0,
                   help="Seconds per input: is the exact bound of the K run's box below its confidence?")
    p.add_argument("--k", type=int, default=256, help="With --decide: the benchmark's run of this K.")
    p.add_argument("--part", default="1/1", help="With --decide: J/M runs the J-th of M interleaved parts of the sample.")
    p.add_argument("--radius", type=float, default=0.0,
                   help="With --decide: an L-inf box of this radius (share of each feature's width) around each "
                        "input instead of the run's box.")
    args = p.parse_args()
    if args.decide > 0:
        decide(args)
        return

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


def decide(args: argparse.Namespace) -> None:
    """--decide: the verdict on each sampled over-noised test input of the K run (module docstring)."""
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.access.evaluate import leaking_set
    from lucid.access.memo import Memo
    from lucid.analysis.problem import VerificationProblem
    from lucid.network import NetworkFile, confidence
    from lucid.rundir import open_run

    run = open_run(bench.RUNS / args.workload / f"K{args.k}")
    clf = LabelOnlyClassifier(run, epsilon=1.0, memo=Memo(None))
    tree = clf.regions
    if tree is None:
        raise SystemExit(f"{run.path} has no regions: pick a K > 1")
    x = np.clip(np.asarray(run.data()["X_test"], np.float64), clf.domain_lower, clf.domain_upper) + 0.0
    cls, noised = clf.decide(x)
    over = np.flatnonzero(noised & ~leaking_set(NetworkFile(run.path, run.meta), x))
    conf, leaf = confidence(clf.scores(x)), tree.locate(x)
    pick = np.random.default_rng(0).choice(over, min(args.points, len(over)), replace=False)
    j, m = (int(v) for v in args.part.split("/"))
    root = VerificationProblem.from_run(run)
    print(f"{args.workload} K={args.k}: {len(over)} over-noised test inputs; sample {len(pick)}, part {j}/{m}")
    for i in pick[j - 1 :: m]:
        node, c = int(leaf[i]), int(cls[i])
        kind = ("rest of a carve" if tree.inherits_box(node) else "not verified" if not tree.verified[node] else
                "exact" if tree.complete[node][c] else "cut short")
        known = float(max(tree.bound_lower[a][c] for a in [node, *tree.ancestors(node)]))
        cells = [f"input {i}: class {c}, confidence {conf[i]:.3f}, leaf {node} ({kind}), bound {tree.bound_upper[node][c]:.3f}"]
        t0 = time.monotonic()
        if args.radius > 0:  # a box around the input alone: what the smallest boxes could release
            width = np.where(root.upper > root.lower, root.upper - root.lower, 1.0)
            lo, hi = np.clip(x[i] - args.radius * width, root.lower, root.upper), np.clip(
                x[i] + args.radius * width, root.lower, root.upper)
            cells[0] += f", L-inf box of radius {args.radius}"
            known, cap = -np.inf, np.inf
        else:
            (lo, hi), cap = tree.box(node), float(tree.bound_upper[node][c])
        if known >= conf[i]:
            low, up = known, cap
        else:
            box = VerificationProblem.from_stack(root.stack, lo, hi, bounds=root.bounds_method)
            low, up, _ = verify_box(box, c, args.decide, args.solver, target=float(conf[i]))
            low, up = max(low, known), min(up, cap)  # the run's bounds of its box hold too
        verdict = "leak" if low >= conf[i] else "released" if up < conf[i] else "open"
        cells.append(f"[{low:.3f}, {up:.3f}] in {time.monotonic() - t0:.0f} s: {verdict}")
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
