"""Whether a `--residual M` class's singletons still get their MILP after the split.

A singleton asked about a cutoff runs the ReLU split first and hands the rest of its time to the
MILP when the split gives up. On the networks that hold a residual level of a larger network the
MILP is no help within a node's limit: on Adult 2x50 (4 000 rows) its root LP alone takes longer
than the limit, so the node's bound is the split's after its give-up, while the split given the
whole limit ends 0.04-0.09 lower on the same networks (benchmarks/results/residual_adult4k.md). On
small networks the MILP is exact in seconds and proves what the split cannot. So each class
measures it: once MIN_RUNS of its singletons ran their MILP after an unproved split, and fewer
than one in WIN_SHARE of those MILPs proved the node or beat the split's bound by more than
WIN_MARGIN (relative: a MILP that ends a hair below the split was no reason to run it), the class's
singletons get the split alone (`NodeRequest.split_only`); every PROBE_EVERY-th one still gets the
MILP, which keeps the measure current and finds leaks. Not checkpointed: a resumed class measures
again. Plain classes (without --residual) always keep the MILP: their question is the exact bound
at the best leak, which only the MILP may settle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lucid.rundir import decode_float
from lucid.solvers.base import INFEASIBLE, OPTIMAL

MIN_RUNS = 8
WIN_SHARE = 8
WIN_MARGIN = 0.01
PROBE_EVERY = 8


@dataclass
class MilpWorth:
    """One class's record of its singleton MILPs (module docstring)."""

    runs: int = 0  # singleton analyses whose MILP ran after an unproved split
    wins: int = 0  # of them, those whose MILP proved the node or beat the split's bound by WIN_MARGIN
    asked: int = 0  # singletons decided since the MILP was last found wanting

    def record(self, stats: dict, status: str) -> None:
        """Count one analysis from its outcome's `stats` and `status` (analyses without both tiers,
        or racing them, count for nothing)."""
        split, solves = stats.get("split"), stats.get("solves")
        if not split or split.get("proved") or not solves or stats.get("race") is not None:
            return
        self.runs += 1
        milp = min((decode_float(s.get("upper_bound", "inf")) for s in solves), default=math.inf)
        split_upper = decode_float(split.get("upper", "inf"))
        if status in (OPTIMAL, INFEASIBLE) or milp < split_upper - WIN_MARGIN * abs(split_upper):
            self.wins += 1

    @property
    def wanting(self) -> bool:
        """Whether the class's MILPs have been measured and found no help."""
        return self.runs >= MIN_RUNS and self.wins * WIN_SHARE < self.runs

    def split_only(self) -> bool:
        """Whether the next singleton gets the split alone (each call decides one singleton)."""
        if not self.wanting:
            self.asked = 0
            return False
        self.asked += 1
        return self.asked % PROBE_EVERY != 0
