"""What `--memo` names, and how messages name it: a SQLite file path, or a PostgreSQL URL shown
without its password. Both backends and the commands that read a memo's ledger use these, so they
import nothing of the memo itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeGuard
from urllib.parse import unquote, urlsplit, urlunsplit

from lucid.errors import LucidError

MEMO_FILE = "memo.sqlite"  # RUN/memo.sqlite: lucid serve's answers and ledger by default
DATABASE_SCHEMES = ("postgresql://", "postgres://")  # what libpq takes as a URL


def is_database_url(target: object) -> TypeGuard[str]:
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
    check_scheme(memo)
    return memo if "://" in memo else Path(memo)


def check_scheme(target: str | Path | None) -> None:
    """Refuse any `scheme://` other than PostgreSQL's in one line, rather than take it for a file name."""
    if isinstance(target, str) and "://" in target and not is_database_url(target):
        raise LucidError(f"--memo {target.split('://', 1)[0]}://...: only postgresql:// URLs or file paths are memos")
