"""What makes a solver's answer a sound bound, in one place.

- `safety_margin`: added to every dual bound (solver tolerances through big-M rows, rounding);
- `slack`: how far below a lower bound a model's beta floor sits, so tolerances never cut a point off;
- `user_bound`: a solve's dual bound plus the margin, +inf when nothing was proved;
- `contradicts`: a proved bound below a replayed leaking witness is a solver failure, never a result;
- `solve_checked` / `retry_other`: such failures go to the other installed backends, in the
  registry's fallback order, and a node with no consistent backend claims nothing (+inf).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from lucid.errors import UnsoundSolverResult
from lucid.milp.model import MilpModel
from lucid.witness.replay import LeakWitness
from lucid.solvers.base import ERROR, SolveResult, SolverOptions
from lucid.solvers.registry import fallback_order

log = logging.getLogger(__name__)

MARGIN_ABS = 1e-6
MARGIN_REL = 1e-6
MARGIN_FEAS = 1e-7  # times the largest big-M constant of the model


def safety_margin(bound: float, model: MilpModel) -> float:
    """What the user-visible bound adds to a solver's dual bound, and why it suffices.

    The dual bound comes from LPs solved in floating point with primal/dual feasibility
    tolerances of ~1e-7 (HiGHS, Gurobi, SCIP defaults on our scaled models). A violation of
    size eps in a big-M row lets a neuron move by eps, and a neuron moves the objective by at
    most its (bounded) weight path, so the error is of order eps * (largest big-M); the
    absolute and relative terms cover rounding of the objective itself. The margin only ever
    loosens the bound (it is a few 1e-6 on bounds of order 1e-3..1).
    """
    finite = np.concatenate([model.col_lower, model.col_upper])
    finite = finite[np.isfinite(finite)]
    big_m = float(np.abs(finite).max()) if finite.size else 0.0
    return MARGIN_ABS + MARGIN_REL * abs(bound) + MARGIN_FEAS * big_m

def slack(lb: float) -> float:
    """LB loosened so that solver tolerances never turn beta >= LB into a false infeasibility.

    The relative part keeps the slab beta in [LB - slack, beta*] from being numerically thin:
    HiGHS once cut a slab 1.3e-5 thick away at the root (see `lucid.node.analyse`)."""
    return lb - 1e-5 * (1 + abs(lb)) - 1e-2 * abs(lb) if math.isfinite(lb) else -math.inf

def user_bound(result: SolveResult, model: MilpModel) -> float:
    """The solver's dual bound plus the safety margin; +inf when the solve proved nothing."""
    if result.status == ERROR:
        return math.inf
    ub = result.upper_bound
    return ub + safety_margin(ub, model) if math.isfinite(ub) else ub


def contradicts(bound: float, witness: LeakWitness | None) -> bool:
    """Whether a replayed leaking witness lies above a "proved" upper bound (a solver failure)."""
    return witness is not None and witness.confidence > bound


def solve_checked(model: MilpModel, solver: str, options: SolverOptions, keep: bool = False,
                   tree: object | None = None) -> SolveResult:
    """Solve (or continue the kept `tree` of this model); a result the solver layer proves unsound
    is retried from scratch with other backends."""
    from lucid.solvers import resume, solve

    try:
        return resume(tree, options) if tree is not None else solve(model, solver, options, keep=keep)
    except UnsoundSolverResult as exc:
        log.error("UNSOUND solver result, falling back: %s", exc)
    for other in fallback_order(solver):
        try:
            return solve(model, other, options)
        except UnsoundSolverResult as exc:
            log.error("UNSOUND solver result from fallback %s: %s", other, exc)
        except Exception as exc:  # e.g. licence too small: try the next one
            log.warning("fallback solver %s failed: %s", other, exc)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="every solver was unsound")

def retry_other(model: MilpModel, solver: str, options: SolverOptions, witness: LeakWitness) -> SolveResult:
    from lucid.solvers import solve

    for other in fallback_order(solver):
        try:
            result = solve(model, other, options)
        except Exception as exc:
            log.warning("fallback solver %s failed: %s", other, exc)
            continue
        if not contradicts(user_bound(result, model), witness):
            return result
        log.error("fallback solver %s is also below the replayed witness", other)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="bound below a replayed witness")
