"""The memo of answers: a bounded LRU map input -> label, persisted in SQLite, and the ledger.

Why it exists: a noised label is a random draw. If an attacker could ask the same question
twice and get fresh draws, averaging them would reveal N's label and void the iDP guarantee.
So the first draw for an input is stored and every later query for that input gets the same
answer - also after a restart or a crash (hence a database file, not a dict).

Released answers (N's own label) are stored too, with `noised = 0`: the classifier gives both
branches the same memo read and write, so neither the time of an answer nor whether it is a
memo hit depends on the branch (see lucid/access/classifier.py).

The privacy ledger (lucid/access/ledger.py) lives in the same file and is updated in the same
transaction as the answers it accounts for, so a crash or a concurrent writer can neither lose
nor double-count an entry.

Crash safety: each batch is one SQLite transaction in WAL mode, committed before any label
of the batch is returned; with `synchronous=NORMAL` a committed transaction survives a killed
process (not necessarily a power cut; pass `durable=True` for an fsync per commit).
Concurrency: `BEGIN IMMEDIATE` serialises writers across processes, a lock serialises the
threads of one process, and a batch reads the stored labels and inserts the missing ones in
the same transaction, so two racing queries for one input both get the first stored draw.

One epsilon per file: every stored draw was made with the epsilon the file records, and a memo
refuses to answer or charge with another one (lucid/access/memo_meta.py), so a client is always
charged the epsilon its answers were drawn with.

Bounded: LRU eviction (the paper's policy) once more than `max_size` inputs are stored; an
evicted input can be re-sampled, which is the price of bounded storage.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lucid.access.ledger import ALL_CLIENTS, BudgetExceeded, within_budget
from lucid.access.memo_meta import (MEMO_FORMAT, BoundsRecord, OLD_FORMATS, bind_bounds, bind_epsilon, check_fingerprint, migrate,
                                    new_meta, refuse_other_epsilon)
from lucid.errors import LucidError

DEFAULT_MEMO_SIZE = 1_000_000
MEMO_FILE = "memo.sqlite"  # RUN/memo.sqlite: lucid serve's answers and ledger by default
_CHUNK = 500  # keys per SELECT ... IN (...), well under SQLite's bound-parameter limit
_MAX_PENDING_TOUCHES = 10_000  # LRU updates of memo hits kept in memory (written sooner if an eviction needs them)

# memo: one stored answer per input; noised: 1 if it was drawn by the mechanism.
# seen: which client has already been answered (and charged for) which input; a row goes when
#   its memo entry is evicted, because the input's next answer is then a fresh draw.
# ledger: per client and epsilon, distinct inputs answered, noised ones among them, refused
#   requests; client '*' counts the memo's own draws (what all clients together received).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, label INTEGER NOT NULL, used INTEGER NOT NULL,
    noised INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memo_used ON memo (used);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS seen (key BLOB NOT NULL, client TEXT NOT NULL, PRIMARY KEY (key, client))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger (client TEXT NOT NULL, epsilon REAL NOT NULL,
    answers INTEGER NOT NULL DEFAULT 0, noised INTEGER NOT NULL DEFAULT 0, refused INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client, epsilon));
"""
_LEDGER_ADD = """
INSERT INTO ledger (client, epsilon, answers, noised) VALUES (?, ?, ?, ?)
ON CONFLICT (client, epsilon) DO UPDATE SET answers = answers + excluded.answers, noised = noised + excluded.noised
"""
_LEDGER_REFUSED = """
INSERT INTO ledger (client, epsilon, refused) VALUES (?, ?, 1)
ON CONFLICT (client, epsilon) DO UPDATE SET refused = refused + 1
"""


def _charged(db: sqlite3.Connection, client: str) -> float:
    """A ledger row's worst-case charge: epsilon per distinct answer, released or noised."""
    row = db.execute("SELECT COALESCE(SUM(epsilon * answers), 0.0) FROM ledger WHERE client = ?", (client,))
    return float(row.fetchone()[0])


def _refusal(db: sqlite3.Connection, client: str | None, epsilon: float, fresh: int, budget: float | None,
             draws: int, total_budget: float | None) -> str | None:
    """The fixed message refusing a call whose `fresh` keys (new to this client) would exceed its
    budget, or whose `draws` (keys new to the memo) would exceed the all-clients total; None if
    it fits. Both count epsilon per key, never whether it is noised: the branch stays hidden."""
    if budget is not None and fresh and not within_budget(_charged(db, client) + epsilon * fresh, budget):
        return (f"the privacy budget of {budget:g} is spent for this client: only inputs it was answered "
                "before are answered now")
    if total_budget is not None and draws and not within_budget(
            _charged(db, ALL_CLIENTS) + epsilon * draws, total_budget):
        return (f"the total privacy budget of {total_budget:g} of this service is spent: only inputs "
                "answered before are answered now")
    return None


class MemoError(LucidError):
    """The memo database failed while answering (disk full, locked too long, corrupt)."""


