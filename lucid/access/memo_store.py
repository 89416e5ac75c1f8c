"""The memo's logic, whatever database holds it: answers, the ledger charge and both budgets.

`SqlMemo` is the whole algorithm of a memo (lucid/access/memo.py says why a memo exists),
written once over a small backend interface; lucid/access/memo_sqlite.py (the embedded default,
one file) and lucid/access/memo_postgres.py (one database shared by several `lucid serve`
replicas) supply only what differs between the two databases:

    _session()            a connection for one call (SQLite: the one connection; PostgreSQL: the pool's)
    _begin(db)            one write transaction on it, committed before any label is returned
    _lock_client(db, ...) exclusive use of one client's ledger row until commit
    _lock_memo(db)        exclusive use of the memo-wide rows (draws, LRU, eviction, count, '*')
    _migrate(db, meta)    bring an older format up to date (SQLite files only)
    _failure(exc)         the database's exception as a one-line MemoError

and two SQL fragments (`_ROW_LOCK`, `_SKIP_LOCKED`). Every statement of the algorithm is shared,
written with `?` placeholders (the PostgreSQL session turns them into psycopg's `%s`).

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
import threading
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from lucid.access.ledger import ALL_CLIENTS, BudgetExceeded, ledger_of
from lucid.access.memo_budget import client_refusal, draw_on, total_refusal
from lucid.access.memo_turns import answer_in_turns
from lucid.access.memo_meta import (MEMO_FORMAT, BoundsRecord, OLD_FORMATS, bind_bounds, bind_epsilon,
                                    check_fingerprint, new_meta, refuse_other_epsilon)
from lucid.errors import LucidError

DEFAULT_MEMO_SIZE = 1_000_000
_CHUNK = 500  # keys per SELECT ... IN (...), well under SQLite's bound-parameter limit
_MAX_PENDING_TOUCHES = 10_000  # LRU updates of memo hits kept in memory (written sooner if an eviction needs them)
_TOUCHES_PER_WRITE = 128  # LRU updates written by one write once _MAX_PENDING_TOUCHES are pending

_LEDGER_ADD = """
INSERT INTO ledger (client, epsilon, answers, noised) VALUES (?, ?, ?, ?)
ON CONFLICT (client, epsilon) DO UPDATE SET answers = ledger.answers + excluded.answers,
    noised = ledger.noised + excluded.noised
"""
_LEDGER_REFUSED = """
INSERT INTO ledger (client, epsilon, refused) VALUES (?, ?, 1)
ON CONFLICT (client, epsilon) DO UPDATE SET refused = ledger.refused + 1
"""


class MemoError(LucidError):
    """The memo database failed while answering (disk full, locked too long, corrupt)."""


class MemoUnavailable(MemoError):
    """The memo database cannot be reached (refused, dropped or timed-out connections). Nothing was
    answered or charged; unlike other failures it says nothing about the request, so `lucid serve`
    answers 503 to this request only and tries the database again for the next one."""


class Session(Protocol):
    """A database connection as the shared statements use it (sqlite3.Connection is one)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...


@runtime_checkable
class MemoStore(Protocol):
    """What the classifier needs of a memo (lucid/access/classifier.py): one stored answer per input,
    the ledger charged with it, and the epsilon and bounds the answers were given under."""

    max_size: int

    @property
    def name(self) -> str: ...

    @property
    def epsilon(self) -> float | None: ...

    def bind(self, epsilon: float, bounds: np.ndarray | BoundsRecord | None = None,
             fingerprint: str | None = None) -> "MemoStore": ...

    def get_or_put(self, keys: Sequence[bytes], proposals: np.ndarray | Callable[[np.ndarray], np.ndarray],
                   noised: np.ndarray | None = None, client: str | None = None, epsilon: float = 0.0,
                   budget: float | None = None, total_budget: float | None = None) -> np.ndarray: ...

    def ledger_rows(self) -> list[tuple[str, float, int, int, int]]: ...

    def lookup(self, key: bytes) -> int | None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


