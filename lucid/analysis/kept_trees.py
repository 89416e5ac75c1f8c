"""Kept trees: a singleton's time-limited MILP held in its worker so that the node's retry continues it.

A singleton cannot be branched, so a node time limit only interrupts it. A retry that rebuilt
the model, tightened its bounds again and restarted the solver's branch-and-bound from the root
would throw away all the work of the attempts before it, and the hardest singletons, which
decide when a class ends, are exactly the ones retried several times. So a retry's MILP, when
the backend can continue it (Gurobi), stays in the worker process, and the node's next attempt
resumes its tree.

Soundness: a kept model is the same model, with the same floor (the beta level it is restricted
to), so a resumed solve's dual bound means exactly what it meant before; `lucid.analysis.analyse` applies
the safety margin, the witness replay and the cross-checks to it like to any other solve. A model
is only resumed for the same verification problem, class and networks, and only while its floor
is at least the level the caller now needs, so resuming never answers a different question.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# Per process; each holds a solver model with its search tree (tens to hundreds of MB on
# long solves). With the engine's worker affinity a worker only needs the tree of its current node.
KEEP_LIMIT = 2


@dataclass
class KeptTree:
    problem: Any  # the VerificationProblem it belongs to (compared by identity)
    key: tuple  # (class, network positions)
    tree: Any  # the backend's handle (`SolveResult.tree`)
    model: Any  # the MilpModel it solves
    level: float  # the slackened beta floor of that model
    bound: float  # the other sound bounds of the attempt that built it (OBBT's output interval)
    witness: Any  # the best replayed leak known for the node then (LeakWitness or None)
    info: dict = field(default_factory=dict)

    def release(self) -> None:
        self.tree.release()


class KeptTrees:
    """The trees this process holds, oldest released first beyond `limit`."""

    def __init__(self, limit: int = KEEP_LIMIT) -> None:
        self._limit = limit
        self._entries: OrderedDict[tuple, KeptTree] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, entry: KeptTree) -> None:
        evicted = []
        with self._lock:
            old = self._entries.pop(entry.key, None)
            if old is not None:
                evicted.append(old)
            self._entries[entry.key] = entry
            while len(self._entries) > self._limit:
                evicted.append(self._entries.popitem(last=False)[1])
        for e in evicted:
            e.release()

    def take(self, problem: Any, key: tuple) -> KeptTree | None:
        """The tree kept for `key` of `problem`, removed from the store (the caller owns it now)."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None and entry.problem is not problem:
            entry.release()
            return None
        return entry

    def clear(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            e.release()

    def __len__(self) -> int:
        return len(self._entries)


KEPT = KeptTrees()
