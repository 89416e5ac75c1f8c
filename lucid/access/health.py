"""/healthz's view of the memo database (`lucid serve`, lucid/access/server.py): whether a PostgreSQL
memo's database answers, asked at most once a second per worker process however often /healthz is
asked, so that probes cost the database one query a second at most and a hung database holds one
thread, not one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

# /healthz's probe of the memo database: how long it may take, and how long its answer is reused.
HEALTH_TIMEOUT_S = 1.0
HEALTH_CACHE_S = 1.0

log = logging.getLogger("lucid.serve")  # the service's own log: an outage and its end are told there


class MemoHealth:
    """Whether the memo's database answers, for /healthz: `memo.reachable` (a pooled `SELECT 1`) in a
    thread of its own, at most one at a time, its answer reused for `cache_s`. A probe that has not
    answered within `timeout` + 0.5 s counts as unreachable (a database cut off without a reset can
    hold a query far longer); later checks wait on that same probe rather than start another, so a
    hung database holds one thread, not one per request. The thread is a daemon: a hung probe never
    holds up the process's exit. Memo stores without `reachable` are always reachable."""

    def __init__(self, memo: Any, timeout: float = HEALTH_TIMEOUT_S, cache_s: float = HEALTH_CACHE_S) -> None:
        self._probe = getattr(memo, "reachable", None)
        self.name = getattr(memo, "name", "memo")
        self.timeout, self.cache_s = timeout, cache_s
        self._pending: asyncio.Future | None = None
        self._last: tuple[float, bool] | None = None
        self._reported = True  # what was last logged: only changes are

    async def ok(self) -> bool:
        if self._probe is None:
            return True
        loop = asyncio.get_running_loop()
        if self._last is not None and time.monotonic() - self._last[0] < self.cache_s:
            return self._last[1]
        if self._pending is None or self._pending.done() or self._pending.get_loop() is not loop:
            self._pending = loop.create_future()
            threading.Thread(target=self._run, args=(loop, self._pending), name="lucid-health", daemon=True).start()
        try:
            ok = await asyncio.wait_for(asyncio.shield(self._pending), self.timeout + 0.5)
        except TimeoutError:
            ok = False
        self._last = (time.monotonic(), ok)
        if ok != self._reported:
            self._reported = ok
            if ok:
                log.warning("the memo database %s answers again: /healthz answers 200", self.name)
            else:
                log.warning("the memo database %s does not answer: /healthz answers 503", self.name)
        return ok

    def _run(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
        probe = self._probe
        try:
            ok = probe is None or bool(probe(self.timeout))
        except Exception:  # noqa: BLE001 (a probe that fails in any way: not reachable)
            ok = False

        def settle() -> None:
            if not future.done():
                future.set_result(ok)

        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            loop.call_soon_threadsafe(settle)
