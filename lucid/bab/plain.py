"""The plain strategy: one branch-and-bound over the whole domain (paper Algorithm 1, `Engine`).

With `--residual M` the engine sets each class's M hardest networks aside (their parameters go to
a residual file that the access layer checks at query time, lucid/residual.py) and bounds the rest:
its anytime upper is then the class's level. A class whose level ends on a leak of a network
outside its set is then verified again with that network inside (lucid/bab/leaker_rounds.py). A resume
continues from the checkpoint's queue.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

# Engine, LiveDisplay, the executors and the class-level witness search are looked up through
# their modules at call time, so a test or a benchmark can substitute them.
import lucid.bab.dask_workers as dask_workers
import lucid.bab.display as live_display
import lucid.bab.engine as bab_engine
import lucid.bab.workers as executors
import lucid.witness.search as witness_search
from lucid.bab.events import LOG_FILE, EventLog, read_events
from lucid.bab.lifecycle import VerificationRun, Verified
from lucid.bab.hooks import EngineHooks
from lucid.bab.leaker_rounds import leakers_moved_in
from lucid.bab.partition import FlatParameters
from lucid.bab.state import ClassState
from lucid.deadline import Deadline
from lucid.errors import LucidError
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen
from lucid.residual import ClassResidual, write_residual
from lucid.rundir import bound_entry_value
from lucid.settings import VerifySettings


class BranchAndBound:
    """Every class's branch-and-bound on one shared executor (module docstring)."""

    def verify(self, run: VerificationRun) -> Verified:
        settings = run.settings
        states = self._resumed_states(run)
        # Only now the expensive part (loading every network, N's bounds): bad input has failed fast.
        problem = VerificationProblem.from_run(run.run, bounds=settings.bounds, with_points=settings.search)
        if len(problem.stack) < 2:
            raise LucidError(f"{run.path} has no leave-one-out networks to verify")
        if settings.workers is None and settings.scheduler is None:
            settings = replace(settings, workers=os.cpu_count() or 1)
        executor = _make_executor(problem, settings)
        screen = None if settings.screen == "none" else Screen(problem, settings.screen, settings.device, run.classes)
        search = partial(witness_search.search_class_witness, problem, points=problem.points) if settings.search else None
        log = run.start(workers=executor.capacity, networks=len(problem.stack) - 1,
                        scheduler=None if settings.scheduler is None else str(settings.scheduler))

        def checkpoint(engine: bab_engine.Engine) -> None:
            run.save({str(c): cs.to_json() for c, cs in engine.states.items()})

        def interrupted() -> None:
            if engine is not None:
                checkpoint(engine)  # the anytime bounds so far are sound; resume continues from here

        title = f"lucid verify {run.path.name} ({settings.solver}, {executor.capacity} workers)"
        engine = None
        try:
            with run.interruptible(interrupted):
                with live_display.LiveDisplay(title, enabled=settings.progress) as display:
                    hooks = EngineHooks(screen=None if screen is None else screen.initial,
                                        refine=screen.refine if screen is not None and screen.refines else None,
                                        search=search, on_progress=display.update, on_checkpoint=checkpoint)
                    engine = bab_engine.Engine(executor, run.classes, len(problem.stack), settings,
                                               params=FlatParameters(problem.stack), hooks=hooks, log=log,
                                               states=states, deadline=run.deadline)
                    engine.run()
                    chosen = dict(engine.states)
                    if settings.residual and settings.scheduler is None:
                        again = replace(hooks, on_checkpoint=None)
                        chosen = leakers_moved_in(chosen, problem, settings, executor, again, run.deadline, log)
        finally:
            executor.close()
        residual = _residual_sets(chosen)
        section = write_residual(run.path, residual, settings.residual) if settings.residual else None
        return Verified(_bounds_entries(chosen, engine.elapsed(), residual), residual=section)

    @staticmethod
    def _resumed_states(run: VerificationRun) -> dict[int, ClassState] | None:
        """The class states of the checkpoint a --resume continues (None for a fresh run)."""
        saved = run.saved()
        if saved is None:
            return None
        try:
            states = {int(c): ClassState.from_json(int(c), obj) for c, obj in saved["classes"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise LucidError(f"checkpoint {run.checkpoint_path} is corrupt ({exc!r}); delete it and run "
                             "without --resume") from None
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
        if e.get("event") == "anytime" and e.get("class") in states and e.get("upper") is not None:
            cs = states[e["class"]]
            cs.upper = min(cs.upper, float(e["upper"]))


def _make_executor(problem: VerificationProblem, settings: VerifySettings) -> executors.Executor:
    if settings.scheduler is not None:
        return dask_workers.DaskExecutor(problem, settings, settings.scheduler, settings.workers)
    return executors.local_executor(problem, settings)


def _residual_sets(states: dict[int, ClassState]) -> dict[int, ClassResidual]:
    """Each class's residual set with its members' screened bounds; the engine's upper is its level."""
    out = {}
    for c, cs in states.items():
        if cs.residual is not None:
            out[c] = ClassResidual(cs.upper, cs.residual, cs.screen[cs.residual].astype(np.float64))
    return out


def _bounds_entries(states: dict[int, ClassState], elapsed: float,
                    residual: dict[int, ClassResidual]) -> dict[str, dict]:
    out = {}
    for c, cs in sorted(states.items()):
        out[str(c)] = {
            # over every network: the level, or with a residual set the larger of it and its members' bounds
            "upper": bound_entry_value(residual[c].highest if c in residual else cs.upper, upper=True),
            "lower": bound_entry_value(cs.lower, upper=False),
            "complete": bool(cs.complete),
            # finished without using --gap / --rel-gap (upper = the largest proved node bound)
            "exact": bool(cs.complete and not cs.within_gap),
            "seconds": round(cs.seconds if cs.done else elapsed, 3),
            "nodes": cs.solved,
            "reason": cs.reason,
            "leaking_row": cs.lower_row,
        }
    return out
