"""The ledger's SQL, in one place: a memo transaction's charges and refusals, the budget decisions,
the reservations of calls answered in turns (lucid/access/memo/turns.py), and the ledger's rows as
`lucid budget` reads them.

The ledger (lucid/access/ledger.py says what it accounts for) is the memo database's tables `seen`
(which client has been answered, and charged for, which input) and `ledger` (per client and
epsilon: distinct inputs answered, the noised ones among them, refused requests; '*' the memo's own
draws), written in the same transaction as the answers they account for. Every statement on them,
and on `reserved`, is here; the memo's algorithm (store.py), the migration of old files
(metadata.py) and the backends call these functions. The one exception is the memo's read of
stored answers (store.py), which joins `seen` to learn in the same statement whether the client was
answered before.

A reservation holds a call's worst case (epsilon per distinct input, the most it can cost) from
the moment the call is admitted until it ends. Every budget check counts live reservations as
charged, so concurrent requests of the same client (in this process, another process or another
replica) can never take it past its budget, and the decision still depends only on which inputs
were asked, never on the branch. A reservation left by a process that died mid-call would hold a
client's budget forever, so each expires RESERVATION_TTL_S after it was made (wall clock; a call
takes seconds): expired rows count for nothing and are deleted by the client's next reservation.
A turn whose reservation has expired is checked against the budget on its own, as an unreserved
request is, so expiry never lets a charge through unchecked.

Locks (lucid/access/memo/store.py): a client's ledger, `seen` and reservation rows change only under
its lock (1), the all-clients row's ('*') only under the memo-wide lock (3).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from lucid.access.ledger import ALL_CLIENTS, within_budget
from lucid.access.memo.backend import KEYS_PER_STATEMENT
from lucid.errors import LucidError

RESERVATION_TTL_S = 600.0

_CHARGED = """
SELECT COALESCE((SELECT SUM(epsilon * answers) FROM ledger WHERE client = ?), 0.0)
     + COALESCE((SELECT SUM(epsilon * inputs) FROM reserved WHERE client = ? AND expires > ?), 0.0)
"""
_LEDGER_ADD = """
INSERT INTO ledger (client, epsilon, answers, noised) VALUES (?, ?, ?, ?)
ON CONFLICT (client, epsilon) DO UPDATE SET answers = ledger.answers + excluded.answers,
    noised = ledger.noised + excluded.noised
"""
_LEDGER_REFUSED = """
INSERT INTO ledger (client, epsilon, refused) VALUES (?, ?, 1)
ON CONFLICT (client, epsilon) DO UPDATE SET refused = ledger.refused + 1
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


def record_answers(db: Any, client: str | None, epsilon: float, fresh: Sequence[bytes], noised: int) -> None:
    """Charge `client` for the inputs `fresh` it had not been answered before (`noised` of them
    draws): they are marked seen by it, and its ledger row counts them."""
    db.executemany("INSERT INTO seen (key, client) VALUES (?, ?)", [(key, client) for key in fresh])
    db.execute(_LEDGER_ADD, (client, epsilon, len(fresh), noised))


def record_draws(db: Any, epsilon: float, draws: int, noised: int) -> None:
    """Count `draws` new memo entries given to a client (`noised` of them mechanism draws) in the
    all-clients row (under lock 3)."""
    db.execute(_LEDGER_ADD, (ALL_CLIENTS, epsilon, draws, noised))


def record_refusal(db: Any, client: str | None, epsilon: float) -> None:
    """Count one refused request in the client's ledger row."""
    db.execute(_LEDGER_REFUSED, (client, epsilon))


def forget_seen(db: Any, keys: Sequence[bytes]) -> None:
    """Forget who was answered the evicted `keys`: an evicted input's next answer is a fresh draw,
    charged again."""
    for start in range(0, len(keys), KEYS_PER_STATEMENT):
        part = keys[start : start + KEYS_PER_STATEMENT]
        db.execute(f"DELETE FROM seen WHERE key IN ({','.join('?' * len(part))})", part)  # noqa: S608 (placeholders only; values are bound)


def lock_client_rows(db: Any, client: str | None, epsilon: float) -> None:
    """Lock 1 where a transaction locks rows, not the whole database (PostgreSQL): all the client's
    ledger rows, since its charge sums them (rows of other epsilons no longer change)."""
    locked = db.execute("SELECT epsilon FROM ledger WHERE client = ? FOR UPDATE", (client,)).fetchall()
    if not any(float(row[0]) == epsilon for row in locked):
        # FOR UPDATE locks rows that exist: a new client's row is made first (by one replica: ON
        # CONFLICT waits for the other's insert), then locked.
        db.execute(
            "INSERT INTO ledger (client, epsilon) VALUES (?, ?) ON CONFLICT (client, epsilon) DO NOTHING",
            (client, epsilon),
        )
        db.execute("SELECT 1 FROM ledger WHERE client = ? AND epsilon = ? FOR UPDATE", (client, epsilon))


def drawn_epsilons(db: Any) -> list[Any]:
    """The epsilons the all-clients row counts answers under: those of the memo's draws (a migrated
    file's epsilon is adopted only if there is one, lucid/access/memo/metadata.py)."""
    return [
        row[0]
        for row in db.execute("SELECT DISTINCT epsilon FROM ledger WHERE client = ? AND answers > 0", (ALL_CLIENTS,))
    ]


def answered_to_no_client(db: Any) -> bool:
    """Whether some stored answer was given to no client, so that its draw is in no ledger row."""
    return (
        db.execute(
            "SELECT 1 FROM memo m WHERE NOT EXISTS (SELECT 1 FROM seen s WHERE s.key = m.key) LIMIT 1"
        ).fetchone()
        is not None
    )


def ledger_rows(db: Any, name: str, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows (client, epsilon, answers, noised, refused) of an open memo database (SQLite or
    PostgreSQL: `db.execute` with `?` placeholders), checked to be a LUCID memo and, with
    `fingerprint`, to be N's; sorted by client and epsilon."""
    meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
    if meta.get("format") not in ("lucid-memo/1", "lucid-memo/2", "lucid-memo/3"):
        raise LucidError(f"{name} is not a LUCID memo")
    if fingerprint and meta.get("fingerprint") and meta["fingerprint"] != fingerprint:
        raise LucidError(f"the memo {name} belongs to a different model or run")
    if meta["format"] == "lucid-memo/1":
        return []  # written before the ledger existed
    rows = db.execute("SELECT client, epsilon, answers, noised, refused FROM ledger").fetchall()
    # Sorted here, not by ORDER BY: a PostgreSQL collation may not put '*' first as SQLite does.
    return sorted((str(c), float(e), int(a), int(n), int(r)) for c, e, a, n, r in rows)
