"""Branch-and-bound over network sets: `lucid verify` (paper Algorithm 1, LUCID-Compute).

`verify_run` is the Python entry point (the CLI, the demo and the benchmarks call it). It writes
RUN/bounds.json (format lucid-bounds/1), RUN/verify.log.jsonl (lucid.bab.events) and the resume
checkpoint RUN/verify.checkpoint.json (lucid.bab.checkpoint).
"""

from __future__ import annotations

import math
import os
import signal
import threading
from functools import partial
from pathlib import Path
from typing import Any, Callable

from lucid.errors import LucidError

BOUNDS_FILE = "bounds.json"

__all__ = ["verify_run"]


def _check_positive(name: str, value: float | int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LucidError(f"{name} must be a positive number, got {value!r}")


def check_solver(solver: str) -> None:
    """A name (or a '+'-joined cross-check) of installed backends; one-line error otherwise."""
    from lucid.solvers import check_solver_spec

    check_solver_spec(solver)


def parse_classes(classes: Any, num_classes: int) -> list[int]:
    if classes is None:
        return list(range(num_classes))
    if isinstance(classes, str):
        parts = [p.strip() for p in classes.split(",") if p.strip()]
    else:
        parts = list(classes)
    if not parts:
        raise LucidError("--classes is empty")
    out = []
    for p in parts:
        try:
            c = int(p)
        except (TypeError, ValueError):
            raise LucidError(f"class {p!r} is not an integer class id") from None
        if not 0 <= c < num_classes:
            raise LucidError(f"unknown class {c}: this run has classes 0..{num_classes - 1}")
        if c not in out:
            out.append(c)
    return sorted(out)


def _bound_out(v: float | None, *, upper: bool) -> float | None:
    """bounds.json numbers: +inf (nothing proved) -> null; -inf (nothing can leak) -> -1.0."""
    if v is None:
        return None
    if math.isinf(v):
        if v > 0:
            return None
        return -1.0 if upper else None
    return float(v)


def _reconcile_with_log(states: dict, log_path: Path, result_options: dict, fingerprint: str) -> None:
    """Carry over anytime upper bounds logged after the last checkpoint (a kill -9 can fall between
    a solved node's log event and the next checkpoint). Those bounds were proved by MILPs of this
    same verification (the log's last start/resume has the checkpoint's options), so they are
    sound, and the resumed log's anytime upper keeps never rising."""
    from lucid.bab.events import read_events

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


def _terminate_as_interrupt() -> Callable[[], None]:
    """Treat SIGTERM (kill, timeout, a job scheduler) like Ctrl-C: checkpoint, stop the workers,
    exit 130. Returns the function that restores the previous handler (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)


def verify_run(
    run_dir: str | Path,
    *,
    solver: str = "highs",
    workers: int | None = None,
    time_limit: float | None = None,
    node_time_limit: float | None = None,
    classes: Any = None,
    tau: float = 0.01,
    gap: float = 0.0,
    rel_gap: float = 0.0,
    md: bool = True,
    ris: bool = True,
    bab: bool = True,
    naive: bool = False,
    resume: bool = False,
    scheduler: Any = None,
    progress: bool = True,
    screen: bool = True,
    search: bool = True,
    bounds: str = "lp",
) -> dict:
    """Compute per-class iDP decision bounds of a run; writes and returns the bounds.json content."""
    from lucid.atomic import write_json_atomic
    from lucid.bab.checkpoint import CHECKPOINT_FILE, load_checkpoint, run_fingerprint, save_checkpoint
    from lucid.bab.display import LiveDisplay
    from lucid.bab.engine import ClassState, Engine, EngineConfig, default_node_time_limit
    from lucid.bab.events import LOG_FILE, EventLog
    from lucid.bab.workers import DaskExecutor, ProcessExecutor, ThreadExecutor, analyse_with
    from lucid.rundir import BOUNDS_FORMAT, open_run

    _check_positive("--time-limit", time_limit)
    _check_positive("--node-time-limit", node_time_limit)
    _check_positive("--workers", workers)
    if workers is not None and int(workers) != workers:
        raise LucidError(f"--workers must be a whole number, got {workers!r}")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau >= 0):
        raise LucidError(f"--tau must be a non-negative number, got {tau!r}")
    if not (isinstance(gap, (int, float)) and math.isfinite(gap) and gap >= 0):
        raise LucidError(f"--gap must be a non-negative number, got {gap!r}")
    if not (isinstance(rel_gap, (int, float)) and math.isfinite(rel_gap) and rel_gap >= 0):
        raise LucidError(f"--rel-gap must be a non-negative number, got {rel_gap!r}")
    if naive and not bab:
        raise LucidError("--naive and --no-bab are different variants; give at most one")
    check_solver(solver)
    run = open_run(run_dir)
    cls_list = parse_classes(classes, run.num_classes)

    settings = {
        "solver": solver,
        "encoding": {"md": md, "md_pre": md, "coupling": md, "ris": ris, "tau": float(tau), "bounds": bounds},
        "mip_rel_gap": 0.0,
        "mip_abs_gap": 0.0,
    }
    # The options that determine the result: a resume must use the same ones.
    result_options = {
        "solver": solver, "tau": float(tau), "gap": float(gap), "rel_gap": float(rel_gap), "md": md, "ris": ris, "bab": bab,
        "naive": naive, "screen": screen, "search": search, "bounds": bounds, "node_time_limit": node_time_limit,
        "classes": cls_list,
    }
    run_path = Path(run.path)
    ckpt_path = run_path / CHECKPOINT_FILE
    try:
        fingerprint = run_fingerprint(run_path)
    except OSError as exc:
        raise LucidError(f"cannot read the networks of {run_path}: {exc}") from None
    states = None
    elapsed_before = 0.0
    if resume:
        saved = load_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options)
        try:
            states = {int(c): ClassState.from_json(int(c), obj) for c, obj in saved["classes"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise LucidError(f"checkpoint {ckpt_path} is corrupt ({exc!r}); delete it and run without --resume") from None
        if sorted(states) != cls_list:
            raise LucidError(f"checkpoint {ckpt_path} is corrupt (its classes do not match)")
        elapsed_before = float(saved["elapsed"])
        _reconcile_with_log(states, run_path / LOG_FILE, result_options, fingerprint)

    # Only now the expensive part (loading every network, N's bounds): bad input has failed fast.
    from lucid import verifier

    problem = verifier.VerificationProblem.from_run(run, bounds=bounds)
    stack = problem.stack
    num_networks = len(stack)
    if num_networks < 2:
        raise LucidError(f"{run.path} has no leave-one-out networks to verify")
    screen_fn = None
    if screen and hasattr(verifier, "screen_upper_bounds"):
        screen_fn = partial(verifier.screen_upper_bounds, problem)

    search_fn = None
    if search:
        from lucid.bab.witness import search_class_witness

        try:
            points = run.data().get("X_train")
        except LucidError:
            points = None  # the search then samples the domain only
        search_fn = partial(search_class_witness, problem, points=points)
        settings["search"] = not naive
        settings["points"] = points

    if workers is None and scheduler is None:
        workers = os.cpu_count() or 1
    workers = None if workers is None else int(workers)
    # A retry's solver tree is kept for the next retry in the worker (lucid.kept_trees), except on
    # Dask, which decides itself where a task runs.
    settings["keep_trees"] = scheduler is None
    if scheduler is not None:
        executor = DaskExecutor(problem, settings, scheduler, workers)
    elif workers == 1:
        executor = ThreadExecutor(partial(analyse_with, problem, settings), 1)
    else:
        executor = ProcessExecutor(problem, settings, workers)

    # The default node limit derives from this invocation's --time-limit (a resume may give
    # another), so it is not part of result_options.
    config = EngineConfig(bab=bab, naive=naive, gap=float(gap), rel_gap=float(rel_gap), time_limit=time_limit,
                          node_time_limit=node_time_limit if node_time_limit is not None else default_node_time_limit(time_limit))
    log = EventLog(run_path / LOG_FILE, elapsed_before=elapsed_before, append=resume)
    all_options = dict(result_options, workers=executor.capacity, time_limit=time_limit,
                       scheduler=None if scheduler is None else str(scheduler))
    log.emit("resumed" if resume else "started", None, options=all_options, networks=num_networks - 1,
             run_fingerprint=fingerprint)

    def checkpoint(engine: Engine) -> None:
        save_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options, elapsed=engine.elapsed(),
                        classes={str(c): cs.to_json() for c, cs in engine.states.items()})

    def bounds_json(engine: Engine) -> dict:
        out = {}
        for c, cs in sorted(engine.states.items()):
            out[str(c)] = {
                "upper": _bound_out(cs.upper, upper=True),
                "lower": _bound_out(cs.lower, upper=False),
                "complete": bool(cs.complete),
                # finished without using --gap / --rel-gap (upper = the largest proved node bound)
                "exact": bool(cs.complete and not cs.within_gap),
                "seconds": round(cs.seconds if cs.done else engine.elapsed(), 3),
                "nodes": cs.solved,
                "reason": cs.reason,
                "leaking_row": cs.lower_row,
            }
        return {"format": BOUNDS_FORMAT, "solver": solver, "options": all_options, "bounds": out}

    title = f"lucid verify {run_path.name} ({solver}, {executor.capacity} workers)"
    engine = None
    restore = _terminate_as_interrupt()
    try:
        with LiveDisplay(title, enabled=progress) as display:
            engine = Engine(
                executor, cls_list, num_networks, config,
                params=stack.flat_parameters, screen=screen_fn, search=search_fn, log=log,
                on_progress=display.update, on_checkpoint=checkpoint, states=states,
            )
            engine.run()
    except KeyboardInterrupt:
        if engine is not None:
            checkpoint(engine)  # the anytime bounds so far are sound; resume continues from here
        raise
    finally:
        restore()
        executor.close()
        log.close()
    result = bounds_json(engine)
    write_json_atomic(run_path / BOUNDS_FILE, result)
    with EventLog(run_path / LOG_FILE, elapsed_before=engine.elapsed(), append=True) as tail:
        tail.emit("finished", None, bounds=result["bounds"])
    return result
