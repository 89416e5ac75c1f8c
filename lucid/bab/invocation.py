"""One invocation of the engine: its clock and where its events go."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from lucid.bab.events import EventLog
from lucid.deadline import Deadline, Phases


class Invocation:
    """The engine's clock and event sink, shared by its collaborators.

    Two clocks, because they answer different questions: `elapsed` is the verification's age for
    the log and the checkpoint (with a log it continues across resumes), `deadline` is this
    invocation's time limit (a resumed run gets the full limit again)."""

    def __init__(
        self, log: EventLog | None = None, deadline: Deadline | None = None, phases: Phases | None = None
    ) -> None:
        """`deadline`: with a start, the limit runs from there and `start` leaves it; without one
        it runs from `start` (or from now). `phases`: where the phases of this invocation are
        named (the run's, which also names its set-up; default: the engine's own)."""
        self.log = log
        deadline = deadline if deadline is not None else Deadline()
        self.fixed_start = deadline.start is not None
        self.deadline = deadline.begun()
        self.phases = phases if phases is not None else Phases()

    def start(self) -> None:
        """The invocation starts now (a deadline without a fixed start runs from here)."""
        if not self.fixed_start:
            self.deadline = self.deadline.restarted()

    def seconds(self) -> float:
        """Seconds since this invocation started."""
        return self.deadline.used()

    def past(self) -> bool:
        """Whether this invocation's deadline is past (never, without a limit)."""
        return self.deadline.past()

    def phase(self, name: str, cls: int | None = None) -> AbstractContextManager[None]:
        """A named phase of the engine's work (for class `cls`): the summary names the one the
        deadline passed in (`Phases`)."""
        return self.phases.phase(name, self.deadline, cls)

    def stopped_in(self, cls: int, started: bool = True) -> str:
        """Where the deadline stopped class `cls` (`Phases.stopped_in`)."""
        return self.phases.stopped_in(cls, started)

    def elapsed(self) -> float:
        """Seconds of the whole verification, as the log counts them."""
        return self.log.elapsed() if self.log is not None else self.seconds()

    def emit(self, event: str, cls: int | None = None, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, cls, **fields)
