"""Backend registry: name -> solve function, availability, `auto` resolution, result checks."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from lucid.errors import LucidError, SolverError, UnsoundSolverResult
from lucid.milp.model import MilpModel
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, KeptSolve, SolveResult, SolverOptions
from lucid.solvers.solution_check import REPLAY_TOLERANCE, replay_solution

log = logging.getLogger("lucid.solvers")


@dataclass(frozen=True)
class Backend:
    module: str  # python module that must be importable
    pip: str  # package to install
    load: Callable[[], Callable[..., SolveResult]]
    resumable: bool = False  # takes keep=True and hands back a continuable `SolveResult.tree`
    # where it stands when another backend's bound must be re-checked (lower first; None: never)
    fallback_rank: int | None = None
    # options a caller may not override without unsafe=True (known to give unsound bounds)
    guarded: Callable[[], dict] | None = None


def _highs():
    from lucid.solvers.highs_backend import solve_highs

    return solve_highs


def _gurobi():
    from lucid.solvers.gurobi_backend import solve_gurobi

    return solve_gurobi


def _cbc():
    from lucid.solvers.cbc_backend import solve_cbc

    return solve_cbc


def _scip():
    from lucid.solvers.scip_backend import solve_scip

    return solve_scip


def _highs_guarded() -> dict:
    from lucid.solvers.highs_backend import SOUND_OPTIONS

    return SOUND_OPTIONS


# Fallbacks re-solve a model whose bound failed a check: SCIP and Gurobi first, being independent
# of HiGHS (whose MIP presolve has proved a wrong optimum on one of our models); CBC, the slowest,
# runs as a subprocess on MPS files and is no fallback.
BACKENDS: dict[str, Backend] = {
    "highs": Backend("highspy", "highspy", _highs, fallback_rank=2, guarded=_highs_guarded),
    "gurobi": Backend("gurobipy", "gurobipy", _gurobi, resumable=True, fallback_rank=1),
    "cbc": Backend("pulp", "pulp", _cbc),
    "scip": Backend("pyscipopt", "pyscipopt", _scip, fallback_rank=0),
}
SOLVER_NAMES = ("auto", *BACKENDS)


def available_solvers() -> dict[str, bool]:
    """Which backends can be imported here (not whether their licence covers a model)."""
    return {name: importlib.util.find_spec(b.module) is not None for name, b in BACKENDS.items()}


def fallback_order(exclude: str) -> list[str]:
    """The installed backends to re-check a failed solve of `exclude` with, in order."""
    avail = available_solvers()
    ranked = sorted(
        (b.fallback_rank, name)
        for name, b in BACKENDS.items()
        if b.fallback_rank is not None and name != exclude and avail[name]
    )
    return [name for _, name in ranked]


def _check_name(name: str) -> None:
    if name not in SOLVER_NAMES:
        raise LucidError(f"unknown solver {name!r}; valid solvers: {', '.join(SOLVER_NAMES)}")


def check_solver_spec(spec: str) -> list[str]:
    """Validate a solver spec — a name, or names joined by '+' for a cross-check — and return its parts.

    Unknown names raise LucidError; a backend that is not installed raises SolverError naming
    the package to install.
    """
    parts = [p.strip() for p in str(spec).split("+")]
    if not all(parts):
        raise LucidError(f"invalid solver {spec!r}; use a name ({', '.join(SOLVER_NAMES)}) or names joined by '+'")
    avail = available_solvers()
    for name in parts:
        _check_name(name)
        if name != "auto" and not avail[name]:
            raise SolverError(f"solver {name!r} is not installed: pip install {BACKENDS[name].pip}")
    return parts


def _cross_check(
    model: MilpModel, names: list[str], options: SolverOptions, unsafe: bool, backend_options: dict
) -> SolveResult:
    """Solve with every backend of a cross-check and keep the *largest* proved bound.

    Why: one backend's branch-and-bound can be wrong (HiGHS has proved a bound below the true
    optimum on a model of ours even with presolve off), and two independent implementations
    are unlikely to be wrong the same way. The maximum of the bounds is sound as soon as one
    backend is; a backend that fails contributes +inf (nothing proved), never a number. The
    backends share the time limit: each gets an equal part of what the ones before it left.
    """
    results: list[SolveResult] = []
    started = time.perf_counter()
    for i, name in enumerate(names):
        share = options
        if options.time_limit is not None:
            left = options.time_limit - (time.perf_counter() - started)
            share = dataclasses.replace(options, time_limit=max(0.1, left / (len(names) - i)))
        try:
            results.append(solve(model, name, share, unsafe=unsafe, **backend_options))
        except UnsoundSolverResult:
            raise
        except LucidError as exc:  # e.g. a licence too small for this model
            results.append(SolveResult(status=ERROR, upper_bound=math.inf, solver=name, message=str(exc)))
    with_solution = [r for r in results if r.solution is not None]
    best = (
        max(with_solution, key=lambda r: -math.inf if r.incumbent is None else r.incumbent) if with_solution else None
    )
    bounds = [r.upper_bound for r in results]
    upper = max(bounds)
    if all(r.status == INFEASIBLE for r in results):
        status = INFEASIBLE
    elif any(r.status == ERROR for r in results):
        status = ERROR
    elif all(r.status in (OPTIMAL, INFEASIBLE) for r in results):
        status = OPTIMAL
    else:
        status = TIME_LIMIT
    combined = SolveResult(
        status=status,
        upper_bound=upper,
        incumbent=None if best is None else best.incumbent,
        solution=None if best is None else best.solution,
        nodes=sum(r.nodes for r in results),
        seconds=sum(r.seconds for r in results),
        solver="+".join(names),
        message="; ".join(f"{r.solver}: {r.message}" for r in results if r.message),
        stats={"cross_check": {r.solver: r.to_json() for r in results}},
    )
    spread = upper - min(bounds) if all(math.isfinite(b) for b in bounds) else None
    if spread is not None and spread > 1e-6 * max(1.0, abs(upper)) and status == OPTIMAL:
        log.warning(
            "cross-check: proved bounds disagree (%s); keeping the largest",
            ", ".join(f"{r.solver}={r.upper_bound:.9g}" for r in results),
        )
    return combined


def resolve_solver(name: str, model: MilpModel) -> str:
    """The concrete backend for `name`; `auto` = gurobi when its licence covers `model`, else highs."""
    _check_name(name)
    if name != "auto":
        return name
    if available_solvers()["gurobi"]:
        from lucid.solvers.gurobi_backend import gurobi_size, licence_covers

        if licence_covers(*gurobi_size(model)):
            log.info("solver auto -> gurobi (licence covers %d cols, %d rows)", model.num_cols, model.num_rows)
            return "gurobi"
        log.info("solver auto -> highs (gurobi licence too small for %d cols, %d rows)", model.num_cols, model.num_rows)
    else:
        log.info("solver auto -> highs (gurobipy not installed)")
    return "highs"


def solve(
    model: MilpModel,
    solver: str = "highs",
    options: SolverOptions | None = None,
    *,
    unsafe: bool = False,
    keep: bool = False,
    **backend_options: object,
) -> SolveResult:
    """Maximise `model` with `solver`; the result's `upper_bound` is a proved dual bound.

    The incumbent is replayed against the model; one that fails is dropped (and logged). A
    proved bound below a replayed incumbent raises `UnsoundSolverResult` — never returned.
    `backend_options` go to the backend verbatim (e.g. HiGHS option names), for experiments;
    overriding a backend's soundness settings (HiGHS presolve) also needs `unsafe=True`.
    `keep`: ask a backend that can (Gurobi) to hand back a time-limited MIP as `result.tree`, to be
    continued with `resume`; other backends ignore it.
    """
    options = options or SolverOptions()
    if "+" in solver:
        return _cross_check(model, check_solver_spec(solver), options, unsafe, backend_options)
    name = resolve_solver(solver, model)
    backend = BACKENDS[name]
    if not available_solvers()[name]:
        raise SolverError(f"solver {name!r} is not installed: pip install {backend.pip}")
    if backend.guarded is not None and not unsafe:
        guarded = backend.guarded()
        for key, value in backend_options.items():
            if key in guarded and value != guarded[key]:
                raise LucidError(
                    f"{name} option {key}={value!r} is known to give unsound bounds "
                    f"(pass unsafe=True only for experiments)"
                )
    resume_args = {"keep": True} if keep and backend.resumable else {}
    result = backend.load()(model, options, backend_options or None, **resume_args)
    try:
        return check_result(model, result)
    except BaseException:
        _release(result)
        raise


def resume(tree: KeptSolve, options: SolverOptions) -> SolveResult:
    """Continue a kept solve (`SolveResult.tree`); its result is checked like any other, and it is
    kept again only while it still stops at its time limit."""
    result = tree.resume(options)
    if result.status == TIME_LIMIT:
        result.tree = tree
    else:
        tree.release()
    try:
        return check_result(tree.model, result)
    except BaseException:
        _release(result)
        raise


def _release(result: SolveResult) -> None:
    if result.tree is not None:
        result.tree.release()
        result.tree = None


def check_result(model: MilpModel, result: SolveResult) -> SolveResult:
    """Replay the incumbent; reconcile it with the proved bound (see `solve`) and set the gap.

    The gap is computed here, once for every backend, from the *replayed* objective.
    """
    if result.solution is None:
        result.incumbent, result.gap = None, None
        return result
    report = replay_solution(model, result.solution)
    if not report.ok(REPLAY_TOLERANCE):
        log.warning(
            "%s: incumbent fails replay (row %.2e, bound %.2e, integrality %.2e); dropped",
            result.solver,
            report.max_row_violation,
            report.max_bound_violation,
            report.max_integrality_violation,
        )
        result.stats["dropped_incumbent"] = result.incumbent
        result.solution, result.incumbent, result.gap = None, None, None
        return result
    result.incumbent = report.objective
    slack = REPLAY_TOLERANCE * max(1.0, abs(report.objective))
    if result.upper_bound < report.objective - slack:
        raise UnsoundSolverResult(
            f"{result.solver} reported bound {result.upper_bound!r} ({result.status}) below a "
            f"replayed solution of objective {report.objective!r}"
        )
    # Within tolerance the replayed objective is still a valid floor for the true optimum
    # (up to feasibility tolerance), so never report less than it.
    result.upper_bound = max(result.upper_bound, report.objective)
    if math.isfinite(result.upper_bound):
        result.gap = (result.upper_bound - report.objective) / max(abs(result.upper_bound), 1e-10)
    return result
