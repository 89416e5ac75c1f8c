"""A branch-and-bound node: a set S of leave-one-out networks for one class.

`upper` is always a sound upper bound on max_{i in S} beta*_{c,{i}}: before the node is solved it
is the parent's bound (a child's networks are a subset of the parent's), afterwards the minimum of
that and the node's own proved bound, so a node's bound never rises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid.rundir import decode_float, encode_float

PENDING = "pending"  # created, waiting for a worker (carries the parent's bound)
RUNNING = "running"  # submitted to a worker
OPEN = "open"  # solved, in the priority queue
SPLIT = "split"  # branched into children
CLOSED = "closed"  # cannot raise beta_c (upper <= best lower, or infeasible)
SETTLED = "settled"  # solved, cannot be branched, bound proved (a singleton): waits to be on top
STUCK = "stuck"  # solved, cannot be branched, bound not proved even after retries: keeps its bound
FINAL = "final"  # a proved singleton on top of the queue: its bound is beta_c

PROVED_STATUSES = ("optimal", "infeasible")


@dataclass
class Node:
    id: int
    parent: int | None
    positions: np.ndarray  # network positions in the stack (>= 1; 0 is N)
    upper: float  # sound bound (inherited until solved)
    state: str = PENDING
    status: str | None = None  # solver status once solved
    lower: float | None = None  # replayed witness confidence, if any
    attempts: int = 0  # solves so far (an unproved singleton is retried with more time)
    depth: int = 0
    stats: dict = field(default_factory=dict)
    # a hyper-network MILP over (a superset of) these networks did not beat their screened bounds:
    # split by peeling off the top-screened networks as singletons instead (lucid.bab.partition.peel_top)
    peel: bool = False
    # --residual M: a member of the set sent to an analysis that may evict it (not checkpointed:
    # a resume sets members aside again, and tries the evictions again when the level waits)
    evicting: bool = False

    @property
    def size(self) -> int:
        return len(self.positions)

    @property
    def proved(self) -> bool:
        return self.status in PROVED_STATUSES

    @property
    def is_singleton(self) -> bool:
        return self.size == 1

    def event_fields(self) -> dict[str, Any]:
        """The fields that name the node in a log event (`lucid log` reads them back as the tree)."""
        return {"node": self.id, "parent": self.parent, "size": self.size, "upper": self.upper}

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "parent": self.parent,
            "positions": [int(p) for p in self.positions],
            "upper": encode_float(self.upper),
            "state": self.state,
            "status": self.status,
            "lower": encode_float(self.lower),
            "attempts": self.attempts,
            "depth": self.depth,
            "peel": self.peel,
        }

    @classmethod
    def from_json(cls, obj: dict) -> Node:
        return cls(
            id=int(obj["id"]),
            parent=None if obj["parent"] is None else int(obj["parent"]),
            positions=np.asarray(obj["positions"], dtype=np.int64),
            upper=decode_float(obj["upper"]),
            state=str(obj["state"]),
            status=obj["status"],
            lower=decode_float(obj["lower"]),
            attempts=int(obj["attempts"]),
            depth=int(obj["depth"]),
            peel=bool(obj.get("peel", False)),
        )
