"""One interface for every MILP backend.

A backend solves a `MilpModel` (maximisation) and reports the *proved* bound: the dual bound
of the branch-and-bound, which is an upper bound on the true optimum whatever the status.
The incumbent is only a candidate; callers replay its witness before using it as a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from lucid.milp.model import MilpModel

OPTIMAL = "optimal"
TIME_LIMIT = "time_limit"
INFEASIBLE = "infeasible"
ERROR = "error"
FOCUSES = ("balanced", "bound")


@dataclass
class SolverOptions:
    time_limit: float | None = None  # seconds; None = no limit
    threads: int = 1
    mip_rel_gap: float = 0.0
    mip_abs_gap: float = 0.0
    verbose: bool = False
    # "bound": the caller already holds a replayed lower bound and only wants the dual bound,
    # so primal heuristics are switched off: their sub-MIPs (HiGHS's RINS/RENS) would take much
    # of the time looking for incumbents LUCID does not use.
    focus: str = "balanced"
    # set from another thread to end the solve early (`threading.Event`): a race between the
    # ReLU-splitting tier and the MILP stops the loser. An interrupted MIP reports its dual bound
    # as at a time limit; backends that cannot be interrupted run to their time limit.
    stop: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.focus not in FOCUSES:
            raise ValueError(f"unknown solver focus {self.focus!r}; valid: {', '.join(FOCUSES)}")


class KeptSolve(Protocol):
    """A backend's handle to continue a time-limited solve (`SolveResult.tree`)."""

    model: MilpModel  # the caller's model, which a resumed result is checked against

    def resume(self, options: SolverOptions) -> SolveResult: ...

    def release(self) -> None: ...


@dataclass
class SolveResult:
    status: str  # OPTIMAL | TIME_LIMIT | INFEASIBLE | ERROR
    upper_bound: float  # proved dual bound (max problem); -inf when infeasible; +inf if unknown
    incumbent: float | None = None  # objective of the best solution found, if any
    solution: np.ndarray | None = None  # full primal vector of the incumbent
    gap: float | None = None
    nodes: int = 0
    seconds: float = 0.0
    solver: str = ""
    message: str = ""
    stats: dict = field(default_factory=dict)
    # a backend's handle to continue this time-limited solve (Gurobi with keep=True), else None;
    # whoever receives it must resume or release it
    tree: KeptSolve | None = field(default=None, repr=False, compare=False)

    @property
    def proved(self) -> bool:
        return self.status in (OPTIMAL, INFEASIBLE)

    def to_json(self) -> dict:
        def num(v: float | None) -> float | str | None:
            if v is None or math.isfinite(v):
                return v
            return "inf" if v > 0 else "-inf"

        return {
            "status": self.status,
            "upper_bound": num(self.upper_bound),
            "incumbent": num(self.incumbent),
            "gap": num(self.gap),
            "nodes": self.nodes,
            "seconds": round(self.seconds, 4),
            "solver": self.solver,
            "message": self.message,
        }
