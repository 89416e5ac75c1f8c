"""Backend registry: name -> solve function, availability, `auto` resolution, result checks."""

from __future__ import annotations

import importlib.util
import logging
import math
from dataclasses import dataclass
from typing import Callable

from lucid.encodings.model import MilpModel
from lucid.errors import LucidError, SolverError, UnsoundSolverResult
from lucid.solvers.base import SolveResult, SolverOptions
from lucid.solvers.replay import REPLAY_TOLERANCE, replay_solution

log = logging.getLogger("lucid.solvers")


@dataclass(frozen=True)
class Backend:
    module: str  # python module that must be importable
    pip: str  # package to install
    load: Callable[[], Callable[..., SolveResult]]


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


BACKENDS: dict[str, Backend] = {
    "highs": Backend("highspy", "highspy", _highs),
    "gurobi": Backend("gurobipy", "gurobipy", _gurobi),
    "cbc": Backend("pulp", "pulp", _cbc),
    "scip": Backend("pyscipopt", "pyscipopt", _scip),
}
SOLVER_NAMES = ("auto", *BACKENDS)


def available_solvers() -> dict[str, bool]:
    """Which backends can be imported here (not whether their licence covers a model)."""
    return {name: importlib.util.find_spec(b.module) is not None for name, b in BACKENDS.items()}


def _check_name(name: str) -> None:
    if name not in SOLVER_NAMES:
        raise LucidError(f"unknown solver {name!r}; valid solvers: {', '.join(SOLVER_NAMES)}")


def resolve_solver(name: str, model: MilpModel) -> str:
    """The concrete backend for `name`; `auto` = gurobi when its licence covers `model`, else highs."""
    _check_name(name)
    if name != "auto":
        return name
    if available_solvers()["gurobi"]:
        from lucid.solvers.gurobi_backend import licence_covers

        if licence_covers(model.num_cols, model.num_rows):
            log.info("solver auto -> gurobi (licence covers %d cols, %d rows)",
                     model.num_cols, model.num_rows)
            return "gurobi"
        log.info("solver auto -> highs (gurobi licence too small for %d cols, %d rows)",
                 model.num_cols, model.num_rows)
    else:
        log.info("solver auto -> highs (gurobipy not installed)")
    return "highs"


def solve(
    model: MilpModel,
    solver: str = "highs",
    options: SolverOptions | None = None,
    *,
    unsafe: bool = False,
    **backend_options: object,
) -> SolveResult:
    """Maximise `model` with `solver`; the result's `upper_bound` is a proved dual bound.

    The incumbent is replayed against the model; one that fails is dropped (and logged). A
    proved bound below a replayed incumbent raises `UnsoundSolverResult` — never returned.
    `backend_options` go to the backend verbatim (e.g. HiGHS option names), for experiments;
    overriding a backend's soundness settings (HiGHS presolve) also needs `unsafe=True`.
    """
    options = options or SolverOptions()
    name = resolve_solver(solver, model)
    backend = BACKENDS[name]
    if not available_solvers()[name]:
        raise SolverError(f"solver {name!r} is not installed: pip install {backend.pip}")
    if name == "highs" and not unsafe:
        from lucid.solvers.highs_backend import SOUND_OPTIONS

        for key, value in backend_options.items():
            if key in SOUND_OPTIONS and value != SOUND_OPTIONS[key]:
                raise LucidError(
                    f"highs option {key}={value!r} is known to give unsound bounds "
                    f"(pass unsafe=True only for experiments)"
                )
    result = backend.load()(model, options, backend_options or None)
    return check_result(model, result)


def check_result(model: MilpModel, result: SolveResult) -> SolveResult:
    """Replay the incumbent; reconcile it with the proved bound (see `solve`)."""
    if result.solution is None:
        result.incumbent = None
        return result
    report = replay_solution(model, result.solution)
    if not report.ok(REPLAY_TOLERANCE):
        log.warning(
            "%s: incumbent fails replay (row %.2e, bound %.2e, integrality %.2e); dropped",
            result.solver, report.max_row_violation, report.max_bound_violation,
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
