"""`Deadline`: when a piece of verification work must end, handed down rather than written into settings.

`--time-limit` is the run's deadline (`VerifySettings.time_limit`, which always means the whole
invocation). The pieces of a run get deadlines derived from it: a region's branch-and-bound its
share of what is left, a node attempt its limit (`lucid.analysis.time_shares.attempt_time_limit`), a
witness search the engine's end. Each piece reads its own deadline; none changes the settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Deadline:
    """`seconds` (None: no limit) counted from `start`, a time.monotonic() reading.

    Without a `start` the span starts when its work does (`begun`): a region's share starts when
    its branch-and-bound runs, after the set-up that its parent's share does not pay for."""

    seconds: float | None = None
    start: float | None = None

    def begun(self) -> Deadline:
        """This deadline with its start fixed: now, unless it has one already."""
        return self if self.start is not None else replace(self, start=time.monotonic())

    def restarted(self) -> Deadline:
        """The same span, starting now."""
        return replace(self, start=time.monotonic())

    def used(self) -> float:
        """Seconds since the start (0 before it)."""
        return 0.0 if self.start is None else time.monotonic() - self.start

    def left(self) -> float | None:
        """Seconds until the end (None without a limit; negative once past)."""
        return None if self.seconds is None else self.seconds - self.used()

    def past(self) -> bool:
        """Whether the span is used up (never, without a limit)."""
        return self.seconds is not None and self.used() >= self.seconds

    @property
    def end(self) -> float | None:
        """The time.monotonic() at which the span ends (None without a limit), for work that
        checks the clock itself (the witness search)."""
        if self.seconds is None:
            return None
        return (time.monotonic() if self.start is None else self.start) + self.seconds
