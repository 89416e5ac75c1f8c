"""The memo's algorithm, whatever database holds it: answers, the ledger charge and both budgets.

`SqlMemo` is the whole algorithm of a memo (lucid/access/memo/__init__.py says why a memo exists),
written once over the backend interface of lucid/access/memo/backend.py, which the SQLite and
PostgreSQL backends (sqlite.py, postgres.py) implement.

Locking (what makes "one draw per input" and exact budgets hold across processes and machines):
a write transaction takes, in this order and only in this order, (1) the client's ledger row,
(2) a key-share lock on each stored memo row it relies on, (3) the memo-wide lock, before it
draws, writes LRU positions or evicts. A client's charge and its `seen` rows change only under
(1), so "fresh" inputs and the per-client budget are exact; the memo's entries, its count and the
all-clients row change only under (3), so the draws and the total budget are exact, and an input
missing before (3) is read again after it (another replica may have drawn it meanwhile: its draw
is returned, never a second one). Eviction skips rows under (2), so an entry a transaction
charges a client for cannot vanish under it. No deadlock: the holder of (3) waits for no one
(eviction skips locked rows, LRU writes do not conflict with key-share locks, and only holders of
(3) insert, delete or update memo rows), and every other wait follows the order (1) -> (2) -> (3).
SQLite needs none of this: BEGIN IMMEDIATE locks the whole file, and its hooks do nothing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from lucid.access.ledger import ALL_CLIENTS, BudgetExceeded
from lucid.access.memo.backend import KEYS_PER_STATEMENT, SessionT, SqlBackend
from lucid.access.memo.budget import (
    client_refusal,
    draw_on,
    forget_seen,
    ledger_rows,
    record_answers,
    record_draws,
    record_refusal,
    total_refusal,
)
from lucid.access.memo.metadata import (
    MEMO_FORMAT,
    OLD_FORMATS,
    BoundsRecord,
    bind_bounds,
    bind_epsilon,
    check_fingerprint,
    new_meta,
    refuse_other_epsilon,
)
from lucid.access.memo.request import Batch, Charge, Proposals
from lucid.access.memo.turns import Turn, answer_in_turns
from lucid.errors import LucidError

DEFAULT_MEMO_SIZE = 1_000_000
_MAX_PENDING_TOUCHES = 10_000  # LRU updates of memo hits kept in memory (written sooner if an eviction needs them)
_TOUCHES_PER_WRITE = 128  # LRU updates written by one write once _MAX_PENDING_TOUCHES are pending


@runtime_checkable
class MemoStore(Protocol):
    """What the classifier needs of a memo (lucid/access/classifier.py): one stored answer per input,
    the ledger charged with it, and the epsilon and bounds the answers were given under."""

    max_size: int

    @property
    def name(self) -> str: ...

    @property
    def epsilon(self) -> float | None: ...

    def bind(
        self, epsilon: float, bounds: np.ndarray | BoundsRecord | None = None, fingerprint: str | None = None
    ) -> MemoStore: ...

    def get_or_put(
        self,
        keys: Sequence[bytes],
        proposals: Proposals,
        noised: np.ndarray | None = None,
        charge: Charge | None = None,
        turn: Turn | None = None,
    ) -> np.ndarray: ...

    def ledger_rows(self) -> list[tuple[str, float, int, int, int]]: ...

    def lookup(self, key: bytes) -> int | None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


class SqlMemo(SqlBackend[SessionT]):
    """A memo in an SQL database (module docstring); subclasses supply the backend hooks."""

    def __init__(self, max_size: int, name: str) -> None:
        super().__init__(max_size, name)
        self._pending_touches: dict[bytes, int] = {}  # LRU positions of memo hits not written yet

    def _init_meta(self, db: SessionT, fingerprint: str | None) -> None:
        """A new memo gets its meta rows; an existing one is checked, migrated and trimmed to max_size."""
        self._lock_memo(db)  # before reading meta: a replica binding at the same moment goes first
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        if not meta:
            new_meta(db, fingerprint)
            return
        if meta.get("format") in OLD_FORMATS:
            self._migrate(db, meta)
        elif meta.get("format") != MEMO_FORMAT:
            raise LucidError(f"{self._name} is not a {MEMO_FORMAT} memo")
        check_fingerprint(db, meta, fingerprint, self._name)
        self._evict(db, int(meta["count"]))

    def bind(
        self, epsilon: float, bounds: np.ndarray | BoundsRecord | None = None, fingerprint: str | None = None
    ) -> SqlMemo:
        """Tie this memo to the epsilon (and bounds, and N) it answers with, or refuse in one line:
        a stored draw keeps the epsilon it was drawn with, so serving it under another epsilon
        would charge clients the wrong amount (lucid/access/memo/metadata.py). Returns the memo."""
        with self._guard(), self._transaction() as db:
            self._lock_memo(db)
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            check_fingerprint(db, meta, fingerprint, self._name)
            bind_epsilon(db, meta.get("epsilon"), epsilon, self._name)
            if bounds is not None:
                bind_bounds(db, meta.get("bounds"), bounds, self._name)
        self._epsilon = float(epsilon)
        return self

    def _evict(self, db: SessionT, count: int, always_store: bool = False) -> int:
        """Drop the least recently used entries above max_size (under lock 3); returns the new count."""
        if count > self.max_size:
            gone = [
                row[0]
                for row in db.execute(
                    f"DELETE FROM memo WHERE key IN (SELECT key FROM memo ORDER BY used LIMIT ?{self._SKIP_LOCKED}) "  # noqa: S608 (the backend's fixed lock clause; values are bound)
                    "RETURNING key",
                    (count - self.max_size,),
                ).fetchall()
            ]
            forget_seen(db, gone)
            count -= len(gone)
            always_store = True
        if always_store:
            db.execute("UPDATE meta SET value = ? WHERE name = 'count'", (count,))
        return count

    def _select(
        self,
        db: SessionT,
        unique: Sequence[bytes],
        client: str | None,
        stop_at_miss: bool = False,
        lock: bool = False,
    ) -> tuple[dict[bytes, tuple[int, int]], set[bytes]]:
        """({key: (label, noised)} of the stored keys, the keys `client` has been answered). With
        `stop_at_miss`, only part of them once a key is missing (not stored, or not answered to
        `client`): the read-only fast path needs all or nothing, and a new batch is read once, not twice.
        With `lock`, each stored row read is held until commit (lock 2)."""
        stored: dict[bytes, tuple[int, int]] = {}
        seen: set[bytes] = set()
        for start in range(0, len(unique), KEYS_PER_STATEMENT):
            part = unique[start : start + KEYS_PER_STATEMENT]
            marks = ",".join("?" * len(part))
            rows = db.execute(
                "SELECT m.key, m.label, m.noised, s.client IS NOT NULL FROM memo m "  # noqa: S608 (placeholders and the backend's fixed lock clause; values are bound)
                f"LEFT JOIN seen s ON s.key = m.key AND s.client = ? WHERE m.key IN ({marks})"
                f"{self._ROW_LOCK if lock else ''}",
                (client or "", *part),
            ).fetchall()
            for key, label, noised, was_seen in rows:
                stored[key] = (label, noised)
                if was_seen:
                    seen.add(key)
            done = start + len(part)
            if stop_at_miss and (len(stored) < done or (client is not None and len(seen) < done)):
                break
        return stored, seen

    def get_or_put(
        self,
        keys: Sequence[bytes],
        proposals: Proposals,
        noised: np.ndarray | None = None,
        charge: Charge | None = None,
        turn: Turn | None = None,
    ) -> np.ndarray:
        """The stored label of each key; keys not stored yet get (and keep) their proposal.

        `proposals` is one label per key, or a function from the positions of the keys not
        stored yet to their proposals (so no noise is drawn for memo hits).
        Duplicate keys within one call share the first one's answer. Returns int64 labels.

        With a `charge` naming a client, the ledger is charged in the same transaction: its
        `epsilon` per distinct key this client has not been answered before, counted as noised
        where the stored entry is a draw (`noised`, one flag per key, default all, is stored with
        new keys; a stored answer keeps the flag it was stored with, as the client gets that stored
        answer). With a `budget`, a call whose new keys would take the client's worst-case charge
        (epsilon per distinct key, noised or not) above it stores nothing and raises BudgetExceeded;
        the decision therefore depends only on which inputs the client asked, never on which branch
        answered them. With a `total_budget`, a call whose keys not stored yet would take the
        all-clients row's charge (epsilon per memo draw given to a client) above it is refused the
        same way; that decision depends on which inputs anyone asked, never on the branch either.
        Without a `charge`, nothing is charged and the epsilon is 0.

        `turn(rows)`: a context to do each database step in (lucid serve's decision gate), so that
        other requests may go between the steps of a large call (lucid/access/memo/turns.py).
        """
        out = np.empty(len(keys), dtype=np.int64)
        if not len(keys):
            return out
        batch = Batch(keys, proposals, noised, Charge() if charge is None else charge)
        if self._epsilon is not None:  # draws of another epsilon are never given or charged here
            refuse_other_epsilon(self._epsilon, batch.charge.epsilon, self._name)
        if turn is None:
            self._answer(batch, None, out)
        else:
            answer_in_turns(self, self._answer, batch, turn, out)
        return out

    def _answer(self, batch: Batch, rid: str | None, out: np.ndarray) -> None:
        """One step of `get_or_put`: `out` filled for the batch's keys, read-only where it can be, else
        in one write transaction; `rid` the call's reservation (None: its budgets are checked here)."""
        keys, unique, client = batch.keys, batch.unique, batch.charge.client
        # LRU clock: wall-clock nanoseconds (+ position in the batch), so several processes
        # sharing one memo need no shared counter; skew only changes which old entry goes first.
        now = time.time_ns()
        refusal: str | None = None
        with self._guard(), self._lock, self._session() as db:
            # Fast path, no write transaction: a stored label never changes, so if every key is
            # already stored (and, with a client, already charged to it) the answer is final.
            # Their LRU positions are updated lazily, by a later write (losing them in a crash
            # only changes which entry is evicted first).
            stored, seen = self._select(db, unique, client, stop_at_miss=True)
            if len(stored) == len(unique) and (client is None or len(seen) == len(unique)):
                for i, key in enumerate(keys):
                    out[i] = stored[key][0]
                    self._pending_touches[key] = now + i
                if len(self._pending_touches) < _MAX_PENDING_TOUCHES:
                    return
            with self._begin(db):
                refusal = self._write(db, batch, rid, now, out)
        self._epsilon = batch.charge.epsilon  # committed: recorded in the database (or checked against it)
        if refusal:
            raise BudgetExceeded(refusal)

    def _write(self, db: SessionT, batch: Batch, rid: str | None, now: int, out: np.ndarray) -> str | None:
        """The transaction of `get_or_put`: fills `out`, or returns the refusal it recorded."""
        keys, unique, proposals, noised = batch.keys, batch.unique, batch.proposals, batch.noised
        client, epsilon = batch.charge.client, batch.charge.epsilon
        if client is not None:
            self._lock_client(db, client, epsilon)
        memo_locked = False
        if self._epsilon is None:  # the first write binds a memo opened without an epsilon
            memo_locked = True
            self._lock_memo(db)
            recorded = db.execute("SELECT value FROM meta WHERE name = 'epsilon'").fetchone()
            bind_epsilon(db, None if recorded is None else recorded[0], epsilon, self._name)
        stored, seen = self._select(db, unique, client, lock=True)  # again: another process may have written
        fresh = [] if client is None else [key for key in unique if key not in seen]
        # Checked and charged in this one transaction: exact across processes and replicas. A
        # reservation of the call's worst case (lock 1 held) already covers this step's charge.
        covered = client is not None and draw_on(db, rid, client, len(fresh))
        refusal = None if covered else client_refusal(db, client, epsilon, len(fresh), batch.charge.budget)
        missing = [key for key in unique if key not in stored]
        if refusal is None and missing and not memo_locked:
            memo_locked = True
            if self._lock_memo(db):  # drawn by another replica while this one waited: its draw stands
                stored.update(self._select(db, missing, None, lock=True)[0])
        draws = 0 if client is None else sum(key not in stored for key in unique)
        if refusal is None and not (draws and draw_on(db, rid, ALL_CLIENTS, draws)):  # lock 3 held if draws
            refusal = total_refusal(db, epsilon, draws, batch.charge.total_budget)
        if refusal:
            record_refusal(db, client, epsilon)
            return refusal
        if callable(proposals):
            positions = np.array([i for i, key in enumerate(keys) if key not in stored], dtype=np.int64)
            drawn = np.asarray(proposals(positions), dtype=np.int64)
            proposals = np.zeros(len(keys), dtype=np.int64)
            proposals[positions] = drawn
        proposals = np.asarray(proposals, dtype=np.int64)
        flags = np.ones(len(keys), dtype=np.int64) if noised is None else np.asarray(noised, dtype=np.int64)
        inserts = []
        for i, (key, proposal, flag) in enumerate(zip(keys, proposals.tolist(), flags.tolist(), strict=True)):
            entry = stored.get(key)
            if entry is None:
                entry = stored[key] = (int(proposal), int(flag))
                inserts.append((key, entry[0], now + i, entry[1]))
            else:
                self._pending_touches[key] = now + i
            out[i] = entry[0]
        # Read before the writes, so that they can go out together (`_batch`); inserts hold lock 3.
        count = int(db.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()[0]) if inserts else 0
        count += len(inserts)
        # The LRU positions of earlier hits: written once enough are pending, or when an
        # eviction needs them; not by every small write, which would pay for the hits
        # of every batch before it (a single-row request writing 10 000 of them).
        touch = bool(self._pending_touches) and (
            len(self._pending_touches) >= _MAX_PENDING_TOUCHES or count > self.max_size
        )
        if touch and not memo_locked:
            self._lock_memo(db)
        with self._batch(db):
            if inserts:
                db.executemany("INSERT INTO memo (key, label, used, noised) VALUES (?, ?, ?, ?)", inserts)
            if fresh:
                record_answers(db, client, epsilon, fresh, sum(stored[k][1] for k in fresh))
            if inserts and client is not None:
                record_draws(db, epsilon, len(inserts), sum(row[3] for row in inserts))
            if touch:  # an eviction needs them all; else the oldest few, so that no step writes 10 000
                self._write_touches(db, None if count > self.max_size else _TOUCHES_PER_WRITE)
            if inserts:
                self._evict(db, count, always_store=True)
        return None

    def _write_touches(self, db: SessionT, limit: int | None = None) -> None:
        """Write the pending LRU positions: all, or the `limit` oldest."""
        pending = self._pending_touches
        keys = list(pending if limit is None else itertools.islice(pending, limit))
        db.executemany("UPDATE memo SET used = ? WHERE key = ?", [(pending[k], k) for k in keys])
        for key in keys:
            del pending[key]

    def ledger_rows(self) -> list[tuple[str, float, int, int, int]]:
        """(client, epsilon, answers, noised, refused) rows of the ledger (see lucid.access.ledger)."""
        with self._guard(), self._lock, self._session() as db:
            return ledger_rows(db, self._name)

    def lookup(self, key: bytes) -> int | None:
        """The stored label of one key, without touching its LRU position (for inspection/tests)."""
        with self._guard(), self._lock, self._session() as db:
            row = db.execute("SELECT label FROM memo WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def __len__(self) -> int:
        with self._guard(), self._lock, self._session() as db:
            return int(db.execute("SELECT COUNT(*) FROM memo").fetchone()[0])

    def close(self) -> None:
        """Close the database, saving the LRU positions of recent hits first (best effort)."""
        if self._pending_touches:
            try:
                with self._transaction() as db:
                    self._lock_memo(db)
                    self._write_touches(db)
            except self._ERRORS:
                pass
        with self._lock:
            self._close_connection()
