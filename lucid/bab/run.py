"""`verify_run`: one verification of a run directory, from its settings to RUN/bounds.json.

It opens the run, checks a resume against the checkpoint, builds the verification problem, the
executor and the engine from one `VerifySettings`, and writes RUN/bounds.json (lucid-bounds/1),
RUN/verify.log.jsonl (lucid.bab.events) and the resume checkpoint (lucid.bab.checkpoint).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

# Engine, LiveDisplay, the executors and the class-level witness search are looked up through
# their modules at call time, so a test or a benchmark can substitute them.
import lucid.bab.dask_workers as dask_workers
import lucid.bab.display as live_display
import lucid.bab.engine as bab_engine
import lucid.bab.workers as executors
import lucid.witness.search as witness_search
from lucid.bab.agt_run import verify_box
from lucid.bab.checkpoint import CHECKPOINT_FILE, load_checkpoint, run_fingerprint, save_checkpoint
from lucid.bab.events import LOG_FILE, EventLog, read_events
from lucid.bab.partition import FlatParameters
from lucid.bab.regions import verify_regions
from lucid.bab.session import terminate_as_interrupt
from lucid.bab.state import ClassState
from lucid.errors import LucidError
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen
from lucid.residual import ClassResidual, write_residual
from lucid.rundir import bound_entry_value, open_run, write_bounds
from lucid.settings import VerifySettings, settings_with_options


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
    if settings.workers == 1:
        return executors.ThreadExecutor(lambda *args, **kw: executors.analyse_with(problem, settings, *args, **kw), 1)
    return executors.ProcessExecutor(problem, settings, settings.workers)


def _residual_sets(engine: bab_engine.Engine) -> dict[int, ClassResidual]:
    """Each class's residual set with its members' screened bounds; the engine's upper is its level."""
    out = {}
    for c, cs in engine.states.items():
        if cs.residual is not None:
            out[c] = ClassResidual(cs.upper, cs.residual, cs.screen[cs.residual].astype(np.float64))
    return out


def _bounds_entries(engine: bab_engine.Engine, residual: dict[int, ClassResidual]) -> dict[str, dict]:
    out = {}
    for c, cs in sorted(engine.states.items()):
        out[str(c)] = {
            # over every network: the level, or with a residual set the larger of it and its members' bounds
            "upper": bound_entry_value(residual[c].highest if c in residual else cs.upper, upper=True),
            "lower": bound_entry_value(cs.lower, upper=False),
            "complete": bool(cs.complete),
            # finished without using --gap / --rel-gap (upper = the largest proved node bound)
            "exact": bool(cs.complete and not cs.within_gap),
            "seconds": round(cs.seconds if cs.done else engine.elapsed(), 3),
            "nodes": cs.solved,
            "reason": cs.reason,
            "leaking_row": cs.lower_row,
        }
    return out


def verify_run(run_dir: str | Path, settings: VerifySettings | None = None, **options: Any) -> dict:
    """Compute per-class iDP decision bounds of a run; writes and returns the bounds.json content.
    With `hyper="agt:K"` the bounds hold for every data set within K removed rows (`lucid.bab.agt_run`).

    Options are a `VerifySettings` or its fields as keywords (`verify_run(run, time_limit=180)`)."""
    started = time.monotonic()  # --time-limit counts the whole invocation: N's bounds and screens too
    if settings is None:
        settings = VerifySettings.from_options(**options)
    elif options:
        settings = settings_with_options(settings, "verify", options)
    run = open_run(run_dir)
    classes = settings.resolve_classes(run.num_classes)
    if settings.residual > run.train_size:
        raise LucidError(f"--residual {settings.residual} exceeds the run's {run.train_size} leave-one-out networks")
    result_options = settings.result_options(classes)
    run_path = Path(run.path)
    ckpt_path = run_path / CHECKPOINT_FILE
    try:
        fingerprint = run_fingerprint(run_path)
    except OSError as exc:
        raise LucidError(f"cannot read the networks of {run_path}: {exc}") from None
    if settings.removals:  # --hyper agt:K: one MILP per class over the AGT box, no branch-and-bound
        return verify_box(run, settings, classes, result_options, fingerprint)
    if settings.regions > 1:  # per-box bounds (lucid.bab.regions)
        return verify_regions(run, settings, classes, result_options, fingerprint)
    states = None
    elapsed_before = 0.0
    if settings.resume:
        saved = load_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options)
        try:
            states = {int(c): ClassState.from_json(int(c), obj) for c, obj in saved["classes"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise LucidError(f"checkpoint {ckpt_path} is corrupt ({exc!r}); delete it and run without --resume") from None
        if sorted(states) != classes:
            raise LucidError(f"checkpoint {ckpt_path} is corrupt (its classes do not match)")
        elapsed_before = float(saved["elapsed"])
        _reconcile_with_log(states, run_path / LOG_FILE, result_options, fingerprint)

    # Only now the expensive part (loading every network, N's bounds): bad input has failed fast.
    problem = VerificationProblem.from_run(run, bounds=settings.bounds, with_points=settings.search)
    if len(problem.stack) < 2:
        raise LucidError(f"{run.path} has no leave-one-out networks to verify")
    if settings.workers is None and settings.scheduler is None:
        settings = replace(settings, workers=os.cpu_count() or 1)
    executor = _make_executor(problem, settings)
    screen = None if settings.screen == "none" else Screen(problem, settings.screen, settings.device, classes)
    search = partial(witness_search.search_class_witness, problem, points=problem.points) if settings.search else None

    log = EventLog(run_path / LOG_FILE, elapsed_before=elapsed_before, append=settings.resume)
    all_options = dict(result_options, workers=executor.capacity, time_limit=settings.time_limit,
                       scheduler=None if settings.scheduler is None else str(settings.scheduler))
    log.emit("resumed" if settings.resume else "started", None, options=all_options, settings=settings.to_json(),
             networks=len(problem.stack) - 1,
             run_fingerprint=fingerprint)

    def checkpoint(engine: bab_engine.Engine) -> None:
        save_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options, elapsed=engine.elapsed(),
                        classes={str(c): cs.to_json() for c, cs in engine.states.items()})

    title = f"lucid verify {run_path.name} ({settings.solver}, {executor.capacity} workers)"
    engine = None
    restore = terminate_as_interrupt()
    try:
        with live_display.LiveDisplay(title, enabled=settings.progress) as display:
            engine = bab_engine.Engine(
                executor, classes, len(problem.stack), settings, params=FlatParameters(problem.stack),
                screen=None if screen is None else screen.initial,
                refine=screen.refine if screen is not None and screen.refines else None, search=search, log=log,
                on_progress=display.update, on_checkpoint=checkpoint, states=states, started=started)
            engine.run()
    except KeyboardInterrupt:
        if engine is not None:
            checkpoint(engine)  # the anytime bounds so far are sound; resume continues from here
        raise
    finally:
        restore()
        executor.close()
        log.close()
    residual = _residual_sets(engine)
    section = write_residual(run_path, residual, settings.residual) if settings.residual else None
    result = write_bounds(run_path, _bounds_entries(engine, residual), solver=settings.solver, options=all_options,
                          residual=section)
    with EventLog(run_path / LOG_FILE, elapsed_before=engine.elapsed(), append=True) as tail:
        tail.emit("finished", None, bounds=result["bounds"])
    return result
