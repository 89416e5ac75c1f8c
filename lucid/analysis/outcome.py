"""A node analysis's answer (`NodeOutcome`), how the answers of a node's solves combine, and the
witness search aimed at a small node whose MILP ended without one."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

import lucid.witness.search as witness_search  # module-qualified: tests count its calls
from lucid.analysis.soundness import contradicts
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT
from lucid.witness.replay import LeakWitness

log = logging.getLogger(__name__)

# A small node's MILP often ends at its time limit without an incumbent; a search aimed at just its
# networks (a few seconds) then still gives the node a replayed witness.
SEARCH_MAX_NETWORKS = 8


@dataclass
class NodeOutcome:
    upper: float  # sound upper bound on beta*_{c,S} (-inf: no input can leak)
    lower: float | None  # N's confidence at a replayed, truly leaking witness
    witness: np.ndarray | None
    leaking_row: int | None
    status: str
    seconds: float
    stats: dict = field(default_factory=dict)


def combine_outcome(upper: float, statuses: list[str], best: LeakWitness | None, stats: dict, t0: float) -> NodeOutcome:
    if not statuses:
        return NodeOutcome(-math.inf, None, None, None, INFEASIBLE, time.perf_counter() - t0, stats)
    status = (
        ERROR
        if ERROR in statuses
        else TIME_LIMIT
        if TIME_LIMIT in statuses
        else OPTIMAL
        if OPTIMAL in statuses
        else INFEASIBLE
    )
    if contradicts(upper, best):
        # every retry failed to produce a consistent bound: claim nothing for this node
        upper, status = math.inf, ERROR
    for key in ("binaries", "relaxed", "binaries_n", "binaries_hyper", "md_rows"):
        stats[key] = sum(s.get(key, 0) for s in stats["solves"])
    if any(s.get("kept") for s in stats["solves"]):
        stats["kept"] = True  # the executor sends the node's next retry to this worker
    return NodeOutcome(
        upper=upper,
        lower=None if best is None else best.confidence,
        witness=None if best is None else best.x,
        leaking_row=None if best is None else best.leaking_row,
        status=status,
        seconds=time.perf_counter() - t0,
        stats=stats,
    )


def wants_targeted_search(outcome: NodeOutcome, positions: np.ndarray) -> bool:
    """A small node that can leak and has no witness yet (an optimal witness is as good as any
    search; an infeasible node has nothing above the cutoff)."""
    return (
        len(positions) <= SEARCH_MAX_NETWORKS
        and outcome.upper > -math.inf
        and outcome.status != INFEASIBLE
        and (outcome.status != OPTIMAL or outcome.lower is None)
    )


def with_targeted_search(
    problem, cls: int, positions: np.ndarray, outcome: NodeOutcome, deadline: float | None = None
) -> NodeOutcome:
    """`outcome` with the best leak a search aimed at the node's networks finds by `deadline`
    (time.monotonic()), if it is better."""
    t0 = time.perf_counter()
    found = witness_search.search_class_witness(
        problem,
        cls,
        np.asarray(positions),
        points=problem.points,
        effort=witness_search.TARGETED_SEARCH,
        deadline=deadline,
    )
    stats = dict(outcome.stats or {})
    stats["search_seconds"] = time.perf_counter() - t0
    stats["search_lower"] = None if found is None else float(found.confidence)
    return with_leak(dataclasses.replace(outcome, stats=stats), found, cls)


def with_leak(outcome: NodeOutcome, found: LeakWitness | None, cls: int) -> NodeOutcome:
    """`outcome` with the replayed leak `found` where it beats the outcome's own. A true leak above
    a "proved" bound means the solver failed: that bound is never used (the node keeps its parent's,
    inherited one), loudly."""
    if found is None or (outcome.lower is not None and found.confidence <= outcome.lower):
        return outcome
    upper, status, stats = outcome.upper, outcome.status, outcome.stats
    if contradicts(upper, found):
        log.error(
            "UNSOUND node bound for class %d: %.9g < replayed witness %.9g; bound dropped", cls, upper, found.confidence
        )
        stats = {**(stats or {}), "unsound_bound": float(upper)}
        upper, status = math.inf, ERROR
    return dataclasses.replace(
        outcome,
        upper=upper,
        status=status,
        lower=float(found.confidence),
        witness=found.x,
        leaking_row=found.leaking_row,
        stats=stats,
    )