class SqlMemo(ABC):
    """A memo in an SQL database (module docstring); subclasses supply the backend hooks."""

    # Appended to the transaction's reads of memo rows: a key-share lock on each row read (lock 2).
    _ROW_LOCK = ""
    # Appended to eviction's choice of rows: leave rows other transactions rely on (lock 2).
    _SKIP_LOCKED = ""
    # What the database raises; turned into a MemoError by `_failure`.
    _ERRORS: tuple[type[BaseException], ...] = ()

    def __init__(self, max_size: int, name: str) -> None:
        if int(max_size) < 1:
            raise LucidError(f"the memo size must be at least 1, got {max_size}")
        self.max_size = int(max_size)
        self._name = name
        self._epsilon: float | None = None
        # One call at a time per object: guards the pending LRU touches (and SQLite's one connection).
        # Other processes and machines are kept in step by the database's locks (module docstring).
        self._lock = threading.Lock()
        self._pending_touches: dict[bytes, int] = {}

    # -- the backend interface -------------------------------------------------------------------
    @abstractmethod
    def _session(self) -> ContextManager[Session]:
        """A connection for the duration of one call (the caller holds `self._lock`)."""

    @abstractmethod
    def _begin(self, db: Session) -> ContextManager[None]:
        """One write transaction on `db`: committed when the block ends, rolled back on an exception."""

    def _batch(self, db: Session) -> ContextManager[None]:
        """Statements whose results are not read until the block ends may be sent together (PostgreSQL:
        one round trip instead of one each, inside the memo-wide lock); SQLite runs them as they come."""
        return nullcontext()

    def _lock_client(self, db: Session, client: str | None, epsilon: float) -> None:
        """Hold the client's ledger row until commit (lock 1); nothing where the transaction holds the
        whole database."""

    def _lock_memo(self, db: Session) -> bool:
        """Hold the memo-wide rows until commit (lock 3). True if other writers may have drawn since this
        transaction's reads, which must then be read again; False where the transaction holds the
        whole database."""
        return False

    @abstractmethod
    def _migrate(self, db: Session, meta: dict[str, Any]) -> None:
        """Bring a memo of an older format (memo_meta.OLD_FORMATS) to the current one, or refuse it."""

    @abstractmethod
    def _failure(self, exc: BaseException) -> MemoError:
        """The database's exception as a MemoError (MemoUnavailable where the database is unreachable)."""

    def _close_connection(self) -> None:
        """Release the connection(s); called once, by `close`."""

    def reachable(self, timeout: float) -> bool:
        """Whether the database answers at all (`lucid serve`'s /healthz), within about `timeout`
        seconds. It never takes the memo's lock, so a probe does not queue behind a decision. An
        embedded file is always reachable (a failing one fails its predictions closed instead)."""
        return True

    # -- shared -------------------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self._lock, self._session() as db, self._begin(db):
            yield db

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Database errors as one-line MemoErrors (refusals, already LucidErrors, pass through)."""
        try:
            yield
        except self._ERRORS as exc:
            raise self._failure(exc) from None

    @property
    def name(self) -> str:
        """The memo as messages name it (a file path, or a database URL without its password)."""
        return self._name

    @property
    def epsilon(self) -> float | None:
        """The epsilon of this memo's draws once bound (None before its first binding or write)."""
        return self._epsilon

    def _init_meta(self, db: Session, fingerprint: str | None) -> None:
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

    def bind(self, epsilon: float, bounds: np.ndarray | BoundsRecord | None = None,
             fingerprint: str | None = None) -> "SqlMemo":
        """Tie this memo to the epsilon (and bounds, and N) it answers with, or refuse in one line:
        a stored draw keeps the epsilon it was drawn with, so serving it under another epsilon
        would charge clients the wrong amount (lucid/access/memo_meta.py). Returns the memo."""
        with self._guard(), self._transaction() as db:
            self._lock_memo(db)
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            check_fingerprint(db, meta, fingerprint, self._name)
            bind_epsilon(db, meta.get("epsilon"), epsilon, self._name)
            if bounds is not None:
                bind_bounds(db, meta.get("bounds"), bounds, self._name)
        self._epsilon = float(epsilon)
        return self

    def _evict(self, db: Session, count: int, always_store: bool = False) -> int:
        """Drop the least recently used entries above max_size (under lock 3); returns the new count."""
        if count > self.max_size:
            gone = [row[0] for row in db.execute(
                f"DELETE FROM memo WHERE key IN (SELECT key FROM memo ORDER BY used LIMIT ?{self._SKIP_LOCKED}) "
                "RETURNING key", (count - self.max_size,)).fetchall()]
            # An evicted input's next answer is a fresh draw, charged again: forget who saw it.
            for start in range(0, len(gone), _CHUNK):
                part = gone[start : start + _CHUNK]
                db.execute(f"DELETE FROM seen WHERE key IN ({','.join('?' * len(part))})", part)
            count -= len(gone)
            always_store = True
        if always_store:
            db.execute("UPDATE meta SET value = ? WHERE name = 'count'", (count,))
        return count

    def _select(
        self, db: Session, unique: Sequence[bytes], client: str | None, stop_at_miss: bool = False,
        lock: bool = False,
    ) -> tuple[dict[bytes, tuple[int, int]], set[bytes]]:
        """({key: (label, noised)} of the stored keys, the keys `client` has been answered). With
        `stop_at_miss`, only part of them once a key is missing (not stored, or not answered to
        `client`): the read-only fast path needs all or nothing, and a new batch is read once, not twice.
        With `lock`, each stored row read is held until commit (lock 2)."""
        stored: dict[bytes, tuple[int, int]] = {}
        seen: set[bytes] = set()
        for start in range(0, len(unique), _CHUNK):
            part = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            rows = db.execute(
                "SELECT m.key, m.label, m.noised, s.client IS NOT NULL FROM memo m "
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
        proposals: np.ndarray | Callable[[np.ndarray], np.ndarray],
        noised: np.ndarray | None = None,
        client: str | None = None,
        epsilon: float = 0.0,
        budget: float | None = None,
        total_budget: float | None = None,
        turn: Callable[[int], ContextManager[Any]] | None = None,
    ) -> np.ndarray:
        """The stored label of each key; keys not stored yet get (and keep) their proposal.

        `proposals` is one label per key, or a function from the positions of the keys not
        stored yet to their proposals (so no noise is drawn for memo hits).
        Duplicate keys within one call share the first one's answer. Returns int64 labels.

        With a `client`, the ledger is charged in the same transaction: `epsilon` per distinct
        key this client has not been answered before, counted as noised where the stored entry
        is a draw (`noised`, one flag per key, default all, is stored with new keys; a stored
        answer keeps the flag it was stored with, as the client gets that stored answer). With a `budget`, a call whose
        new keys would take the client's worst-case charge (epsilon per distinct key, noised or
        not) above it stores nothing and raises BudgetExceeded; the decision therefore depends
        only on which inputs the client asked, never on which branch answered them. With a
        `total_budget`, a call whose keys not stored yet would take the all-clients row's charge
        (epsilon per memo draw given to a client) above it is refused the same way; that decision
        depends on which inputs anyone asked, never on the branch either.

        `turn(rows)`: a context to do each database step in (lucid serve's decision gate), so that
        other requests may go between the steps of a large call (lucid/access/memo_turns.py).
        """
        out = np.empty(len(keys), dtype=np.int64)
        if not len(keys):
            return out
        epsilon = float(epsilon)
        if self._epsilon is not None:  # draws of another epsilon are never given or charged here
            refuse_other_epsilon(self._epsilon, epsilon, self._name)
        unique = list(dict.fromkeys(keys))
        request = (proposals, noised, client, epsilon, budget, total_budget)
        if turn is None:
            self._answer(keys, unique, *request, None, out)
        else:
            answer_in_turns(self, keys, unique, *request, turn, out)
        return out

    def _answer(self, keys: Sequence[bytes], unique: list[bytes],
                proposals: np.ndarray | Callable[[np.ndarray], np.ndarray], noised: np.ndarray | None,
                client: str | None, epsilon: float, budget: float | None, total_budget: float | None,
                rid: str | None, out: np.ndarray) -> None:
        """One step of `get_or_put`: `out` filled for `keys`, read-only where it can be, else in one
        write transaction; `rid` the call's reservation (None: its budgets are checked here)."""
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
                refusal = self._write(db, keys, unique, proposals, noised, client, epsilon, budget, total_budget,
                                      rid, now, out)
        self._epsilon = epsilon  # committed: recorded in the database (or checked against it)
        if refusal:
            raise BudgetExceeded(refusal)

    def _write(self, db: Session, keys: Sequence[bytes], unique: list[bytes],
               proposals: np.ndarray | Callable[[np.ndarray], np.ndarray], noised: np.ndarray | None,
               client: str | None, epsilon: float, budget: float | None, total_budget: float | None,
               rid: str | None, now: int, out: np.ndarray) -> str | None:
        """The transaction of `get_or_put`: fills `out`, or returns the refusal it recorded."""
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
        refusal = None if covered else client_refusal(db, client, epsilon, len(fresh), budget)
        missing = [key for key in unique if key not in stored]
        if refusal is None and missing and not memo_locked:
            memo_locked = True
            if self._lock_memo(db):  # drawn by another replica while this one waited: its draw stands
                stored.update(self._select(db, missing, None, lock=True)[0])
        draws = 0 if client is None else sum(key not in stored for key in unique)
        if refusal is None and not (draws and draw_on(db, rid, ALL_CLIENTS, draws)):  # lock 3 held if draws
            refusal = total_refusal(db, epsilon, draws, total_budget)
        if refusal:
            db.execute(_LEDGER_REFUSED, (client, epsilon))
            return refusal
        if callable(proposals):
            positions = np.array([i for i, key in enumerate(keys) if key not in stored], dtype=np.int64)
            drawn = np.asarray(proposals(positions), dtype=np.int64)
            proposals = np.zeros(len(keys), dtype=np.int64)
            proposals[positions] = drawn
        proposals = np.asarray(proposals, dtype=np.int64)
        flags = np.ones(len(keys), dtype=np.int64) if noised is None else np.asarray(noised, dtype=np.int64)
        inserts = []
        for i, (key, proposal, flag) in enumerate(zip(keys, proposals.tolist(), flags.tolist())):
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
        touch = bool(self._pending_touches) and (len(self._pending_touches) >= _MAX_PENDING_TOUCHES
                                                 or count > self.max_size)
        if touch and not memo_locked:
            self._lock_memo(db)
        with self._batch(db):
            if inserts:
                db.executemany("INSERT INTO memo (key, label, used, noised) VALUES (?, ?, ?, ?)", inserts)
            if fresh:
                db.executemany("INSERT INTO seen (key, client) VALUES (?, ?)", [(k, client) for k in fresh])
                db.execute(_LEDGER_ADD, (client, epsilon, len(fresh), sum(stored[k][1] for k in fresh)))
            if inserts and client is not None:
                db.execute(_LEDGER_ADD, (ALL_CLIENTS, epsilon, len(inserts), sum(row[3] for row in inserts)))
            if touch:  # an eviction needs them all; else the oldest few, so that no step writes 10 000
                self._write_touches(db, None if count > self.max_size else _TOUCHES_PER_WRITE)
            if inserts:
                self._evict(db, count, always_store=True)
        return None

    def _write_touches(self, db: Session, limit: int | None = None) -> None:
        """Write the pending LRU positions: all, or the `limit` oldest."""
        pending = self._pending_touches
        keys = list(pending if limit is None else itertools.islice(pending, limit))
        db.executemany("UPDATE memo SET used = ? WHERE key = ?", [(pending[k], k) for k in keys])
        for key in keys:
            del pending[key]

    def ledger_rows(self) -> list[tuple[str, float, int, int, int]]:
        """(client, epsilon, answers, noised, refused) rows of the ledger (see lucid.access.ledger)."""
        with self._guard(), self._lock, self._session() as db:
            return ledger_of(db, self._name)

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
