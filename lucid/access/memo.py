"""The memo of noised answers: a bounded LRU map input -> label, persisted in SQLite.

Why it exists: a noised label is a random draw. If an attacker could ask the same question
twice and get fresh draws, averaging them would reveal N's label and void the iDP guarantee.
So the first draw for an input is stored and every later query for that input gets the same
answer - also after a restart or a crash (hence a database file, not a dict).

Crash safety: each batch is one SQLite transaction in WAL mode, committed before any label
of the batch is returned; with `synchronous=NORMAL` a committed transaction survives a killed
process (not necessarily a power cut; pass `durable=True` for an fsync per commit).
Concurrency: `BEGIN IMMEDIATE` serialises writers across processes, a lock serialises the
threads of one process, and a batch reads the stored labels and inserts the missing ones in
the same transaction, so two racing queries for one input both get the first stored draw.

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

from lucid.errors import LucidError

MEMO_FORMAT = "lucid-memo/1"
DEFAULT_MEMO_SIZE = 1_000_000
_CHUNK = 500  # keys per SELECT ... IN (...), well under SQLite's bound-parameter limit
_MAX_PENDING_TOUCHES = 10_000  # LRU updates of memo hits kept in memory before a write

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, label INTEGER NOT NULL, used INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memo_used ON memo (used);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value);
"""


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
    ) -> None:
        if int(max_size) < 1:
            raise LucidError(f"the memo size must be at least 1, got {max_size}")
        self.max_size = int(max_size)
        self.path = None if path is None else Path(path)
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
        except sqlite3.DatabaseError as exc:
            raise LucidError(f"cannot use {target} as a memo: {exc}") from None

    def _init_meta(self, fingerprint: str | None) -> None:
        with self._transaction() as db:
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if not meta:
                db.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?)",
                    [("format", MEMO_FORMAT), ("fingerprint", fingerprint or ""), ("count", 0)],
                )
                return
            if meta.get("format") != MEMO_FORMAT:
                raise LucidError(f"{self.path} is not a {MEMO_FORMAT} memo file")
            stored = meta.get("fingerprint") or ""
            if fingerprint and stored and stored != fingerprint:
                # Answers stored for another model are not draws around this model's labels.
                raise LucidError(f"the memo {self.path} belongs to a different model or run; use another --memo file")
            if fingerprint and not stored:
                db.execute("UPDATE meta SET value = ? WHERE name = 'fingerprint'", (fingerprint,))
            self._evict(db, int(meta["count"]))

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
            db.execute(
                "DELETE FROM memo WHERE key IN (SELECT key FROM memo ORDER BY used LIMIT ?)",
                (count - self.max_size,),
            )
            count = self.max_size
            db.execute("UPDATE meta SET value = ? WHERE name = 'count'", (count,))
        return count

    def _select(self, db: sqlite3.Connection, keys: Sequence[bytes]) -> dict[bytes, int]:
        stored: dict[bytes, int] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _CHUNK):
            part = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            stored.update(db.execute(f"SELECT key, label FROM memo WHERE key IN ({marks})", part).fetchall())
        return stored

    def get_or_put(
        self, keys: Sequence[bytes], proposals: np.ndarray | Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """The stored label of each key; keys not stored yet get (and keep) their proposal.

        `proposals` is one label per key, or a function from the positions of the keys not
        stored yet to their proposals (so no noise is drawn for memo hits).
        Duplicate keys within one call share the first one's answer. Returns int64 labels.
        """
        out = np.empty(len(keys), dtype=np.int64)
        if not len(keys):
            return out
        # LRU clock: wall-clock nanoseconds (+ position in the batch), so several processes
        # sharing one file need no shared counter; skew only changes which old entry goes first.
        now = time.time_ns()
        try:
            # Fast path, no write transaction: a stored label never changes, so if every key is
            # already stored the answer is final. Their LRU positions are updated lazily, with the
            # next write (losing them in a crash only changes which entry is evicted first).
            with self._lock:
                stored = self._select(self._db, keys)
                if len(stored) == len(set(keys)):
                    for i, key in enumerate(keys):
                        out[i] = stored[key]
                        self._pending_touches[key] = now + i
                    if len(self._pending_touches) < _MAX_PENDING_TOUCHES:
                        return out
            with self._transaction() as db:
                stored = self._select(db, keys)  # again: another process may have written since
                if callable(proposals):
                    missing = np.array([i for i, key in enumerate(keys) if key not in stored], dtype=np.int64)
                    drawn = np.asarray(proposals(missing), dtype=np.int64)
                    proposals = np.zeros(len(keys), dtype=np.int64)
                    proposals[missing] = drawn
                inserts = []
                for i, (key, proposal) in enumerate(zip(keys, proposals)):
                    label = stored.get(key)
                    if label is None:
                        label = int(proposal)
                        stored[key] = label
                        inserts.append((key, label, now + i))
                    else:
                        self._pending_touches[key] = now + i
                    out[i] = label
                if inserts:
                    db.executemany("INSERT INTO memo (key, label, used) VALUES (?, ?, ?)", inserts)
                if self._pending_touches:
                    db.executemany("UPDATE memo SET used = ? WHERE key = ?",
                                   [(t, k) for k, t in self._pending_touches.items()])
                    self._pending_touches.clear()
                if inserts:
                    count = int(db.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()[0])
                    self._evict(db, count + len(inserts), always_store=True)
        except sqlite3.DatabaseError as exc:
            raise MemoError(f"the memo database failed: {exc}") from None
        return out

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
