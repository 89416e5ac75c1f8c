"""One invocation of the engine: its clock and where its events go."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from lucid.bab.events import EventLog


class Session:
    """The engine's clock and event sink, shared by its collaborators.

    Two clocks, because they answer different questions: `elapsed` is the verification's age for
    the log and the checkpoint (with a log it continues across resumes), `seconds` is this
    invocation's age, which --time-limit bounds (a resumed run gets the full limit again)."""

    def __init__(self, log: EventLog | None = None, started: float | None = None) -> None:
        """`started`: when the invocation began (time.monotonic()); its time limit runs from there and
        `start` leaves it. Without it the limit runs from `start` (or from now)."""
        self.log = log
        self.fixed_start = started is not None
        self._started = time.monotonic() if started is None else started

    def start(self) -> None:
        """The invocation starts now (its time limit runs from here)."""
        self._started = time.monotonic()

    def seconds(self) -> float:
        """Seconds since this invocation started."""
        return time.monotonic() - self._started

    def past(self, time_limit: float | None) -> bool:
        """Whether this invocation has used up `time_limit` seconds (never, without one)."""
        return time_limit is not None and self.seconds() >= time_limit

    def deadline(self, time_limit: float | None) -> float | None:
        """The time.monotonic() at which `time_limit` runs out (None without one), for work that
        checks the clock itself (the witness search)."""
        return None if time_limit is None else self._started + time_limit

    def elapsed(self) -> float:
        """Seconds of the whole verification, as the log counts them."""
        return self.log.elapsed() if self.log is not None else self.seconds()

    def emit(self, event: str, cls: int | None = None, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, cls, **fields)


def terminate_as_interrupt() -> Callable[[], None]:
    """Treat SIGTERM (kill, timeout, a job scheduler) like Ctrl-C: checkpoint, stop the workers,
    exit 130. Returns the function that restores the previous handler (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)
