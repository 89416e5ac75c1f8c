"""MILP backends: one `solve()` for HiGHS, Gurobi, CBC (PuLP) and SCIP, all reporting proved bounds."""

from lucid.errors import SolverError, UnsoundSolverResult
from lucid.solvers.base import (
    ERROR,
    INFEASIBLE,
    OPTIMAL,
    TIME_LIMIT,
    SolveResult,
    SolverOptions,
)
from lucid.solvers.mps import read_mps, write_mps
from lucid.solvers.registry import (
    SOLVER_NAMES,
    available_solvers,
    check_result,
    check_solver_spec,
    resolve_solver,
    resume,
    solve,
)

__all__ = [
    "ERROR",
    "INFEASIBLE",
    "OPTIMAL",
    "SOLVER_NAMES",
    "TIME_LIMIT",
    "SolveResult",
    "SolverError",
    "SolverOptions",
    "UnsoundSolverResult",
    "available_solvers",
    "check_result",
    "check_solver_spec",
    "read_mps",
    "resolve_solver",
    "resume",
    "solve",
    "write_mps",
]
