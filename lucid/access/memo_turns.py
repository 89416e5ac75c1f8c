"""A large memo call answered in turns: `lucid serve` passes its decision gate as `turn`, and a call
of more than TURN_ROWS distinct inputs does its database work TURN_ROWS inputs at a time, one
transaction per turn, so that a single-row request waits for at most one short turn rather than a
whole 10 000-row batch (lucid/access/server.py).

The call's budgets are still decided once, for the whole call, before its first turn: its worst
case is reserved (lucid/access/memo_budget.py), each turn moves what it really charges from the
reservation to the ledger, and what is left is released at the end. A call whose worst case does
not fit a budget is decided exactly instead, in one turn (the exact charge counts only inputs new
to the client). So a call is answered whole or refused whole, as in one transaction, except where
the database fails between two turns: the turns already answered then stay stored and charged, as
after a crash, and the call raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

import numpy as np

from lucid.access.ledger import ALL_CLIENTS
from lucid.access.memo_budget import client_refusal, new_reservation, release, total_refusal
from lucid.errors import LucidError

if TYPE_CHECKING:
    from lucid.access.memo_store import SqlMemo

# Distinct inputs per turn: a turn of this many new inputs writes in about 5-10 ms on a 2-core
# machine, which is what a single-row request may wait behind a batch.
TURN_ROWS = 128

Turn = Callable[[int], ContextManager[Any]]


def answer_in_turns(memo: "SqlMemo", keys: Sequence[bytes], unique: list[bytes],
                    proposals: np.ndarray | Callable[[np.ndarray], np.ndarray], noised: np.ndarray | None,
                    client: str | None, epsilon: float, budget: float | None, total_budget: float | None,
                    turn: Turn, out: np.ndarray) -> None:
    """`memo.get_or_put` with a `turn`: fills `out` (module docstring)."""
    request = (proposals, noised, client, epsilon, budget, total_budget)
    if len(unique) <= TURN_ROWS:
        with turn(len(keys)):
            memo._answer(keys, unique, *request, None, out)
        return
    rid = None
    if client is not None and (budget is not None or total_budget is not None):
        with turn(1):
            rid = _reserve(memo, client, epsilon, len(unique), budget, total_budget)
        if rid is None:  # the worst case does not fit: decided exactly, in one transaction
            with turn(len(keys)):
                memo._answer(keys, unique, *request, None, out)
            return
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    where = np.fromiter((first[key] for key in unique), dtype=np.int64, count=len(unique))
    answers = np.empty(len(unique), dtype=np.int64)
    try:
        for start in range(0, len(unique), TURN_ROWS):
            part, at = unique[start : start + TURN_ROWS], where[start : start + TURN_ROWS]
            offered = (lambda p, at=at: proposals(at[p])) if callable(proposals) else np.asarray(proposals)[at]
            flags = None if noised is None else np.asarray(noised)[at]
            with turn(len(part)):
                memo._answer(part, part, offered, flags, client, epsilon, budget, total_budget, rid,
                             answers[start : start + len(part)])
    finally:
        if rid is not None:
            with turn(1):
                _release(memo, rid, client, epsilon, total_budget is not None)
    position = {key: i for i, key in enumerate(unique)}
    out[:] = answers[[position[key] for key in keys]]


def _reserve(memo: "SqlMemo", client: str, epsilon: float, inputs: int, budget: float | None,
             total_budget: float | None) -> str | None:
    """Reserve the worst case of a call of `inputs` distinct keys; its id, or None if that worst case
    does not fit a budget (nothing is reserved or recorded then). Locks in the memo's order: the
    client's rows (1), then the memo-wide ones (3) for the all-clients row."""
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


def _release(memo: "SqlMemo", rid: str, client: str, epsilon: float, total: bool) -> None:
    """Drop what is left of a reservation. Best effort: one the database does not take now expires."""
    try:
        with memo._guard(), memo._transaction() as db:
            memo._lock_client(db, client, epsilon)
            release(db, rid, client)
            if total:
                memo._lock_memo(db)
                release(db, rid, ALL_CLIENTS)
    except LucidError:  # the memo's MemoError
        pass
