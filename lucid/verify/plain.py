"""The plain strategy: one branch-and-bound over the whole domain (paper Algorithm 1, `Engine`).

With `--residual M` the engine bounds every network on its own as well, and its anytime upper is
the class's level: the (M+1)-th largest network bound (lucid/bab/order_statistic.py); the M
networks above it go to the residual sets that the run writes for the access layer to check at
query time (lucid/residual.py). A resume continues from the checkpoint's queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# LiveDisplay and the executors are looked up through their modules at call time, so a test or a
# benchmark can substitute them.
import lucid.bab.dask_workers as dask_workers
import lucid.bab.display as live_display
import lucid.bab.workers as executors
from lucid.analysis.problem import VerificationProblem
from lucid.bab.assembly import assemble_engine, screen_of
from lucid.bab.engine import Engine
from lucid.bab.events import LOG_FILE, read_events
from lucid.bab.order_statistic import SizeChooser, leak_outside, residual_set
from lucid.bab.state import ClassState
from lucid.errors import LucidError
from lucid.residual import ClassResidual
from lucid.residual_choice import ChoiceInputs
from lucid.rundir import bound_entry, read_public_inputs
from lucid.settings import RESIDUAL_AUTO, VerifySettings
from lucid.verify.lifecycle import Checkpoint, ResidualSets, VerificationRun, Verified


class BranchAndBound:
    """Every class's branch-and-bound on one shared executor (module docstring), in one step."""

    def __init__(self) -> None:
        self.engine: Engine | None = None  # built by the step, once the log is open
        self.executor: executors.Executor | None = None  # started by prepare

    def prepare(self, run: VerificationRun, saved: dict | None) -> dict[str, Any]:
        self.run = run
        self.states = _resumed_states(run, saved)
        # Only now the expensive part (loading every network, N's bounds): bad input has failed fast.
        self.problem = problem = run.load_problem()
        self.settings = settings = run.with_default_workers()
        self.chooser = _size_chooser(run, problem) if settings.residual == RESIDUAL_AUTO else None
        self.executor = _make_executor(problem, settings)
        self.screen = screen_of(problem, settings, run.classes)
        return {
            "workers": self.executor.capacity,
            "networks": len(problem.stack) - 1,
            "scheduler": None if settings.scheduler is None else str(settings.scheduler),
        }

    def step(self) -> bool:
        run, settings, executor = self.run, self.settings, self.executor
        if executor is None:
            raise RuntimeError("BranchAndBound.step before prepare")
        title = f"lucid verify {run.path.name} ({settings.solver}, {executor.capacity} workers)"
        with live_display.LiveDisplay(title, enabled=settings.progress) as display:
            self.engine = assemble_engine(
                self.problem,
                settings,
                executor,
                run.classes,
                screen=self.screen,
                on_progress=display.update,
                on_checkpoint=lambda engine: run.save_checkpoint(),
                choose_size=None if self.chooser is None else self.chooser.choose,
                log=run.event_log(),
                states=self.states,
                deadline=run.deadline,
                phases=run.phases,
            )
            self.engine.run()
        return False

    def checkpoint(self) -> Checkpoint | None:
        # before the engine exists there is nothing new to keep; after, its anytime bounds are sound
        if self.engine is None:
            return None
        return Checkpoint({str(c): cs.to_json() for c, cs in self.engine.states.items()})

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()

    def result(self) -> Verified:
        if self.engine is None:
            raise RuntimeError("BranchAndBound.result before its step")
        chosen = dict(self.engine.states)
        residual = _residual_sets(chosen)
        size = max((cs.residual_size for cs in chosen.values() if cs.residual_size is not None), default=0)
        return Verified(
            _bounds_entries(chosen, self.engine.elapsed(), residual, self.problem.stack.removed),
            residual=ResidualSets(residual, size) if size else None,
            chooser=self.chooser,
        )


