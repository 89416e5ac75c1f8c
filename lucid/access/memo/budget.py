"""The budget decisions of a memo transaction, in SQL: a client's charge, the two refusals, and the
reservations of calls answered in turns (lucid/access/memo/turns.py).

A reservation holds a call's worst case (epsilon per distinct input, the most it can cost) from
the moment the call is admitted until it ends. Every budget check counts live reservations as
charged, so concurrent requests of the same client (in this process, another process or another
replica) can never take it past its budget, and the decision still depends only on which inputs
were asked, never on the branch. A reservation left by a process that died mid-call would hold a
client's budget forever, so each expires RESERVATION_TTL_S after it was made (wall clock; a call
takes seconds): expired rows count for nothing and are deleted by the client's next reservation.
A turn whose reservation has expired is checked against the budget on its own, as an unreserved
request is, so expiry never lets a charge through unchecked.

Locks (lucid/access/memo/store.py): a client's reservation rows change only under its lock (1), the
all-clients row's ('*') only under the memo-wide lock (3), like the ledger rows they stand for.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from lucid.access.ledger import ALL_CLIENTS, within_budget

RESERVATION_TTL_S = 600.0

_CHARGED = """
SELECT COALESCE((SELECT SUM(epsilon * answers) FROM ledger WHERE client = ?), 0.0)
     + COALESCE((SELECT SUM(epsilon * inputs) FROM reserved WHERE client = ? AND expires > ?), 0.0)
"""


def charged(db: Any, client: str | None) -> float:
    """A client's worst-case charge: epsilon per distinct answer, released or noised, plus its live
    reservations."""
    return float(db.execute(_CHARGED, (client, client, time.time())).fetchone()[0])


def client_refusal(db: Any, client: str | None, epsilon: float, fresh: int, budget: float | None) -> str | None:
    """The fixed message refusing a call whose `fresh` keys (new to this client) would exceed its
    budget; None if it fits. It counts epsilon per key, never whether it is noised: the branch stays hidden."""
    if budget is not None and fresh and not within_budget(charged(db, client) + epsilon * fresh, budget):
        return (
            f"the privacy budget of {budget:g} is spent for this client: only inputs it was answered "
            "before are answered now"
        )
    return None


def total_refusal(db: Any, epsilon: float, draws: int, total_budget: float | None) -> str | None:
    """The same for the `draws` (keys new to the memo) against the all-clients total."""
    if (
        total_budget is not None
        and draws
        and not within_budget(charged(db, ALL_CLIENTS) + epsilon * draws, total_budget)
    ):
        return (
            f"the total privacy budget of {total_budget:g} of this service is spent: only inputs "
            "answered before are answered now"
        )
    return None


def new_reservation(db: Any, client: str | None, epsilon: float, inputs: int, rid: str | None = None) -> str:
    """Reserve `inputs` x epsilon for `client` (under its lock) until released or expired, under the
    id `rid` (a new one if None: one id may name a client's row and the all-clients row); the id.
    The client's expired reservations go first."""
    now = time.time()
    db.execute("DELETE FROM reserved WHERE client = ? AND expires <= ?", (client, now))
    rid = uuid.uuid4().hex if rid is None else rid
    db.execute(
        "INSERT INTO reserved (id, client, epsilon, inputs, expires) VALUES (?, ?, ?, ?, ?)",
        (rid, client, epsilon, int(inputs), now + RESERVATION_TTL_S),
    )
    return rid


def draw_on(db: Any, rid: str | None, client: str, inputs: int) -> bool:
    """Move `inputs` of reservation `rid` of `client` to the ledger (the caller charges them there in
    the same transaction). False if there is no such live reservation: the caller must then check
    the budget itself."""
    if rid is None:
        return False
    row = db.execute(
        "UPDATE reserved SET inputs = inputs - ? WHERE id = ? AND client = ? AND expires > ? "
        "AND inputs >= ? RETURNING inputs",
        (int(inputs), rid, client, time.time(), int(inputs)),
    ).fetchone()
    return row is not None


def release(db: Any, rid: str, client: str | None) -> None:
    """Drop what is left of a reservation (under the lock its client's rows need)."""
    db.execute("DELETE FROM reserved WHERE id = ? AND client = ?", (rid, client))
