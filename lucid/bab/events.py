"""The verification event log: RUN/verify.log.jsonl, one JSON object per line.

Every event has `event`, `t` (seconds since the verification started, continued across resumes)
and `class` (null for run-level events). Node events (`queued`, `started`, `solved`, `split`,
`closed`, `final`) carry `node`, `parent`, `size`, `upper` and, once solved, `status`, `lower`,
`stats`. `anytime` events carry the class's current global `upper` and `lower`. Infinite values are
written as the strings "inf"/"-inf". Lines are appended and flushed one at a time, so a reader
following a live run (or a log cut by kill -9) sees whole events plus at most one partial line,
which `read_events` skips.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

LOG_FILE = "verify.log.jsonl"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else None)
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        return _clean(v.item())
    return v


class EventLog:
    """Appends events; `t` is measured from `start` minus the time already spent before a resume."""

    def __init__(self, path: str | Path, *, elapsed_before: float = 0.0, append: bool = False) -> None:
        self.path = Path(path)
        self._t0 = time.monotonic() - elapsed_before
        self._fh = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def emit(self, event: str, cls: int | None = None, **fields: Any) -> dict:
        record = {"event": event, "t": round(self.elapsed(), 4), "class": cls}
        record.update(fields)
        record = _clean(record)
        self._fh.write(json.dumps(record, allow_nan=False) + "\n")
        self._fh.flush()
        return record

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


def parse_float(v: Any) -> float | None:
    return None if v is None else float(v)


def read_events(path: str | Path) -> list[dict]:
    """All complete events of a log (a torn last line from a killed run is skipped)."""
    return list(iter_events(path))


def iter_events(path: str | Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                yield obj
