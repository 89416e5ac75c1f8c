"""Writing report files: atomically, and readable by whoever the owner hands them to.

`lucid.atomic.write_atomic` creates its temporary file with mode 0600 (right for run-directory
state); a report is meant to be passed on, so it gets the permissions an ordinary new file would
have under the process's umask, set before the rename so the final file never has others.
"""

from __future__ import annotations

import os
from pathlib import Path

from lucid.atomic import write_atomic


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_file(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (old file or whole new file, never part of one)."""

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)
        os.chmod(tmp, _default_mode())

    write_atomic(path, write)
    return Path(path)
