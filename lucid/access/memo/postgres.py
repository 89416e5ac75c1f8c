"""The memo in a PostgreSQL database, shared by several `lucid serve` replicas (machines).

    lucid serve RUN --epsilon 1 --memo postgresql://lucid@db.internal:5432/lucid

The algorithm is lucid/access/memo/store.py's, with the same tables and statements as the SQLite
file; this module is the PostgreSQL backend of it (the hooks of lucid/access/memo/backend.py), on
psycopg 3 and a psycopg_pool connection pool.

Locking: row locks in READ COMMITTED transactions, not SERIALIZABLE ones. A transaction takes
`SELECT ... FOR UPDATE` on the client's ledger row (so its fresh inputs and its budget are decided
by one replica at a time), `FOR KEY SHARE` on the stored memo rows it relies on (so eviction
cannot remove them under it), and `FOR UPDATE` on the memo's `count` row in `meta` before it draws,
writes LRU positions or evicts (so the draws, the count and the all-clients row of the total
budget change one transaction at a time). After waiting for a lock, READ COMMITTED lets the next
statement see what the holder committed: the inputs missing before the memo-wide lock are read
again after it, and an input another replica drew meanwhile gets that replica's draw, never a
second one. A refused request stores nothing, as with SQLite. Why not SERIALIZABLE: every drawing
transaction writes the same all-clients row and count, so under SERIALIZABLE racing replicas
would abort each other (serialization failures) and retry in a loop; the locks make them queue
instead, in one fixed order (store.py), so there is no deadlock either.

Fail closed: a request whose memo work cannot reach the database gets MemoUnavailable (the
service answers 503) and nothing is answered or charged, since labels are returned only after
COMMIT succeeds; at start-up an unreachable database is one error line. A connection that breaks
during COMMIT may or may not have committed: either way the client got no label, and a committed
draw is what the next query for that input gets.

Durability is the server's `synchronous_commit` (on by default: a commit is flushed before its
labels are returned). Turning it off would let a database crash lose draws already given out.

The tables go into the connection's current schema (`public` unless the URL sets `search_path`,
e.g. `?options=-csearch_path%3Dlucid`): give each served run its own database or schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from lucid.access.memo.addresses import display_name, redact_secrets
from lucid.access.memo.backend import MemoError, MemoUnavailable
from lucid.access.memo.budget import ledger_rows, lock_client_rows
from lucid.access.memo.metadata import BoundsRecord
from lucid.access.memo.store import DEFAULT_MEMO_SIZE, SqlMemo
from lucid.errors import LucidError

# A request waits at most this long for a healthy connection before it gets 503: the pool holds
# none only while the database is unreachable (one call at a time per memo uses a connection).
DEFAULT_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout where the URL sets none: a silent host fails, not hangs
# Give up a run of failed reconnections after this long; the next request starts a new one at
# once, so the service comes back within seconds of the database (not after a long backoff).
RECONNECT_TIMEOUT_S = 10.0
# Schema creation by replicas starting together: one at a time (pg_advisory_xact_lock's two keys).
_SCHEMA_LOCK = 0x1EC1D

# The SQLite schema's tables, in PostgreSQL's types (see lucid/access/memo/sqlite.py for what each holds):
# BYTEA keys, 64-bit counters and LRU clock, DOUBLE PRECISION epsilons (REAL is 32-bit here).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS memo (key BYTEA PRIMARY KEY, label INTEGER NOT NULL, used BIGINT NOT NULL,
    noised INTEGER NOT NULL DEFAULT 1);
CREATE INDEX IF NOT EXISTS memo_used ON memo (used);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS seen (key BYTEA NOT NULL, client TEXT NOT NULL, PRIMARY KEY (key, client));
CREATE TABLE IF NOT EXISTS ledger (client TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL,
    answers BIGINT NOT NULL DEFAULT 0, noised BIGINT NOT NULL DEFAULT 0, refused BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (client, epsilon));
CREATE TABLE IF NOT EXISTS reserved (id TEXT NOT NULL, client TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL,
    inputs BIGINT NOT NULL, expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (id, client));
"""


def _first_line(exc: BaseException, url: str) -> str:
    """The first line of a driver's message about `url`, without the URL's password (libpq quotes
    what it cannot parse)."""
    text = str(exc).strip()
    return redact_secrets(text.splitlines()[0] if text else type(exc).__name__, url)


def _conninfo(url: str, name: str) -> str:
    """libpq's connection string for `url`, with a connect timeout unless the URL sets one."""
    try:
        params = pg_conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise LucidError(f"--memo {name}: not a PostgreSQL URL ({_first_line(exc, url)})") from None
    return pg_conninfo.make_conninfo(
        url, **({} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_S})
    )


def _configure(conn: psycopg.Connection) -> None:
    """Each new pooled connection: exact float text (epsilons round-trip through `meta`'s TEXT value),
    and READ COMMITTED whatever the server's default (the locking relies on it: module docstring)."""
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED  # before any statement opens a transaction
    conn.execute("SET extra_float_digits = 3")


def _scalar(cursor: psycopg.Cursor) -> Any:
    """The one value of a query's one row (None without a row)."""
    row = cursor.fetchone()
    return None if row is None else row[0]


