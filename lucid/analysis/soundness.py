"""What makes a solver's answer a sound bound, in one place.

- `safety_margin`: added to every dual bound (solver tolerances through big-M rows, rounding);
- `slack`: how far below a lower bound a model's beta floor sits, so tolerances never cut a point off;
- `user_bound`: a solve's dual bound plus the margin, +inf when nothing was proved;
- `contradicts`: a proved bound below a replayed leaking witness is a solver failure, never a result;
- `solve_checked` / `retry_other`: such failures go to the other installed backends, in the
  registry's fallback order, and a node with no consistent backend claims nothing (+inf).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from lucid.errors import UnsoundSolverResult
from lucid.milp.model import MilpModel
from lucid.network import UNIT_ROUNDOFF, float_gamma
from lucid.solvers.base import ERROR, KeptSolve, SolveResult, SolverOptions
from lucid.solvers.registry import fallback_order
from lucid.witness.replay import LeakWitness

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
    HiGHS once cut a slab 1.3e-5 thick away at the root (see `lucid.analysis.analyse`)."""
    return lb - 1e-5 * (1 + abs(lb)) - 1e-2 * abs(lb) if math.isfinite(lb) else -math.inf


def user_bound(result: SolveResult, model: MilpModel) -> float:
    """The solver's dual bound plus the safety margin, in score units (the margin is taken in the
    model's own units, where the solvers' tolerances act); +inf when the solve proved nothing."""
    if result.status == ERROR:
        return math.inf
    ub = result.upper_bound
    return (ub + safety_margin(ub, model)) * model.objective_scale if math.isfinite(ub) else ub


def contradicts(bound: float, witness: LeakWitness | None) -> bool:
    """Whether a replayed leaking witness lies above a "proved" upper bound (a solver failure)."""
    return witness is not None and witness.confidence > bound


def solve_checked(
    model: MilpModel, solver: str, options: SolverOptions, keep: bool = False, tree: KeptSolve | None = None
) -> SolveResult:
    """Solve (or continue the kept `tree` of this model); a result the solver layer proves unsound
    is retried from scratch with other backends."""
    from lucid.solvers import resume, solve

    started = time.perf_counter()
    try:
        return resume(tree, options) if tree is not None else solve(model, solver, options, keep=keep)
    except UnsoundSolverResult as exc:
        log.error("UNSOUND solver result, falling back: %s", exc)
    for other in fallback_order(solver):
        try:
            return solve(model, other, _rest_of(options, started))
        except UnsoundSolverResult as exc:
            log.error("UNSOUND solver result from fallback %s: %s", other, exc)
        except Exception as exc:  # noqa: BLE001 (e.g. licence too small: try the next one)
            log.warning("fallback solver %s failed: %s", other, exc)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="every solver was unsound")


def retry_other(
    model: MilpModel, solver: str, options: SolverOptions, witness: LeakWitness, started: float | None = None
) -> SolveResult:
    """The model solved by the other backends in turn (a replayed `witness` lies above the first
    one's bound) until one is consistent with the witness; together within what is left of
    `options.time_limit` since `started` (time.perf_counter(); default: now)."""
    from lucid.solvers import solve

    started = time.perf_counter() if started is None else started
    for other in fallback_order(solver):
        try:
            result = solve(model, other, _rest_of(options, started))
        except Exception as exc:  # noqa: BLE001 (any failure of a fallback solver: try the next one)
            log.warning("fallback solver %s failed: %s", other, exc)
            continue
        if not contradicts(user_bound(result, model), witness):
            return result
        log.error("fallback solver %s is also below the replayed witness", other)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="bound below a replayed witness")


def _rest_of(options: SolverOptions, started: float) -> SolverOptions:
    """`options` with what is left of their time limit since `started` (time.perf_counter()): a
    fallback solve replaces the one that failed within that one's limit, it does not add another
    (at least FALLBACK_MIN_TIME, so it still reports a bound)."""
    if options.time_limit is None:
        return options
    left = options.time_limit - (time.perf_counter() - started)
    return dataclasses.replace(options, time_limit=max(FALLBACK_MIN_TIME, left))


FALLBACK_MIN_TIME = 0.1


# -- what the access layer may release -------------------------------------------------------
#
# Every bound above is about exact (real-number) arithmetic: beta_c >= C_N(x) for every leaking x.
# The access layer decides with N's confidence computed in float64, which can differ from the
# exact one by a few ulps of the scores summed. When N' is one float32 step away from N, beta_c
# can lie within 1e-17 of the true value, so a float confidence a rounding error above beta_c
# would release a leaking input. The release rule therefore asks for a margin E_N that bounds
# the float error of N's confidence anywhere in the verified domain.


def confidence_error(
    weights: list[np.ndarray], biases: list[np.ndarray], lower: np.ndarray, upper: np.ndarray
) -> float:
    """A bound on |float64 confidence - exact confidence| of one network at any x in [lower, upper].

    weights[k] is [out, in] (ReLU between layers, none after the last). A float layer
    zhat = fl(W hhat + b) errs from the exact W hhat + b by at most g (|W| |hhat| + |b|) with
    g = gamma_(fan-in + 1); an error e in hhat moves z by at most |W| e, and ReLU does not grow
    it. An enclosure of the float activations gives |hhat| (interval arithmetic, padded by the
    same g so its own rounding stays inside). The confidence s_c - max_(t != c) s_t adds the
    error of two scores and one rounded subtraction. Everything is doubled: the bound's own
    float evaluation and a float argmax that picks another runner-up stay inside it.
    Non-finite parameters give +inf (nothing can be released on their strength).
    """
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    err = np.zeros_like(lo)
    last = len(weights) - 1
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        w, b = np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)
        g = float_gamma(w.shape[1] + 1)
        with np.errstate(all="ignore"):
            size = np.maximum(np.abs(lo), np.abs(hi))
            magnitude = np.abs(w) @ size + np.abs(b)
            err = np.abs(w) @ err + g * magnitude
            centre, radius = (lo + hi) / 2, (hi - lo) / 2
            mid = w @ centre + b
            spread = np.abs(w) @ radius + err + 2 * g * magnitude
            lo, hi = mid - spread, mid + spread
            if k < last:
                lo, hi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
    with np.errstate(all="ignore"):
        scores = np.maximum(np.abs(lo), np.abs(hi))
        total = 2.0 * (2.0 * float(err.max()) + 2.0 * UNIT_ROUNDOFF * float(scores.max()))
    return total if math.isfinite(total) else math.inf


def release_thresholds(upper: np.ndarray, error: float) -> np.ndarray:
    """Per class, the float confidence above which N's label may be released: max(beta_c, 0) + E_N,
    rounded up. Above it the exact confidence exceeds max(beta_c, 0): N's exact label is the float
    one and no network disagrees with it (beta_c = +inf: never; no leak at all: still > E_N)."""
    with np.errstate(invalid="ignore"):
        floor = np.maximum(np.asarray(upper, dtype=np.float64), 0.0) + error
    floor = np.where(np.isnan(floor), np.inf, floor)
    return np.nextafter(floor, np.inf)
