"""LP-based tightening of pre-activation bounds, layer by layer, with rigorous dual bounds.

Layer k's bounds are the max/min of each neuron over the triangle relaxation of layers < k
(whose bounds are already tightened). An LP solver's optimum is only accurate to its
tolerances, so it is never used directly: the row duals y it returns are turned into a bound
that holds for *any* y by weak duality (Neumaier & Shcherbina 2004):

    c^T x = (c - A^T y)^T x + y^T (A x) <= sum_j max over [l_j, u_j] of r_j x_j
                                         + sum_i max over [rl_i, ru_i] of y_i (A x)_i

which needs only finite column bounds (all columns here are bounded) and is evaluated with
outward-rounded float arithmetic. A poor y gives a loose but still sound bound.
"""

from __future__ import annotations

import time

import numpy as np

from lucid.bounds.interval import FP_REL, LayerBounds, interval_bounds
from lucid.deadline import past
from lucid.milp.builder import ModelBuilder
from lucid.milp.model import MilpModel
from lucid.milp.relu import encode_relu


def rigorous_max(model: MilpModel, c: np.ndarray, y: np.ndarray) -> float:
    """A sound upper bound on max c^T x over the LP relaxation of `model`, from any duals y."""
    y = np.asarray(y, dtype=np.float64).copy()
    y[(y > 0) & ~np.isfinite(model.row_upper)] = 0.0
    y[(y < 0) & ~np.isfinite(model.row_lower)] = 0.0
    r = c - model.A.T @ y
    col = np.where(r > 0, r * model.col_upper, np.where(r < 0, r * model.col_lower, 0.0))
    row = np.where(
        y > 0,
        y * np.where(y > 0, model.row_upper, 0.0),
        np.where(y < 0, y * np.where(y < 0, model.row_lower, 0.0), 0.0),
    )
    if not (np.all(np.isfinite(col)) and np.all(np.isfinite(row))):
        return np.inf
    # the residual r itself was computed in floats: account for its rounding too
    mag = (
        np.abs(col).sum()
        + np.abs(row).sum()
        + (np.abs(model.A.T) @ np.abs(y) + np.abs(c)) @ np.maximum(np.abs(model.col_lower), np.abs(model.col_upper))
    )
    return float(col.sum() + row.sum() + FP_REL * mag + 1e-300)


def dual_bound(model: MilpModel, c: np.ndarray, y: np.ndarray) -> float:
    """`rigorous_max` with the solver's duals y under either sign convention (whichever bounds
    tighter: both are sound)."""
    return min(rigorous_max(model, c, y), rigorous_max(model, c, -y))


def proves_empty(model: MilpModel, ray: np.ndarray) -> bool:
    """Whether `ray` (a solver's Farkas ray, either sign convention) proves the LP relaxation of
    `model` infeasible: for any y, 0 <= rigorous_max(model, 0, y) at a feasible point, so a
    negative value for y = ray or -ray leaves no feasible point (with the same outward rounding)."""
    zero = np.zeros(model.num_cols)
    return min(rigorous_max(model, zero, ray), rigorous_max(model, zero, -ray)) < 0.0


class LpBoundSolver:
    """Sound bounds max/min c^T x over one LP (a `MilpModel` with integrality ignored): the LP is
    solved by the solver layer (`lucid.solvers.lp`), and only its duals are used, through
    `rigorous_max`."""

    def __init__(self, model: MilpModel) -> None:
        from lucid.solvers.lp import ObjectiveLp

        self.model = model
        self.lp = ObjectiveLp(model)

    def maximise(self, c: np.ndarray, time_limit: float | None = None) -> float:
        """Sound upper bound on max c^T x (+inf if the LP could not be solved in time)."""
        c = np.asarray(c, dtype=np.float64)
        y = self.lp.duals(c, time_limit)
        if y is None:
            return np.inf
        return dual_bound(self.model, c, y)