class _Session:
    """A psycopg connection speaking the shared statements' `?` placeholders (psycopg's are `%s`;
    no shared statement contains a literal `?` or `%`)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> psycopg.Cursor:
        # Without parameters psycopg sends the text as is, several statements included (the schema).
        if parameters is None:
            return self.conn.execute(sql)
        return self.conn.execute(sql.replace("?", "%s"), parameters)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), list(rows))


class PostgresMemo(SqlMemo[_Session]):
    """`PostgresMemo("postgresql://user@host:port/db")`: the memo and ledger in that database."""

    _ROW_LOCK = " FOR KEY SHARE OF m"
    _SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    _ERRORS = (psycopg.Error,)

    def __init__(
        self,
        url: str,
        max_size: int = DEFAULT_MEMO_SIZE,
        fingerprint: str | None = None,
        epsilon: float | None = None,
        bounds: np.ndarray | BoundsRecord | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """`epsilon` (and `bounds`): bind the database to them at once, refusing one recorded with
        others (see `bind`). `timeout`: the longest a call waits for a connection (then 503)."""
        super().__init__(max_size, display_name(url))
        self._url = url  # only to take its password out of the driver's messages
        conninfo = _conninfo(url, self._name)
        # One plain connection first: an unreachable database is one clear line at once, where the
        # pool would retry in the background and log each failure before timing out.
        try:
            psycopg.connect(conninfo, autocommit=True).close()
        except psycopg.Error as exc:
            raise MemoUnavailable(
                f"cannot connect to the memo database {self._name}: {_first_line(exc, url)}"
            ) from None
        # Small: a memo makes one call at a time (its lock), so one connection is in use and one more
        # can be opened while a broken one is replaced; each replica (and each --workers process) has its own.
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=2,
            open=False,
            kwargs={"autocommit": True},
            configure=_configure,
            timeout=timeout,
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            name="lucid-memo",
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
            with self._transaction() as db:
                # Replicas starting together would race on CREATE TABLE and on the new meta rows.
                db.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK}, hashtext(current_schema()))")
                if _scalar(db.execute("SELECT to_regclass('reserved')")) is None:  # the newest table
                    db.execute(_SCHEMA)
                self._init_meta(db, fingerprint)
            if epsilon is not None:
                self.bind(epsilon, bounds)
        except psycopg.Error as exc:
            self._pool.close()
            failure = self._failure(exc)
            if isinstance(failure, MemoUnavailable):
                raise failure from None
            raise LucidError(f"cannot use {self._name} as a memo: {_first_line(exc, url)}") from None
        except LucidError:
            self._pool.close()
            raise

    @contextmanager
    def _session(self) -> Iterator[_Session]:
        with self._pool.connection() as conn:
            yield _Session(conn)

    @contextmanager
    def _begin(self, db: _Session) -> Iterator[None]:
        with db.conn.transaction():
            yield

    @contextmanager
    def _batch(self, db: _Session) -> Iterator[None]:
        with db.conn.pipeline():
            yield

    def _lock_client(self, db: _Session, client: str | None, epsilon: float) -> None:
        lock_client_rows(db, client, epsilon)

    def _lock_memo(self, db: _Session) -> bool:
        db.execute("SELECT 1 FROM meta WHERE name = 'count' FOR UPDATE")
        return True

    def _migrate(self, db: _Session, meta: dict[str, Any]) -> None:
        raise LucidError(
            f"{self._name} holds a {meta.get('format')} memo: only SQLite files of that format are migrated"
        )

    def _failure(self, exc: BaseException) -> MemoError:
        # Connection-level failures (no server answer, a dropped connection, class 08, or the server
        # shutting down, 57P) say nothing about the request; any other error may, and is a MemoError.
        state = getattr(exc, "sqlstate", None) or ""
        if isinstance(exc, PoolTimeout) or (
            isinstance(exc, psycopg.OperationalError) and (not state or state.startswith(("08", "57P")))
        ):
            return MemoUnavailable(f"the memo database {self._name} is unreachable: {_first_line(exc, self._url)}")
        return MemoError(f"the memo database {self._name} failed: {_first_line(exc, self._url)}")

    def _close_connection(self) -> None:
        self._pool.close()

    def reachable(self, timeout: float) -> bool:
        # A pooled connection (the pool holds one more than a call in progress uses), `SELECT 1` on it.
        # A dead connection fails here and the pool replaces it; while the database is down the pool
        # has none to give, and the wait ends after `timeout`.
        try:
            with self._pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:  # PoolTimeout and PoolClosed included
            return False
        return True


def read_ledger_rows(url: str, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows of the memo in that database, in a read-only transaction (no pool, no schema
    made: reading must not create a memo)."""
    name = display_name(url)
    try:
        with psycopg.connect(_conninfo(url, name)) as conn:
            conn.read_only = True
            _configure(conn)
            if _scalar(conn.execute("SELECT to_regclass('meta')")) is None:
                raise LucidError(f"{name} holds no memo: no answers have been given with it")
            return ledger_rows(_Session(conn), name, fingerprint)
    except psycopg.Error as exc:
        raise LucidError(f"cannot read the ledger in {name}: {_first_line(exc, url)}") from None