def _resumed_states(run: VerificationRun, saved: dict | None) -> dict[int, ClassState] | None:
    """The class states of the checkpoint a --resume continues (None for a fresh run)."""
    if saved is None:
        return None
    try:
        states = {int(c): ClassState.from_json(int(c), obj) for c, obj in saved["classes"].items()}
    except ValueError as exc:
        if "older LUCID" in str(exc):
            raise LucidError(f"checkpoint {run.checkpoint_path} holds {exc}: run without --resume") from None
        raise LucidError(
            f"checkpoint {run.checkpoint_path} is corrupt ({exc!r}); delete it and run without --resume"
        ) from None
    except (KeyError, TypeError) as exc:
        raise LucidError(
            f"checkpoint {run.checkpoint_path} is corrupt ({exc!r}); delete it and run without --resume"
        ) from None
    if sorted(states) != run.classes:
        raise LucidError(f"checkpoint {run.checkpoint_path} is corrupt (its classes do not match)")
    _reconcile_with_log(states, run.path / LOG_FILE, run.result_options, run.fingerprint)
    return states


def _reconcile_with_log(states: dict[int, ClassState], log_path: Path, result_options: dict, fingerprint: str) -> None:
    """Carry over anytime upper bounds logged after the last checkpoint (a kill -9 can fall between
    a solved node's log event and the next checkpoint). Those bounds were proved by MILPs of this
    same verification (the log's last start/resume has the checkpoint's options), so they are
    sound, and the resumed log's anytime upper keeps never rising."""
    if not log_path.exists():
        return
    try:
        events = read_events(log_path)
    except (OSError, UnicodeDecodeError):
        return
    starts = [e for e in events if e.get("event") in ("started", "resumed") and e.get("class") is None]
    if not starts:
        return
    for start in starts:
        opts = start.get("options") or {}
        if start.get("run_fingerprint") != fingerprint or any(opts.get(k) != v for k, v in result_options.items()):
            return
    for e in events:
        # (a residual level bounds the networks outside the set it had then: not carried over)
        if (
            e.get("event") == "anytime"
            and e.get("class") in states
            and e.get("upper") is not None
            and states[e["class"]].residual_size is None
        ):
            cs = states[e["class"]]
            cs.upper = min(cs.upper, float(e["upper"]))


def _make_executor(problem: VerificationProblem, settings: VerifySettings) -> executors.Executor:
    if settings.scheduler is not None:
        return dask_workers.DaskExecutor(problem, settings, settings.scheduler, settings.workers)
    return executors.local_executor(problem, settings)


def _size_chooser(run: VerificationRun, problem: VerificationProblem) -> SizeChooser:
    """--residual auto: measured on --public-inputs, else on the run's test split."""
    x: np.ndarray | None
    if run.settings.public_inputs is not None:
        x, source = read_public_inputs(run.run, run.settings.public_inputs), "--public-inputs"
    else:
        x, source = run.run.data().get("X_test"), "the test split"
        if x is None or not len(x):
            raise LucidError(
                f"--residual auto measures the noised share on the test split, and {run.path} has "
                "none: give --public-inputs FILE.npz (public inputs in the data's units)"
            )
    networks = len(problem.stack) - 1
    inputs = ChoiceInputs.measure(problem.stack, x, source, problem.lower, problem.upper)
    return SizeChooser(inputs, run.settings.residual_size(networks), networks)


def _residual_sets(states: dict[int, ClassState]) -> dict[int, ClassResidual]:
    """Each class's residual set and level, with its members' proven bounds."""
    return {c: residual_set(cs) for c, cs in states.items() if cs.residual_size is not None}


def _bounds_entries(
    states: dict[int, ClassState], elapsed: float, residual: dict[int, ClassResidual], rows: np.ndarray
) -> dict[str, dict]:
    out = {}
    for c, cs in sorted(states.items()):
        lower, row = cs.lower, cs.lower_row
        if c in residual:  # the level's own lower bound: the best leak outside its set
            lower, position = leak_outside(cs, residual[c].positions)
            row = None if position is None else int(rows[position])
        out[str(c)] = bound_entry(
            # over every network: the level, or with a residual set the larger of it and its members' bounds
            residual[c].highest if c in residual else cs.upper,
            lower,
            complete=cs.complete,
            # finished without using --gap / --rel-gap (upper = the largest proved node bound)
            exact=cs.complete and not cs.within_gap,
            seconds=cs.seconds if cs.done else elapsed,
            nodes=cs.solved,
            reason=cs.reason,
            leaking_row=row,
            **({} if cs.stopped_in is None else {"stopped_in": cs.stopped_in}),
        )
    return out
