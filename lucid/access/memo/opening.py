"""Opening the memo that `--memo` names, and reading its ledger beside a running service.

The backend follows from the address (lucid/access/memo/addresses.py): a SQLite file, the embedded
default, or a PostgreSQL database shared by several replicas. The PostgreSQL backend, and psycopg
with it, is imported only when one is named, so that a SQLite deployment needs neither.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from lucid.access.memo.addresses import check_scheme, is_database_url
from lucid.access.memo.metadata import BoundsRecord
from lucid.access.memo.sqlite import SqliteMemo, read_ledger
from lucid.access.memo.store import DEFAULT_MEMO_SIZE, MemoStore
from lucid.errors import LucidError


def _postgres() -> ModuleType:
    """lucid/access/memo/postgres.py, or one line saying what to install."""
    try:
        import lucid.access.memo.postgres as postgres
    except ImportError as exc:
        raise LucidError(
            f"a PostgreSQL memo needs psycopg 3 and psycopg_pool ({exc}): pip install 'lucid-idp[postgres]'"
        ) from None
    return postgres


def open_memo(
    target: str | Path | None,
    max_size: int = DEFAULT_MEMO_SIZE,
    fingerprint: str | None = None,
    epsilon: float | None = None,
    bounds: np.ndarray | BoundsRecord | None = None,
) -> MemoStore:
    """The memo `target` names: a `postgresql://` URL (several replicas share it), a SQLite file
    path (one machine), or None (in memory). Refuses any other `scheme://` in one line, rather
    than creating a file of that odd name."""
    if is_database_url(target):
        return _postgres().PostgresMemo(
            str(target), max_size=max_size, fingerprint=fingerprint, epsilon=epsilon, bounds=bounds
        )
    check_scheme(target)
    return SqliteMemo(target, max_size=max_size, fingerprint=fingerprint, epsilon=epsilon, bounds=bounds)


def read_memo_ledger(target: str | Path, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows of the memo `target` names (a file, or a `postgresql://` URL), read-only:
    `lucid budget` and `lucid report` read it beside a running service."""
    if is_database_url(target):
        return _postgres().read_ledger_rows(str(target), fingerprint)
    check_scheme(target)
    return read_ledger(target, fingerprint)