def relaxation_model(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    lower: np.ndarray,
    upper: np.ndarray,
    bounds: LayerBounds,
    depth: int,
) -> tuple[MilpModel, np.ndarray]:
    """Triangle relaxation of layers < depth; returns the model and the columns of layer depth-1's output."""
    b = ModelBuilder()
    z = b.add_vars(len(lower), lower, upper, "x")
    for k in range(depth):
        w, bias = weights[k], biases[k]
        n_out = w.shape[0]
        zhat = b.add_vars(n_out, bounds.lower[k], bounds.upper[k], f"l{k}.zhat")
        cols = np.concatenate([zhat[:, None], np.broadcast_to(z, (n_out, len(z)))], 1)
        b.add_rows(cols, np.concatenate([np.ones((n_out, 1)), -w], 1), bias, bias, f"l{k}.aff")
        z, _ = encode_relu(b, zhat, bounds.lower[k], bounds.upper[k], f"l{k}", relax=np.ones(n_out, bool))
    return b.build(np.arange(len(lower)), np.zeros(0), {}), z


def lp_bounds(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    lower: np.ndarray,
    upper: np.ndarray,
    start: LayerBounds | None = None,
    deadline: float | None = None,
) -> LayerBounds:
    """Pre-activation bounds of one concrete network, LP-tightened from layer 1 on.

    Layer 0 is affine in the box, where interval arithmetic is already exact. At `deadline`
    (time.monotonic()) the tightening stops: every LP gets at most the time left, and the neurons
    not tightened by then keep their interval bounds (the tightening only ever shrinks them).
    """
    bounds = interval_bounds(weights, biases, lower, upper) if start is None else start
    bounds = LayerBounds([lo.copy() for lo in bounds.lower], [hi.copy() for hi in bounds.upper])
    for k in range(1, len(weights)):
        model, z = relaxation_model(weights, biases, lower, upper, bounds, k)
        solver = LpBoundSolver(model)
        w, bias = weights[k], biases[k]
        for j in range(w.shape[0]):
            if past(deadline):
                return bounds
            c = np.zeros(model.num_cols)
            np.add.at(c, z, w[j])
            hi = solver.maximise(c, _left(deadline))
            lo = -solver.maximise(-c, _left(deadline))
            pad = FP_REL * abs(bias[j])
            bounds.upper[k][j] = min(bounds.upper[k][j], hi + bias[j] + pad)
            bounds.lower[k][j] = max(bounds.lower[k][j], lo + bias[j] - pad)
        if k + 1 < len(weights):
            # later layers start from interval bounds of the tightened layer
            rest = interval_bounds(
                weights[k + 1 :], biases[k + 1 :], np.maximum(bounds.lower[k], 0), np.maximum(bounds.upper[k], 0)
            )
            for i, (rest_lo, rest_hi) in enumerate(zip(rest.lower, rest.upper, strict=True)):
                bounds.lower[k + 1 + i] = np.maximum(bounds.lower[k + 1 + i], rest_lo)
                bounds.upper[k + 1 + i] = np.minimum(bounds.upper[k + 1 + i], rest_hi)
    return bounds


def lp_margin_upper(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    lower: np.ndarray,
    upper: np.ndarray,
    bounds: LayerBounds,
    deadline: float | None = None,
) -> np.ndarray:
    """[C, C] matrix: sound upper bound of score_c - score_t over the domain (diagonal 0); the pairs
    whose LP the `deadline` (time.monotonic()) leaves no time for keep the interval bound."""
    L = len(weights)
    model, z = relaxation_model(weights, biases, lower, upper, bounds, L - 1)
    solver = LpBoundSolver(model)
    w, bias = weights[-1], biases[-1]
    C = w.shape[0]
    out = np.zeros((C, C))
    for c in range(C):
        for t in range(C):
            if c == t:
                continue
            coef = np.zeros(model.num_cols)
            np.add.at(coef, z, w[c] - w[t])
            interval = bounds.upper[-1][c] - bounds.lower[-1][t]
            db = bias[c] - bias[t]
            via_lp = np.inf if past(deadline) else solver.maximise(coef, _left(deadline)) + db + FP_REL * abs(db) * 4
            out[c, t] = min(interval * (1 + FP_REL) + 1e-300, via_lp)
    return out


def _left(deadline: float | None) -> float | None:
    """Seconds until `deadline` (a time.monotonic() value; None: no limit)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
