"""What keeps the residual rule from releasing a test input: the level, the check, and how many
networks a tighter box would have to set aside.

  python benchmarks/residual_binding.py benchmarks/runs/residual/adult3k-2x50/M128-R64
  python benchmarks/residual_binding.py RUN --leaves 2 --rows 5 --radius 0.01

For a verified run directory (with `--residual M`, with or without `--regions K`) on its test
split: the share noised by the level and by the residual check; the leaves holding the most noised
rows, with their mean box width; per class there, how many networks the symbolic screen bounds at
or above each noised row's confidence over the leaf's box (the M that leaf would need), and for a
few rows over an L-inf box of `--radius` around the row (what a box hugging the row would need).
Prints a Markdown report (benchmarks/results/residual_binding.md holds the last one).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lucid.access.classifier import LabelOnlyClassifier
from lucid.access.memo import Memo
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen
from lucid.network import confidence
from lucid.rundir import open_run


def networks_above(problem: VerificationProblem, lower: np.ndarray, upper: np.ndarray, cls: int,
                   confidences: np.ndarray) -> np.ndarray:
    """Per confidence, how many networks the symbolic screen bounds at or above it over [lower, upper]."""
    box = VerificationProblem.from_stack(problem.stack, lower, upper, bounds="lp")
    bounds = Screen(box, "symbolic").initial(cls, np.arange(1, len(box.stack), dtype=np.int64))
    return np.array([int((bounds >= v).sum()) for v in confidences])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--leaves", type=int, default=2, help="the leaves with the most noised rows to look into")
    parser.add_argument("--rows", type=int, default=5, help="rows per class whose own small box is screened")
    parser.add_argument("--radius", type=float, default=0.01, help="half-width of the box around a row")
    args = parser.parse_args()
    run = open_run(Path(args.run))
    clf = LabelOnlyClassifier(run, epsilon=0.0, memo=Memo(None))
    x = np.clip(np.asarray(run.data()["X_test"], np.float64), clf.domain_lower, clf.domain_upper) + 0.0
    cls, noised = clf.decide(x)
    conf = confidence(clf.scores(x))
    tree = clf.regions
    leaves = tree.locate(x) if tree is not None else np.zeros(len(x), dtype=np.int64)
    levels = clf.region_thresholds[leaves, cls] if tree is not None else clf.residual_thresholds[cls]
    by_level = noised & ~(conf > levels)
    print(f"# What binds the residual rule: {args.run}\n")
    print(f"{len(x)} test inputs: noised {noised.mean():.1%} (by the level {by_level.mean():.1%}, by the check "
          f"{(noised & ~by_level).mean():.1%}).\n")
    problem = VerificationProblem.from_run(run, bounds="lp", with_points=False)
    counts = np.bincount(leaves[noised], minlength=1 if tree is None else len(tree))
    print("| leaf | noised rows there | mean box width | class | rows | median confidence | networks >= confidence "
          "over the leaf (median, quartiles) | over a row's own box (per row) |")
    print("|---|---|---|---|---|---|---|---|")
    for leaf in np.argsort(-counts)[: args.leaves]:
        lo, hi = (tree.box(int(leaf)) if tree is not None else (clf.domain_lower, clf.domain_upper))
        here = (leaves == leaf) & noised
        for c in np.unique(cls[here]):
            rows = here & (cls == c)
            need = networks_above(problem, lo, hi, int(c), conf[rows])
            own = [int(networks_above(problem, np.maximum(lo, xi - args.radius), np.minimum(hi, xi + args.radius),
                                      int(c), np.array([v]))[0])
                   for xi, v in list(zip(x[rows], conf[rows]))[: args.rows]]
            q = np.percentile(need, [25, 75])
            print(f"| {int(leaf)} | {int(counts[leaf])} | {float(np.mean(hi - lo)):.2f} | {int(c)} | {int(rows.sum())} | "
                  f"{np.median(conf[rows]):.3f} | {np.median(need):.0f} ({q[0]:.0f}-{q[1]:.0f}) | "
                  f"{', '.join(map(str, own))} |")


if __name__ == "__main__":
    main()
