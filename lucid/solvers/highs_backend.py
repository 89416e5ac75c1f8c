"""HiGHS backend (highspy), shipped in a configuration that is sound on our regression fixture.

Why presolve is off: HiGHS 1.15.1 with MIP presolve on reports status Optimal with a bound
below the true optimum on `singleton-crypto-2x50.mps` (see ../shared/fixtures/README.md and
tests/solvers/test_solvers_fixture.py); turning off restarts, symmetry detection or any single presolve
rule group does not fix it (benchmarks/solver_fixture.py). With presolve off HiGHS stays above
the true value on that model. `SOUND_OPTIONS` is the single place where this is decided.

Caveat, measured: the wrong bound comes from HiGHS's branch-and-bound, not from an invalid
presolve reduction — on the model HiGHS's presolve produces, Gurobi still proves beta* while
HiGHS *with presolve off* again drops below it (`--presolved` in the benchmark). So presolve off
avoids the known trigger, it does not make HiGHS trustworthy; callers keep replaying witnesses
and cross-checking with another backend where it matters.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from lucid.milp.model import MilpModel
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions
from lucid.solvers.highs_instance import new_highs

# Options that keep HiGHS sound on our fixture; callers may add more via `extra`, never remove.
SOUND_OPTIONS: dict[str, object] = {"presolve": "off"}

# focus="bound": no primal heuristics (they find incumbents; LUCID gets its lower bounds from
# replayed witnesses). Only the search for solutions changes, not what is proved.
BOUND_FOCUS_OPTIONS: dict[str, object] = {
    "mip_heuristic_effort": 0.0,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_root_reduced_cost": False,
}

# HiGHS runs every solve of the process on one global task scheduler whose thread count is
# fixed by the first solve; a later solve asking for another count fails ("Not Set"), and
# resetting the scheduler is not safe while other Python threads solve. So the first request
# fixes the count for the process and later ones reuse it (threads only affect speed); if
# code outside LUCID started the scheduler first, we fall back to threads=0 ("use it").
_scheduler_lock = threading.Lock()
_scheduler_threads: int | None = None


def _process_threads(requested: int, force: bool = False) -> int:
    global _scheduler_threads  # noqa: PLW0603 (one count per process: see above)
    with _scheduler_lock:
        if _scheduler_threads is None or force:
            _scheduler_threads = requested
        return _scheduler_threads


def _watch(h, stop, t0: float, seen: dict) -> None:
    """At each of h's MIP interrupt checks (every few hundred ms): record when the root node ended
    (the first check with a node count, for the node profile) and end the solve once `stop` (a
    `threading.Event` or None) is set. HiGHS releases the GIL while it solves, so the thread that
    sets `stop` keeps running."""

    def check(event) -> None:
        if "root_seconds" not in seen and event.data_out.mip_node_count > 0:
            seen["root_seconds"] = time.perf_counter() - t0
        if stop is not None and stop.is_set():
            event.interrupt()

    h.cbMipInterrupt += check
    if stop is not None:  # the root's LPs check only this one

        def check_lp(event) -> None:
            if stop.is_set():
                event.interrupt()

        h.cbSimplexInterrupt += check_lp


def solve_highs(model: MilpModel, options: SolverOptions, extra: dict[str, object] | None = None) -> SolveResult:
    import highspy

    from lucid.solvers.mps import to_highs_lp

    t0 = time.perf_counter()
    h = new_highs(output=bool(options.verbose))
    focus = BOUND_FOCUS_OPTIONS if options.focus == "bound" else {}
    for key, value in {**focus, **SOUND_OPTIONS, **(extra or {})}.items():
        h.setOptionValue(key, value)
    if options.time_limit is not None:
        h.setOptionValue("time_limit", float(max(options.time_limit, 0.0)))
    threads = _process_threads(int(options.threads))
    h.setOptionValue("threads", threads)
    h.setOptionValue("mip_rel_gap", float(options.mip_rel_gap))
    h.setOptionValue("mip_abs_gap", float(options.mip_abs_gap))
    h.passModel(to_highs_lp(model))
    seen: dict = {}
    if model.integrality.any():
        _watch(h, options.stop, t0, seen)
    build_seconds = time.perf_counter() - t0
    run_status = h.run()
    if (
        run_status == highspy.HighsStatus.kError
        and threads != 0
        and h.getModelStatus() == highspy.HighsModelStatus.kNotset
    ):
        # Someone else (e.g. an LP bound tightener calling highspy directly) started the
        # scheduler with another thread count; threads=0 runs on whatever scheduler exists.
        threads = _process_threads(0, force=True)
        h.setOptionValue("threads", threads)
        h.run()
    seconds = time.perf_counter() - t0

    MS = highspy.HighsModelStatus
    status = h.getModelStatus()
    info = h.getInfo()
    is_mip = bool(model.integrality.any())
    has_solution = info.primal_solution_status == highspy.kSolutionStatusFeasible
    solution = np.asarray(h.getSolution().col_value, dtype=np.float64) if has_solution else None
    incumbent = float(info.objective_function_value) if has_solution else None
    nodes = max(int(info.mip_node_count), 0) if is_mip else 0
    dual = float(info.mip_dual_bound) if is_mip else math.inf
    if not math.isfinite(dual) and is_mip and status == MS.kOptimal and incumbent is not None:
        dual = incumbent  # MIP solved without branching: the bound is the optimum itself
    message = h.modelStatusToString(status)

    if status == MS.kOptimal:
        code = OPTIMAL
        upper = dual if is_mip else float(info.objective_function_value)
    elif status == MS.kInfeasible:
        code, upper, solution, incumbent = INFEASIBLE, -math.inf, None, None
    elif status == MS.kTimeLimit or (status == MS.kInterrupt and options.stop is not None and options.stop.is_set()):
        code = TIME_LIMIT  # stopped from outside (`SolverOptions.stop`): its bound is as valid as at a time limit
        # A MIP's B&B dual bound is valid whenever HiGHS reports one; an LP's is not tracked.
        upper = dual if is_mip and math.isfinite(dual) else math.inf
    else:
        # Unbounded, unbounded-or-infeasible, interrupt, solution/iteration limit, numerical
        # trouble, unknown: nothing is proved, whatever HiGHS's bound field holds.
        code, upper = ERROR, math.inf
    if code == OPTIMAL and (upper is None or math.isnan(upper)):
        code, upper = ERROR, math.inf
    return SolveResult(
        status=code,
        upper_bound=upper,
        incumbent=incumbent,
        solution=solution,
        nodes=nodes,
        seconds=seconds,
        solver="highs",
        message=message,
        stats={"build_seconds": build_seconds, "highs_status": message, "threads": threads, **seen},
    )
