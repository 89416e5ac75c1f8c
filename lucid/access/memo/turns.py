"""A large memo call answered in turns, and the gate that orders the turns of concurrent calls.

`lucid serve` hands its gate (`SizeOrderedGate`, defined here so that the service only hands it
down) to the memo as `turn`, and a call of more than TURN_ROWS distinct inputs does its database
work TURN_ROWS inputs at a time, one transaction per turn, so that a single-row request waits for at
most one short turn rather than a whole 10 000-row batch (lucid/access/server.py). The memo's
algorithm (store.py) hands this module its one step, so that the turns need nothing of it but the
backend's transactions.

The call's budgets are still decided once, for the whole call, before its first turn: its worst
case is reserved (lucid/access/memo/budget.py), each turn moves what it really charges from the
reservation to the ledger, and what is left is released at the end. A call whose worst case does
not fit a budget is decided exactly instead, in one turn (the exact charge counts only inputs new
to the client). So a call is answered whole or refused whole, as in one transaction, except where
the database fails between two turns: the turns already answered then stay stored and charged, as
after a crash, and the call raises.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from lucid.access.ledger import ALL_CLIENTS
from lucid.access.memo.backend import SqlBackend
from lucid.access.memo.budget import client_refusal, new_reservation, release, total_refusal
from lucid.access.memo.request import Batch, Charge
from lucid.errors import LucidError

# Distinct inputs per turn: a turn of this many new inputs writes in about 5-10 ms on a 2-core
# machine, which is what a single-row request may wait behind a batch.
TURN_ROWS = 128

Turn = Callable[[int], AbstractContextManager[Any]]
# One step of the memo's algorithm: a batch answered into `out` in one transaction (or read-only),
# under the call's reservation (None: its budgets are checked in that transaction).
Step = Callable[[Batch, str | None, np.ndarray], None]


# What a row is taken to cost when turns queue at the gate (SizeOrderedGate): a batch takes its turns
# a piece of its body (lucid/access/guard.py) or TURN_ROWS inputs at a time, and a
# single row that arrives while such a turn waits goes first unless the turn has waited rows x this
# (about 50 ms for 128 rows); far above the 10-30 us a row really costs, so that single rows pass
# queued turns, while a batch still gets a turn every 50 ms however many single rows arrive.
ROW_COST_S = 400e-6


class SizeOrderedGate:
    """A lock for the classifier's decisions (`lucid serve` hands its `hold` down as `turn`), handed to
    the waiter with the smallest key: its arrival time plus `row_cost` per row. A single row that
    arrives while a 10 000-row batch waits goes first (unless the batch has waited rows x row_cost),
    so it waits for at most the decision under way; a plain lock would make it wait behind every
    batch queued before it. Batches do not starve: requests that arrive later than rows x row_cost
    after a batch queue behind it."""

    def __init__(self, row_cost: float = ROW_COST_S) -> None:
        self.row_cost = row_cost
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[float, int]] = []
        self._tickets = itertools.count()

    @contextmanager
    def hold(self, rows: int) -> Iterator[None]:
        with self._cond:
            key = (time.monotonic() + rows * self.row_cost, next(self._tickets))
            heapq.heappush(self._waiting, key)
            try:
                while self._busy or self._waiting[0] != key:
                    self._cond.wait()
            except BaseException:  # a waiter that leaves must not block the queue behind it
                self._waiting.remove(key)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def answer_in_turns(memo: SqlBackend, step: Step, batch: Batch, turn: Turn, out: np.ndarray) -> None:
    """`memo.get_or_put` with a `turn`, its steps done by `step`: fills `out` (module docstring)."""
    keys, unique, charge = batch.keys, batch.unique, batch.charge
    if len(unique) <= TURN_ROWS:
        with turn(len(keys)):
            step(batch, None, out)
        return
    rid = None
    if charge.client is not None and (charge.budget is not None or charge.total_budget is not None):
        with turn(1):
            rid = _reserve(memo, charge, len(unique))
        if rid is None:  # the worst case does not fit: decided exactly, in one transaction
            with turn(len(keys)):
                step(batch, None, out)
            return
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    where = np.fromiter((first[key] for key in unique), dtype=np.int64, count=len(unique))
    answers = np.empty(len(unique), dtype=np.int64)
    try:
        for start in range(0, len(unique), TURN_ROWS):
            part, at = unique[start : start + TURN_ROWS], where[start : start + TURN_ROWS]
            with turn(len(part)):
                step(_turn_of(batch, part, at), rid, answers[start : start + len(part)])
    finally:
        if rid is not None:
            with turn(1):
                _release(memo, rid, charge)
    position = {key: i for i, key in enumerate(unique)}
    out[:] = answers[[position[key] for key in keys]]


def _turn_of(batch: Batch, part: list[bytes], at: np.ndarray) -> Batch:
    """The turn of `batch` that answers its distinct keys `part`, first found at positions `at`."""
    proposals, noised = batch.proposals, batch.noised
    offered = (lambda p: proposals(at[p])) if callable(proposals) else np.asarray(proposals)[at]
    return Batch(part, offered, None if noised is None else np.asarray(noised)[at], batch.charge)


def _reserve(memo: SqlBackend, charge: Charge, inputs: int) -> str | None:
    """Reserve the worst case of a call of `inputs` distinct keys; its id, or None if that worst case
    does not fit a budget (nothing is reserved or recorded then). Locks in the memo's order: the
    client's rows (1), then the memo-wide ones (3) for the all-clients row."""
    client, epsilon, budget, total_budget = charge.client, charge.epsilon, charge.budget, charge.total_budget
    with memo._guard(), memo._transaction() as db:
        memo._lock_client(db, client, epsilon)
        if client_refusal(db, client, epsilon, inputs, budget):
            return None
        if total_budget is not None:
            memo._lock_memo(db)
            if total_refusal(db, epsilon, inputs, total_budget):
                return None
        rid = new_reservation(db, client, epsilon, inputs)
        if total_budget is not None:
            new_reservation(db, ALL_CLIENTS, epsilon, inputs, rid)
        return rid


def _release(memo: SqlBackend, rid: str, charge: Charge) -> None:
    """Drop what is left of a reservation. Best effort: one the database does not take now expires."""
    try:
        with memo._guard(), memo._transaction() as db:
            memo._lock_client(db, charge.client, charge.epsilon)
            release(db, rid, charge.client)
            if charge.total_budget is not None:
                memo._lock_memo(db)
                release(db, rid, ALL_CLIENTS)
    except LucidError:  # the memo's MemoError
        pass
