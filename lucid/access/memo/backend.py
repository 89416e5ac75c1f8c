"""What a database must supply to hold a memo, and the errors it turns its own into.

The memo's algorithm (lucid/access/memo/store.py) is written once, over this small interface;
lucid/access/memo/sqlite.py (the embedded default, one file) and lucid/access/memo/postgres.py
(one database shared by several `lucid serve` replicas) supply only what differs between the two:

    _session()            a connection for one call (SQLite: the one connection; PostgreSQL: the pool's)
    _begin(db)            one write transaction on it, committed before any label is returned
    _lock_client(db, ...) exclusive use of one client's ledger row until commit
    _lock_memo(db)        exclusive use of the memo-wide rows (draws, LRU, eviction, count, '*')
    _migrate(db, meta)    bring an older format up to date (SQLite files only)
    _failure(exc)         the database's exception as a one-line MemoError

and two SQL fragments (`_ROW_LOCK`, `_SKIP_LOCKED`). Every statement of the algorithm is shared,
written with `?` placeholders (the PostgreSQL session turns them into psycopg's `%s`). The order in
which the algorithm takes the locks, and why it is free of deadlocks, is in store.py.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

from lucid.errors import LucidError

KEYS_PER_STATEMENT = 500  # keys per `... IN (?, ...)` statement, well under SQLite's bound-parameter limit


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


SessionT = TypeVar("SessionT", bound=Session)  # a backend's own connection type


class SqlBackend(ABC, Generic[SessionT]):
    """A memo's database (module docstring): the hooks a backend overrides, and the connection,
    transaction and error handling every call of the algorithm goes through."""

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
        # One call at a time per object: guards the algorithm's in-memory state (and SQLite's one
        # connection). Other processes and machines are kept in step by the database's locks.
        self._lock = threading.Lock()

    # -- the hooks -----------------------------------------------------------------------------------
    @abstractmethod
    def _session(self) -> AbstractContextManager[SessionT]:
        """A connection for the duration of one call (the caller holds `self._lock`)."""

    @abstractmethod
    def _begin(self, db: SessionT) -> AbstractContextManager[None]:
        """One write transaction on `db`: committed when the block ends, rolled back on an exception."""

    def _batch(self, db: SessionT) -> AbstractContextManager[None]:
        """Statements whose results are not read until the block ends may be sent together (PostgreSQL:
        one round trip instead of one each, inside the memo-wide lock); SQLite runs them as they come."""
        return nullcontext()

    def _lock_client(self, db: SessionT, client: str | None, epsilon: float) -> None:
        """Hold the client's ledger row until commit (lock 1); nothing where the transaction holds the
        whole database."""

    def _lock_memo(self, db: SessionT) -> bool:
        """Hold the memo-wide rows until commit (lock 3). True if other writers may have drawn since this
        transaction's reads, which must then be read again; False where the transaction holds the
        whole database."""
        return False

    @abstractmethod
    def _migrate(self, db: SessionT, meta: dict[str, Any]) -> None:
        """Bring a memo of an older format (metadata.OLD_FORMATS) to the current one, or refuse it."""

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

    # -- shared by every call ------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[SessionT]:
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