class Memo:
    """`Memo(path)`; `path=None` keeps it in memory (lost on exit: fine for evaluation only)."""

    def __init__(
        self,
        path: str | Path | None = None,
        max_size: int = DEFAULT_MEMO_SIZE,
        fingerprint: str | None = None,
        durable: bool = False,
        epsilon: float | None = None,
        bounds: np.ndarray | BoundsRecord | None = None,
    ) -> None:
        """`epsilon` (and `bounds`): bind the file to them at once, refusing a file recorded with
        others (see `bind`); without, the first answer written binds it to its epsilon."""
        if int(max_size) < 1:
            raise LucidError(f"the memo size must be at least 1, got {max_size}")
        self.max_size = int(max_size)
        self.path = None if path is None else Path(path)
        self._name = "in memory" if self.path is None else str(self.path)
        self._epsilon: float | None = None
        self._lock = threading.Lock()
        self._pending_touches: dict[bytes, int] = {}
        target = ":memory:" if self.path is None else str(self.path)
        if self.path is not None and not self.path.parent.is_dir():
            raise LucidError(f"cannot create the memo {self.path}: {self.path.parent} is not a directory")
        try:
            self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False, timeout=30.0)
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
            self._init_meta(fingerprint)
            if epsilon is not None:
                self.bind(epsilon, bounds)
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise LucidError(f"cannot use {target} as a memo: {exc}") from None
        except LucidError:
            self._close_quietly()
            raise

    def _close_quietly(self) -> None:
        """Close a connection that failed to open as a memo (a refused file is not kept open)."""
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()

    def _init_meta(self, fingerprint: str | None) -> None:
        with self._transaction() as db:
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if not meta:
                new_meta(db, fingerprint)
                return
            if meta.get("format") in OLD_FORMATS:
                migrate(db, meta)
            elif meta.get("format") != MEMO_FORMAT:
                raise LucidError(f"{self.path} is not a {MEMO_FORMAT} memo file")
            check_fingerprint(db, meta, fingerprint, self._name)
            self._evict(db, int(meta["count"]))

    def bind(self, epsilon: float, bounds: np.ndarray | BoundsRecord | None = None, fingerprint: str | None = None) -> "Memo":
        """Tie this memo to the epsilon (and bounds, and N) it answers with, or refuse in one line:
        a stored draw keeps the epsilon it was drawn with, so serving it under another epsilon
        would charge clients the wrong amount (lucid/access/memo_meta.py). Returns the memo."""
        with self._transaction() as db:
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            check_fingerprint(db, meta, fingerprint, self._name)
            bind_epsilon(db, meta.get("epsilon"), epsilon, self._name)
            if bounds is not None:
                bind_bounds(db, meta.get("bounds"), bounds, self._name)
        self._epsilon = float(epsilon)
        return self

    @property
    def epsilon(self) -> float | None:
        """The epsilon of this memo's draws once bound (None before its first binding or write)."""
        return self._epsilon

    class _Txn:
        def __init__(self, memo: "Memo") -> None:
            self.memo = memo

        def __enter__(self) -> sqlite3.Connection:
            self.memo._lock.acquire()
            try:
                self.memo._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.memo._lock.release()
                raise
            return self.memo._db

        def __exit__(self, exc_type, exc, tb) -> None:
            try:
                self.memo._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.memo._lock.release()

    def _transaction(self) -> "Memo._Txn":
        return Memo._Txn(self)

    def _evict(self, db: sqlite3.Connection, count: int, always_store: bool = False) -> int:
        if count <= self.max_size:
            if always_store:
                db.execute("UPDATE meta SET value = ? WHERE name = 'count'", (count,))
        else:
            # An evicted input's next answer is a fresh draw, charged again: forget who saw it.
            db.execute(
                "DELETE FROM seen WHERE key IN (SELECT key FROM memo ORDER BY used LIMIT ?)",
                (count - self.max_size,),
            )
            db.execute(
                "DELETE FROM memo WHERE key IN (SELECT key FROM memo ORDER BY used LIMIT ?)",
                (count - self.max_size,),
            )
            count = self.max_size
            db.execute("UPDATE meta SET value = ? WHERE name = 'count'", (count,))
        return count

    def _select(
        self, db: sqlite3.Connection, unique: Sequence[bytes], client: str | None, stop_at_miss: bool = False
    ) -> tuple[dict[bytes, tuple[int, int]], set[bytes]]:
        """({key: (label, noised)} of the stored keys, the keys `client` has been answered). With
        `stop_at_miss`, only part of them once a key is missing (not stored, or not answered to
        `client`): the read-only fast path needs all or nothing, and a new batch is read once, not twice."""
        stored: dict[bytes, tuple[int, int]] = {}
        seen: set[bytes] = set()
        for start in range(0, len(unique), _CHUNK):
            part = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            rows = db.execute(
                "SELECT m.key, m.label, m.noised, s.client IS NOT NULL FROM memo m "
                f"LEFT JOIN seen s ON s.key = m.key AND s.client = ? WHERE m.key IN ({marks})",
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
        """
        out = np.empty(len(keys), dtype=np.int64)
        if not len(keys):
            return out
        epsilon = float(epsilon)
        if self._epsilon is not None:  # draws of another epsilon are never given or charged here
            refuse_other_epsilon(self._epsilon, epsilon, self._name)
        unique = list(dict.fromkeys(keys))
        # LRU clock: wall-clock nanoseconds (+ position in the batch), so several processes
        # sharing one file need no shared counter; skew only changes which old entry goes first.
        now = time.time_ns()
        refusal: str | None = None
        try:
            # Fast path, no write transaction: a stored label never changes, so if every key is
            # already stored (and, with a client, already charged to it) the answer is final.
            # Their LRU positions are updated lazily, by a later write (losing them in a crash
            # only changes which entry is evicted first).
            with self._lock:
                stored, seen = self._select(self._db, unique, client, stop_at_miss=True)
                if len(stored) == len(unique) and (client is None or len(seen) == len(unique)):
                    for i, key in enumerate(keys):
                        out[i] = stored[key][0]
                        self._pending_touches[key] = now + i
                    if len(self._pending_touches) < _MAX_PENDING_TOUCHES:
                        return out
            with self._transaction() as db:
                if self._epsilon is None:  # the first write binds a memo opened without an epsilon
                    recorded = db.execute("SELECT value FROM meta WHERE name = 'epsilon'").fetchone()
                    bind_epsilon(db, None if recorded is None else recorded[0], epsilon, self._name)
                stored, seen = self._select(db, unique, client)  # again: another process may have written
                fresh = [] if client is None else [key for key in unique if key not in seen]
                draws = 0 if client is None else sum(key not in stored for key in unique)
                # Checked and charged in this one transaction: exact across processes.
                refusal = _refusal(db, client, epsilon, len(fresh), budget, draws, total_budget)
                if refusal:
                    db.execute(_LEDGER_REFUSED, (client, epsilon))
                else:
                    if callable(proposals):
                        missing = np.array([i for i, key in enumerate(keys) if key not in stored], dtype=np.int64)
                        drawn = np.asarray(proposals(missing), dtype=np.int64)
                        proposals = np.zeros(len(keys), dtype=np.int64)
                        proposals[missing] = drawn
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
                    if inserts:
                        db.executemany("INSERT INTO memo (key, label, used, noised) VALUES (?, ?, ?, ?)", inserts)
                    if fresh:
                        db.executemany("INSERT INTO seen (key, client) VALUES (?, ?)", [(k, client) for k in fresh])
                        db.execute(_LEDGER_ADD, (client, epsilon, len(fresh),
                                                 sum(stored[k][1] for k in fresh)))
                    if inserts and client is not None:
                        db.execute(_LEDGER_ADD, (ALL_CLIENTS, epsilon, len(inserts),
                                                 sum(row[3] for row in inserts)))
                    count = 0
                    if inserts:
                        count = int(db.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()[0])
                        count += len(inserts)
                    # The LRU positions of earlier hits: written once enough are pending, or when an
                    # eviction needs them; not by every small write, which would pay for the hits
                    # of every batch before it (a single-row request writing 10 000 of them).
                    if self._pending_touches and (len(self._pending_touches) >= _MAX_PENDING_TOUCHES
                                                  or count > self.max_size):
                        db.executemany("UPDATE memo SET used = ? WHERE key = ?",
                                       [(t, k) for k, t in self._pending_touches.items()])
                        self._pending_touches.clear()
                    if inserts:
                        self._evict(db, count, always_store=True)
            self._epsilon = epsilon  # committed: recorded in the file (or checked against it)
        except sqlite3.DatabaseError as exc:
            raise MemoError(f"the memo database failed: {exc}") from None
        if refusal:
            raise BudgetExceeded(refusal)
        return out

    def ledger_rows(self) -> list[tuple[str, float, int, int, int]]:
        """(client, epsilon, answers, noised, refused) rows of the ledger (see lucid.access.ledger)."""
        with self._lock:
            return [tuple(r) for r in self._db.execute(
                "SELECT client, epsilon, answers, noised, refused FROM ledger ORDER BY client, epsilon")]

    def lookup(self, key: bytes) -> int | None:
        """The stored label of one key, without touching its LRU position (for inspection/tests)."""
        with self._lock:
            row = self._db.execute("SELECT label FROM memo WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM memo").fetchone()[0])

    def close(self) -> None:
        """Close the database, saving the LRU positions of recent hits first (best effort)."""
        if self._pending_touches:
            try:
                with self._transaction() as db:
                    db.executemany("UPDATE memo SET used = ? WHERE key = ?",
                                   [(t, k) for k, t in self._pending_touches.items()])
                    self._pending_touches.clear()
            except sqlite3.DatabaseError:
                pass
        with self._lock:
            self._db.close()
