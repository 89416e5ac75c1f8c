"""`VerificationRun`: the life of one `lucid verify` invocation, whatever its strategy.

A strategy (plain branch-and-bound with or without residual sets, `lucid.verify.plain`; one MILP
per class over an AGT box, `lucid.verify.parameter_box`; region-wise bounds,
`lucid.verify.regions`) decides what to analyse; the run drives it through `Strategy`: `prepare`
(the set-up, where bad input fails before anything is written), then `step` until it says it is
done, then `result`. The run owns what every strategy shares, once: the resume checkpoint
(lucid/verify/checkpoint.py, saved after every step, whenever the strategy's work reaches a
consistent point, and on an interrupt), the event log (lucid.bab.events) from its "started" to its
"finished" event, SIGTERM as Ctrl-C (the checkpoint is saved, then the interrupt goes on), the
run's `Deadline` (and `Phases`, which names the phase it passed in), and every file it writes: the
residual sets' parameter file, then RUN/bounds.json (lucid-bounds/1, atomically, last: a reader
never sees bounds.json name a file that is not there).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from lucid.analysis.problem import VerificationProblem
from lucid.bab.events import LOG_FILE, EventLog
from lucid.bab.order_statistic import SizeChooser
from lucid.deadline import Deadline, Phases
from lucid.errors import LucidError
from lucid.residual import ClassResidual, write_residual
from lucid.rundir import Run, write_bounds
from lucid.settings import VerifySettings
from lucid.verify.checkpoint import CHECKPOINT_FILE, load_checkpoint, run_fingerprint, save_checkpoint


@dataclass
class ResidualSets:
    """The residual sets a strategy chose: per class the domain's (`classes`), of size `size`,
    and the region boxes' (`boxes`, `--regions`), whose networks the parameter file holds too."""

    classes: dict[int, ClassResidual]
    size: int
    boxes: list[ClassResidual] = field(default_factory=list)


@dataclass
class Verified:
    """What a strategy proved: bounds.json's per-class entries, its optional sections, and the
    fields of the log's "finished" event beside the bounds."""

    entries: dict[str, dict]
    regions: dict | None = None
    residual: ResidualSets | None = None
    chooser: SizeChooser | None = None  # --residual auto: the M chosen and why
    finished: dict[str, Any] = field(default_factory=dict)


@dataclass
class Checkpoint:
    """A strategy's resumable state: per-class states (`classes`) and anything else (`extra`)."""

    classes: dict[str, Any]
    extra: dict | None = None


class Strategy(Protocol):
    """What the run drives. `prepare` does the set-up (bad input raises `LucidError` before any
    file is written) and returns the fields of the log's "started" event (`workers` among them);
    `step` does one piece of work (the run checkpoints after each) and returns False when nothing
    is left; `checkpoint` is the state to resume from (None: the strategy cannot resume);
    `close` releases the workers (also after a failure); `result` is what was proved."""

    def prepare(self, run: VerificationRun, saved: dict | None) -> dict[str, Any]: ...

    def step(self) -> bool: ...

    def checkpoint(self) -> Checkpoint | None: ...

    def close(self) -> None: ...

    def result(self) -> Verified: ...


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
        self._strategy: Strategy | None = None

    def execute(self, strategy: Strategy) -> dict:
        """Drive `strategy` (module docstring), write its files and log "finished"; returns
        bounds.json's content."""
        self._strategy = strategy
        try:
            with one_torch_thread():
                try:
                    fields = strategy.prepare(self, self._saved())
                    self._start(**fields)
                    with self._interruptible():
                        while strategy.step():
                            self.save_checkpoint()
                finally:
                    strategy.close()
        finally:
            if self.log is not None:
                self.log.close()
        verified = strategy.result()
        section = None
        if verified.residual is not None:
            sets = verified.residual
            section = write_residual(self.path, sets.classes, sets.size, sets.boxes)
        result = write_bounds(
            self.path,
            verified.entries,
            solver=self.settings.solver,
            options=self.options,
            regions=verified.regions,
            residual=section,
            residual_choice=None if verified.chooser is None else verified.chooser.record(section),
        )
        with EventLog(self.path / LOG_FILE, elapsed_before=self.elapsed(), append=True) as tail:
            tail.emit("finished", None, bounds=result["bounds"], **verified.finished)
        return result

    # --- what strategies use ------------------------------------------------------------------
    def load_problem(self, *, needs_networks: bool = True) -> VerificationProblem:
        """The run's verification problem (every network, N's bounds), the first expensive step,
        named as the set-up phase. `needs_networks`: a run without leave-one-out networks is one
        error line (a parameter box needs none: it holds every data set within K removals)."""
        settings = self.settings
        with self.phases.phase("set-up (networks, N's bounds)", self.deadline):
            problem = VerificationProblem.from_run(
                self.run, bounds=settings.bounds, with_points=settings.search, deadline=self.deadline.end
            )
        if needs_networks and len(problem.stack) < 2:
            raise LucidError(f"{self.path} has no leave-one-out networks to verify")
        return problem

    def with_default_workers(self) -> VerifySettings:
        """The settings with one worker per core unless --workers or a --scheduler says otherwise."""
        if self.settings.workers is None and self.settings.scheduler is None:
            return replace(self.settings, workers=os.cpu_count() or 1)
        return self.settings

    def save_checkpoint(self) -> None:
        """Write the strategy's resume checkpoint (atomically), if it keeps one; strategies call it
        too where their work reaches a consistent point within a step."""
        state = None if self._strategy is None else self._strategy.checkpoint()
        if state is None:
            return
        save_checkpoint(
            self.checkpoint_path,
            fingerprint=self.fingerprint,
            options=self.result_options,
            elapsed=self.elapsed(),
            classes=state.classes,
            extra=state.extra,
        )

    def event_log(self) -> EventLog:
        """The open event log, for the strategy's steps (it opens once `prepare` has succeeded)."""
        if self.log is None:
            raise RuntimeError("the run's event log opens after the strategy's prepare")
        return self.log

    def elapsed(self) -> float:
        """Seconds of the whole verification, across resumes, as the log counts them."""
        return self.log.elapsed() if self.log is not None else self.elapsed_before

    # --- the run's own --------------------------------------------------------------------------
    def _saved(self) -> dict | None:
        """With --resume, the checkpoint this invocation continues (checked against the run and
        the options; one error line otherwise), else None."""
        if not self.settings.resume:
            return None
        saved = load_checkpoint(self.checkpoint_path, fingerprint=self.fingerprint, options=self.result_options)
        self.elapsed_before = float(saved["elapsed"])
        return saved

    def _start(self, *, workers: int, scheduler: str | None = None, **fields: Any) -> None:
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

    @contextmanager
    def _interruptible(self) -> Iterator[None]:
        """SIGTERM (kill, timeout, a job scheduler) and Ctrl-C save the checkpoint (every finished
        piece: resume continues from there), then the interrupt goes on."""
        restore = terminate_as_interrupt()
        try:
            yield
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        finally:
            restore()


def terminate_as_interrupt() -> Callable[[], object]:
    """Treat SIGTERM (kill, timeout, a job scheduler) like Ctrl-C: checkpoint, stop the workers,
    exit 130. Returns the function that restores the previous handler (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)
