"""`Deadline`: when a piece of verification work must end, handed down rather than written into settings.

`--time-limit` is the run's deadline (`VerifySettings.time_limit`, which always means the whole
invocation). The pieces of a run get deadlines derived from it: a region's branch-and-bound its
share of what is left, a node attempt its limit (`lucid.analysis.time_shares.attempt_time_limit`), a
witness search the engine's end. Each piece reads its own deadline; none changes the settings.

Work below the engine takes the deadline's `end` (a time.monotonic() value, None for none) and
checks it with `past`; a loop over chunks of networks sizes its chunks with `paced` so that one
chunk never runs long past the end. `Phases` names the phase a run's deadline passed in, for the
summary of a run the time limit stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

# `paced`: the first chunk of a loop under a deadline, and the seconds each later chunk aims at
PACE_FIRST = 16
PACE_SECONDS = 0.5


def past(end: float | None) -> bool:
    """Whether `end` (a time.monotonic() value; None: none) has passed."""
    return end is not None and time.monotonic() >= end


def paced(count: int, chunk: int, end: float | None) -> Iterator[slice]:
    """Slices of range(count) for work done one chunk at a time: `chunk` items each without an
    `end`; with one, PACE_FIRST items first, then as many as take about PACE_SECONDS at the rate
    measured so far (between PACE_FIRST and `chunk`), and none once `end` has passed. The rate is
    the time between two requests of the caller's loop, so it measures the caller's own work; it
    is taken over every chunk so far, so one chunk slowed down by a busy machine does not shrink
    the next ones to a few items, whose fixed costs would then dominate."""
    start, spent = 0, 0.0
    size = chunk if end is None else min(chunk, PACE_FIRST)
    while start < count and not past(end):
        stop = min(count, start + size)
        began = time.monotonic()
        yield slice(start, stop)
        if end is not None:
            spent += time.monotonic() - began
            per_item = spent / stop
            size = max(min(chunk, PACE_FIRST), min(chunk, int(PACE_SECONDS / max(per_item, 1e-9))))
        start = stop


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


class Phases:
    """Which phase of a run its deadline passed in: the innermost `phase(...)` that ended past the
    deadline, the first time one did (a phase is a name, and the class it works for, if any)."""

    def __init__(self) -> None:
        self.expired_in: tuple[str, int | None] | None = None

    @contextmanager
    def phase(self, name: str, deadline: Deadline, cls: int | None = None) -> Iterator[None]:
        try:
            yield
        finally:
            if self.expired_in is None and deadline.past():
                self.expired_in = (name, cls)

    def stopped_in(self, cls: int, started: bool) -> str:
        """Where the deadline stopped class `cls` (`started`: its first node was queued, or its
        start ran): its own phase ("its screen refinement"), another's ("class 3's witness
        search", with "before its start" for a class that never started), or, when no phase
        ran out, the node analyses."""
        if self.expired_in is None:
            where = "the node analyses"
        else:
            name, owner = self.expired_in
            where = name if owner is None else f"its {name}" if owner == cls else f"class {owner}'s {name}"
        return where if started else f"{where}, before its start"
