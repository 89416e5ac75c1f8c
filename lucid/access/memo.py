"""The memo of answers: a bounded LRU map input -> label, persisted in a database, and the ledger.

Why it exists: a noised label is a random draw. If an attacker could ask the same question
twice and get fresh draws, averaging them would reveal N's label and void the iDP guarantee.
So the first draw for an input is stored and every later query for that input gets the same
answer - also after a restart or a crash (hence a database, not a dict).

Released answers (N's own label) are stored too, with `noised = 0`: the classifier gives both
branches the same memo read and write, so neither the time of an answer nor whether it is a
memo hit depends on the branch (see lucid/access/classifier.py).

The privacy ledger (lucid/access/ledger.py) lives in the same database and is updated in the same
transaction as the answers it accounts for, so a crash or a concurrent writer can neither lose
nor double-count an entry.

One epsilon per memo: every stored draw was made with the epsilon the memo records, and a memo
refuses to answer or charge with another one (lucid/access/memo_meta.py), so a client is always
charged the epsilon its answers were drawn with.

Bounded: LRU eviction (the paper's policy) once more than `max_size` inputs are stored; an
evicted input can be re-sampled, which is the price of bounded storage.

Where it lives: a SQLite file (`Memo`, lucid/access/memo_sqlite.py), the embedded default, or a
PostgreSQL database shared by several replicas (`PostgresMemo`, lucid/access/memo_postgres.py,
imported only when used). Both run the one algorithm of lucid/access/memo_store.py; `open_memo`
picks the backend from what `--memo` names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from lucid.access.ledger import read_ledger
from lucid.access.memo_sqlite import SqliteMemo
from lucid.access.memo_store import DEFAULT_MEMO_SIZE, MemoError, MemoStore, MemoUnavailable, SqlMemo
from lucid.errors import LucidError

__all__ = ["DEFAULT_MEMO_SIZE", "MEMO_FILE", "Memo", "MemoError", "MemoStore", "MemoUnavailable", "SqlMemo",
           "SqliteMemo", "display_name", "is_database_url", "memo_name", "memo_target", "open_memo",
           "read_memo_ledger", "redact_secrets"]

MEMO_FILE = "memo.sqlite"  # RUN/memo.sqlite: lucid serve's answers and ledger by default
DATABASE_SCHEMES = ("postgresql://", "postgres://")  # what libpq takes as a URL

Memo = SqliteMemo  # the embedded default (and the name the package has always exported)


def is_database_url(target: object) -> bool:
    """Whether `--memo` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(target, str) and target.lower().startswith(DATABASE_SCHEMES)


# The secrets a URL may carry: the password of its user part, and password / sslpassword parameters.
_USER_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@/?#]*)@")
_PARAM_PASSWORD = re.compile(r"[?&](?:ssl)?password=([^&#]*)", re.IGNORECASE)


def _secrets(url: str) -> list[str]:
    """The password texts in `url`, as written and percent-decoded (longest first)."""
    found = [m.group(1) for m in (_USER_PASSWORD.match(url), *_PARAM_PASSWORD.finditer(url)) if m and m.group(1)]
    return sorted({*found, *(unquote(text) for text in found)} - {""}, key=len, reverse=True)


def redact_secrets(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with every password of `url` replaced by `***`:
    libpq quotes the offending part of a URL it cannot parse, password included."""
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def display_name(url: str) -> str:
    """The URL without its password (in the user part or a `password=` parameter): for messages.
    A URL too malformed to take apart is named by its scheme alone."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return f"{url.split('://', 1)[0]}://..."
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{user.split(':', 1)[0]}@{host}" if at else host
    query = "&".join(p for p in parts.query.split("&") if p and not p.lower().startswith(("password=", "sslpassword=")))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def memo_name(target: str | Path) -> str:
    """A memo as messages and reports name it: a file path as given, a URL without its password."""
    return display_name(target) if is_database_url(target) else str(target)


def memo_target(run: Path, memo: str | None) -> str | Path:
    """What `--memo` names, as the memo layer takes it: RUN/memo.sqlite without it, a URL as typed
    (a Path would fold its '//' and lose it), any other text as a file path; another scheme:// is
    refused in one line."""
    if memo is None:
        return Path(run) / MEMO_FILE
    _check_scheme(memo)
    return memo if "://" in memo else Path(memo)


def _check_scheme(target: str | Path | None) -> None:
    """Refuse any `scheme://` other than PostgreSQL's in one line, rather than take it for a file name."""
    if isinstance(target, str) and "://" in target and not is_database_url(target):
        raise LucidError(f"--memo {target.split('://', 1)[0]}://...: only postgresql:// URLs or file paths are memos")


def _postgres() -> Any:
    """lucid/access/memo_postgres.py, or one line saying what to install."""
    try:
        from lucid.access import memo_postgres
    except ImportError as exc:
        raise LucidError(f"a PostgreSQL memo needs psycopg 3 and psycopg_pool ({exc}): "
                         "pip install 'lucid-idp[postgres]'") from None
    return memo_postgres


def open_memo(target: str | Path | None, max_size: int = DEFAULT_MEMO_SIZE, fingerprint: str | None = None,
              epsilon: float | None = None, bounds: Any = None) -> MemoStore:
    """The memo `target` names: a `postgresql://` URL (several replicas share it), a SQLite file
    path (one machine), or None (in memory). Refuses any other `scheme://` in one line, rather
    than creating a file of that odd name."""
    if is_database_url(target):
        return _postgres().PostgresMemo(str(target), max_size=max_size, fingerprint=fingerprint, epsilon=epsilon,
                                        bounds=bounds)
    _check_scheme(target)
    return SqliteMemo(target, max_size=max_size, fingerprint=fingerprint, epsilon=epsilon, bounds=bounds)


def read_memo_ledger(target: str | Path, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows of the memo `target` names (a file, or a `postgresql://` URL), read-only:
    `lucid budget` and `lucid report` read it beside a running service."""
    if is_database_url(target):
        return _postgres().read_ledger_rows(str(target), fingerprint)
    _check_scheme(target)
    return read_ledger(target, fingerprint)
