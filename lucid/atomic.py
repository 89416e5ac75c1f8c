"""JSON and file I/O with the project's guarantees.

Writes are crash-safe: write a temporary sibling, fsync, then rename over the target, so a
reader (or a resumed run after kill -9) sees either the old file or the new one, never a
half-written file. Reads of user-supplied JSON fail with one-line `LucidError`s.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lucid.errors import LucidError


def write_atomic(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to produce the file, then atomically move it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    write_atomic(path, write)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def read_json(path: str | Path, *, missing: str, unreadable: str) -> Any:
    """Parse a JSON file; a missing file raises LucidError(missing), an unreadable or
    malformed one LucidError(f"{unreadable}: {reason}")."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LucidError(missing) from None
    except (OSError, ValueError) as exc:
        raise LucidError(f"{unreadable}: {exc}") from None
