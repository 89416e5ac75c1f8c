"""The memo in one SQLite file: the embedded default of `lucid serve` (RUN/memo.sqlite).

The algorithm is lucid/access/memo/store.py's; this module is the SQLite backend of it
(lucid/access/memo/backend.py).

Crash safety: each call (each turn of a large batch, lucid/access/memo/turns.py) is one SQLite
transaction in WAL mode, committed before any label of the batch is returned; with
`synchronous=NORMAL` a committed transaction survives a killed process (not necessarily a power
cut; pass `durable=True` for an fsync per commit).
Concurrency: `BEGIN IMMEDIATE` takes the file's one write lock, which serialises writers across
processes (so the row locks of the shared algorithm are not needed here: its hooks do nothing),
and the memo's lock serialises the threads of one process (they share one connection). A batch
reads the stored labels and inserts the missing ones in the same transaction, so two racing
queries for one input both get the first stored draw.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from lucid.access.memo.backend import MemoError
from lucid.access.memo.budget import ledger_rows
from lucid.access.memo.metadata import BoundsRecord, migrate
from lucid.access.memo.store import DEFAULT_MEMO_SIZE, SqlMemo
from lucid.errors import LucidError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

# memo: one stored answer per input; noised: 1 if it was drawn by the mechanism.
# seen: which client has already been answered (and charged for) which input; a row goes when
#   its memo entry is evicted, because the input's next answer is then a fresh draw.
# ledger: per client and epsilon, distinct inputs answered, noised ones among them, refused
#   requests; client '*' counts the memo's own draws (what all clients together received).
# reserved: the worst-case charge of large batches being answered in turns (lucid/access/memo/budget.py).
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
CREATE TABLE IF NOT EXISTS reserved (id TEXT NOT NULL, client TEXT NOT NULL, epsilon REAL NOT NULL,
    inputs INTEGER NOT NULL, expires REAL NOT NULL, PRIMARY KEY (id, client));
"""


CHECKPOINT_EVERY_S = 0.5


class WriterLock:
    """The writers of one memo file, across processes, queued on a blocking lock (flock on
    FILE-writers.lock) before they ask SQLite for its write lock. SQLite's own wait for a busy lock
    polls with sleeps of 1, 2, 5, 10 ... ms, so with `lucid serve --workers 2` each process slept
    through most of the other's short write transactions and two workers answered fewer new inputs
    per second than one (benchmarks/results/serve_load.md); a process waiting here wakes as soon as
    the lock is free. The lock goes with its process, so a killed worker never holds it. Only where
    flock exists (POSIX) and for a file; otherwise SQLite's wait alone."""

    def __init__(self, path: Path | None) -> None:
        self._fd: int | None = None
        if path is not None and fcntl is not None:
            try:
                self._fd = os.open(f"{path}-writers.lock", os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                self._fd = None  # a read-only directory: SQLite's own wait still serialises the writers

    def __enter__(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Checkpointer:
    """Copies the write-ahead log into the database file from a thread of its own, every
    CHECKPOINT_EVERY_S. SQLite would otherwise do it inside the commit that fills the log
    (`wal_autocheckpoint`): that commit, a single row's as likely as a batch's, then takes tens of
    milliseconds longer, and every request queued behind it waits. PASSIVE checkpoints never wait
    for readers or writers (nor block them); a crash loses nothing, since committed pages stay in the
    log until copied."""

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA wal_autocheckpoint=0")
        self._path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lucid-memo-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = None
        try:
            db = sqlite3.connect(str(self._path), isolation_level=None, check_same_thread=False, timeout=1.0)
            while not self._stop.wait(CHECKPOINT_EVERY_S):
                # busy (another process checkpoints): the next one catches up
                with contextlib.suppress(sqlite3.OperationalError):
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:  # e.g. the file was removed: the serving connection reports that itself
            pass
        finally:
            if db is not None:
                db.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


class SqliteMemo(SqlMemo[sqlite3.Connection]):
    """`SqliteMemo(path)`; `path=None` keeps it in memory (lost on exit: fine for evaluation only)."""

    _ERRORS = (sqlite3.DatabaseError,)

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
        self.path = None if path is None else Path(path)
        super().__init__(max_size, "in memory" if self.path is None else str(self.path))
        target = ":memory:" if self.path is None else str(self.path)
        if self.path is not None and not self.path.parent.is_dir():
            raise LucidError(f"cannot create the memo {self.path}: {self.path.parent} is not a directory")
        self._writers = WriterLock(self.path)
        try:
            self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False, timeout=30.0)
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._checkpoints = None if self.path is None else Checkpointer(self.path, self._db)
            self._db.executescript(_SCHEMA)
            with self._transaction() as db:
                self._init_meta(db, fingerprint)
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
        self._writers.close()
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is not None:
            checkpoints.stop()
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()

    @contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        yield self._db

    @contextmanager
    def _begin(self, db: sqlite3.Connection) -> Iterator[None]:
        with self._writers:
            db.execute("BEGIN IMMEDIATE")  # the file's write lock, at once: no upgrade from a read lock can fail
            try:
                yield
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _migrate(self, db: sqlite3.Connection, meta: dict[str, Any]) -> None:
        migrate(db, meta)

    def _failure(self, exc: BaseException) -> MemoError:
        return MemoError(f"the memo database failed: {exc}")

    def _close_connection(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()
        self._db.close()
        self._writers.close()


def read_ledger(path: str | Path, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows of a memo file, read-only (the service may be running). With the
    `fingerprint` of a run's N, a memo written for another model is refused. (A PostgreSQL memo:
    lucid.access.memo.read_memo_ledger.)"""
    path = Path(path)
    if not path.is_file():
        raise LucidError(f"{path} does not exist: no memo, so no answers have been given with it (or pass --memo)")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
        try:
            return ledger_rows(db, str(path), fingerprint)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise LucidError(f"cannot read the ledger in {path}: {exc}") from None
