"""A class's branch-and-bound state (its active nodes, bounds and counters) and its JSON form,
which the checkpoint stores and a resume reads back."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from lucid.bab.node import OPEN, PENDING, RUNNING, Node
from lucid.rundir import decode_float, encode_float

INF = math.inf


@dataclass
class ClassState:
    cls: int
    nodes: dict[int, Node] = field(default_factory=dict)  # active nodes: pending, running, open
    next_id: int = 0
    lower: float | None = None  # best replayed witness confidence
    lower_row: int | None = None  # the leaking network's removed-row id
    lower_witness: list | None = None
    upper: float = INF  # anytime, never rises
    gap_floor: float = -INF  # largest bound of a node closed within the tolerance (part of upper)
    solved: int = 0  # node MILPs completed
    done: bool = False
    complete: bool = False
    reason: str = ""
    stopped_in: str | None = None  # stopped by the time limit: in which phase (`Phases.stopped_in`)
    # finished by the --gap / --rel-gap tolerance: upper may exceed the exact bound by up to it
    within_gap: bool = False
    seconds: float = 0.0
    screen: np.ndarray | None = None  # per position: sound upper bound on beta*_{c,{i}}
    refined: np.ndarray | None = None  # per position: the screen's optimisation has run (not saved)
    open_heap: list = field(default_factory=list)  # (-upper, id) of OPEN nodes (lazy deletion)
    pending_heap: list = field(default_factory=list)  # (-upper, id) of PENDING nodes
    logged: tuple = ()  # (upper, lower) of the last anytime event
    seekers: int = 0  # singletons analysed once without the cutoff, to find the best leak early
    # A level that is good enough (a --regions box: proving the class below it releases the box's
    # noised public points); like --gap, nodes proved below it are closed with their bound kept in
    # upper. Set per box by lucid.regions.one_box, never checkpointed.
    target: float | None = None
    # --residual M (lucid/bab/order_statistic.py): M, the set checked at query time (the M largest
    # network bounds) and, per position, the smallest bound a node analysis proved and the best
    # replayed leak; `upper` and `lower` are then the level and its lower bound. None: M = 0.
    residual_size: int | None = None
    residual: np.ndarray | None = None
    network_bound: np.ndarray | None = None
    network_leak: np.ndarray | None = None
    # --residual M: |level| when a singleton first failed its question (`AnytimeBounds.back_off`);
    # from then on the class asks halfway up to the level. Checkpointed: a resume asks as it did.
    backed_off: float | None = None

    @property
    def level(self) -> float:
        """--residual M: the level, the bound over every network outside the set. The anytime rules
        keep it where they keep a plain class's upper bound (never rises, floors at `lower`)."""
        if self.residual_size is None:
            raise AttributeError(f"class {self.cls} has no residual set: its bound is `upper`")
        return self.upper

    # --- bookkeeping ---------------------------------------------------------------------------
    def active_max(self) -> float:
        return max((n.upper for n in self.nodes.values()), default=-INF)

    def count(self, state: str) -> int:
        return sum(1 for n in self.nodes.values() if n.state == state)

    def to_json(self) -> dict:
        return {
            "next_id": self.next_id,
            "lower": encode_float(self.lower),
            "lower_row": self.lower_row,
            "lower_witness": self.lower_witness,
            "upper": encode_float(self.upper),
            "gap_floor": encode_float(self.gap_floor),
            "solved": self.solved,
            "done": self.done,
            "complete": self.complete,
            "reason": self.reason,
            "within_gap": self.within_gap,
            "seconds": self.seconds,
            "seekers": self.seekers,
            "nodes": [n.to_json() for n in self.nodes.values()],
            **(
                {}
                if self.residual_size is None
                else {
                    "residual_size": self.residual_size,
                    "networks": len(self.network_bound),
                    # with the screen folded in: a resume screens again,
                    # but without the refinements
                    "network_bound": [
                        encode_float(float(v))
                        for v in (
                            self.network_bound if self.screen is None else np.minimum(self.screen, self.network_bound)
                        )
                    ],
                    "network_leak": _sparse(self.network_leak, -INF),
                    **({} if self.backed_off is None else {"backed_off": self.backed_off}),
                }
            ),
        }

    @classmethod
    def from_json(cls, c: int, obj: dict) -> ClassState:
        cs = cls(
            cls=c,
            next_id=int(obj["next_id"]),
            lower=decode_float(obj["lower"]),
            lower_row=obj["lower_row"],
            lower_witness=obj["lower_witness"],
            upper=decode_float(obj["upper"]),
            gap_floor=decode_float(obj.get("gap_floor", "-inf")),
            solved=int(obj["solved"]),
            done=bool(obj["done"]),
            complete=bool(obj["complete"]),
            reason=str(obj.get("reason", "")),
            within_gap=bool(obj.get("within_gap", False)),
            seconds=float(obj["seconds"]),
            seekers=int(obj.get("seekers", 0)),
        )
        if obj.get("residual") is not None and "residual_size" not in obj:
            raise ValueError("a residual set chosen before the search (an older LUCID's checkpoint)")
        if "residual_size" in obj:
            cs.residual_size = int(obj["residual_size"])
            cs.network_bound = np.array([decode_float(v) for v in obj["network_bound"]], dtype=np.float64)
            if len(cs.network_bound) != int(obj["networks"]):
                raise ValueError("network_bound has the wrong length")
            cs.network_leak = _dense(obj["network_leak"], int(obj["networks"]), -INF)
            cs.backed_off = None if obj.get("backed_off") is None else float(obj["backed_off"])
        for raw in obj["nodes"]:
            node = Node.from_json(raw)
            if node.state == RUNNING:  # its MILP was lost with the killed process: redo it
                node.state = PENDING
            cs.nodes[node.id] = node
        cs.rebuild_heaps()
        return cs

    def rebuild_heaps(self) -> None:
        self.open_heap = [(-n.upper, n.id) for n in self.nodes.values() if n.state == OPEN]
        self.pending_heap = [(-n.upper, n.id) for n in self.nodes.values() if n.state == PENDING]
        heapq.heapify(self.open_heap)
        heapq.heapify(self.pending_heap)


def _sparse(values: np.ndarray, default: float) -> list:
    """[[position, value], ...] of the entries that differ from `default` (JSON-safe floats)."""
    return [[int(p), encode_float(float(values[p]))] for p in np.flatnonzero(values != default)]


def _dense(pairs: list, size: int, default: float) -> np.ndarray:
    values = np.full(size, default)
    for p, v in pairs:
        values[int(p)] = decode_float(v)
    return values
