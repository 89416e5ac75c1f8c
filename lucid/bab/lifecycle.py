"""`VerificationRun`: the life of one `lucid verify` invocation, whatever its strategy.

A strategy (plain branch-and-bound with or without residual sets, `lucid.bab.plain`; one MILP per
class over an AGT box, `lucid.bab.agt_run`; region-wise bounds, `lucid.regions.verify`) decides
what to analyse. The run owns what every strategy shares, once: the resume checkpoint
(lucid.bab.checkpoint), the event log (lucid.bab.events) from its "started" to its "finished"
event, SIGTERM as Ctrl-C (the checkpoint is saved, then the interrupt goes on), the run's
`Deadline` (and `Phases`, which names the phase it passed in), and writing RUN/bounds.json
(lucid-bounds/1, atomically).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lucid.bab.checkpoint import CHECKPOINT_FILE, load_checkpoint, run_fingerprint, save_checkpoint
from lucid.bab.events import LOG_FILE, EventLog
from lucid.bab.session import terminate_as_interrupt
from lucid.deadline import Deadline, Phases
from lucid.errors import LucidError
from lucid.rundir import Run, write_bounds
from lucid.settings import VerifySettings


@dataclass
class Verified:
    """What a strategy proved: bounds.json's per-class entries, its optional sections, and the
    fields of the log's "finished" event beside the bounds."""

    entries: dict[str, dict]
    regions: dict | None = None
    residual: dict | None = None
    residual_choice: dict | None = None  # --residual auto: the M chosen and why
    finished: dict[str, Any] = field(default_factory=dict)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """This process's torch work (the screens, the leak searches) on one thread while it verifies,
    as each worker's is: the workers' solvers take the other cores, and on a busy machine an op
    split over threads waits at each of its barriers for a thread the scheduler has parked, which
    no deadline check between two chunks can shorten (16 networks of a 2-D CNN's screen: 0.06 s
    on a quiet machine, up to 7 s with two threads at load 6; 55 networks at most 0.8 s with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Strategy(Protocol):
    def verify(self, run: VerificationRun) -> Verified:
        """Bound the run's classes; calls `run.start` once its set-up has failed or succeeded."""
        ...


class VerificationRun:
    """One invocation on one run directory: its settings, classes, deadline, checkpoint and log."""

    def __init__(self, run: Run, settings: VerifySettings, deadline: Deadline) -> None:
        self.run = run
        self.settings = settings
        self.deadline = deadline
        self.classes = settings.resolve_classes(run.num_classes)
        if isinstance(settings.residual, int) and settings.residual > run.train_size:  # not "auto"
            raise LucidError(
                f"--residual {settings.residual} exceeds the run's {run.train_size} leave-one-out networks"
            )
        self.result_options = settings.result_options(self.classes)
        self.path = Path(run.path)
        self.checkpoint_path = self.path / CHECKPOINT_FILE
        try:
            self.fingerprint = run_fingerprint(self.path)
        except OSError as exc:
            raise LucidError(f"cannot read the networks of {self.path}: {exc}") from None
        self.phases = Phases()  # names the phase the deadline passed in, for the summary
        self.elapsed_before = 0.0  # the verification's seconds before this invocation (a resume)
        self.options: dict[str, Any] = {}
        self.log: EventLog | None = None

    def execute(self, strategy: Strategy) -> dict:
        """Run `strategy`, write bounds.json and log "finished"; returns bounds.json's content."""
        try:
            with one_torch_thread():
                verified = strategy.verify(self)
        finally:
            if self.log is not None:
                self.log.close()
        result = write_bounds(
            self.path,
            verified.entries,
            solver=self.settings.solver,
            options=self.options,
            regions=verified.regions,
            residual=verified.residual,
            residual_choice=verified.residual_choice,
        )
        with EventLog(self.path / LOG_FILE, elapsed_before=self.elapsed(), append=True) as tail:
            tail.emit("finished", None, bounds=result["bounds"], **verified.finished)
        return result

    # --- what strategies call -----------------------------------------------------------------
    def saved(self) -> dict | None:
        """With --resume, the checkpoint this invocation continues (checked against the run and
        the options; one error line otherwise), else None."""
        if not self.settings.resume:
            return None
        saved = load_checkpoint(self.checkpoint_path, fingerprint=self.fingerprint, options=self.result_options)
        self.elapsed_before = float(saved["elapsed"])
        return saved

    def start(self, *, workers: int, scheduler: str | None = None, **fields: Any) -> EventLog:
        """Open the event log with its "started" (or "resumed") event, once the strategy's set-up
        has succeeded: bad input never leaves a log behind."""
        self.options = dict(
            self.result_options, workers=workers, time_limit=self.settings.time_limit, scheduler=scheduler
        )
        self.log = EventLog(self.path / LOG_FILE, elapsed_before=self.elapsed_before, append=self.settings.resume)
        self.log.emit(
            "resumed" if self.settings.resume else "started",
            None,
            options=self.options,
            settings=self.settings.to_json(),
            **fields,
            run_fingerprint=self.fingerprint,
        )
        return self.log

    def elapsed(self) -> float:
        """Seconds of the whole verification, across resumes, as the log counts them."""
        return self.log.elapsed() if self.log is not None else self.elapsed_before

    def save(self, classes: dict, extra: dict | None = None) -> None:
        """Write the resume checkpoint (atomically): the strategy's state in `classes` / `extra`."""
        save_checkpoint(
            self.checkpoint_path,
            fingerprint=self.fingerprint,
            options=self.result_options,
            elapsed=self.elapsed(),
            classes=classes,
            extra=extra,
        )

    @contextmanager
    def interruptible(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        """SIGTERM (kill, timeout, a job scheduler) and Ctrl-C run `on_interrupt` (a checkpoint of
        every finished piece: resume continues from there), then the interrupt goes on."""
        restore = terminate_as_interrupt()
        try:
            yield
        except KeyboardInterrupt:
            on_interrupt()
            raise
        finally:
            restore()
