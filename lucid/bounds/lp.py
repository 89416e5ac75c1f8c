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

import numpy as np

from lucid.bounds.interval import FP_REL, LayerBounds, interval_bounds
from lucid.encodings.builder import ModelBuilder
from lucid.encodings.model import MilpModel
from lucid.encodings.relu import encode_relu


def rigorous_max(model: MilpModel, c: np.ndarray, y: np.ndarray) -> float:
    """A sound upper bound on max c^T x over the LP relaxation of `model`, from any duals y."""
    y = np.asarray(y, dtype=np.float64).copy()
    y[(y > 0) & ~np.isfinite(model.row_upper)] = 0.0
    y[(y < 0) & ~np.isfinite(model.row_lower)] = 0.0
    r = c - model.A.T @ y
    col = np.where(r > 0, r * model.col_upper, np.where(r < 0, r * model.col_lower, 0.0))
    row = np.where(y > 0, y * np.where(y > 0, model.row_upper, 0.0), np.where(y < 0, y * np.where(y < 0, model.row_lower, 0.0), 0.0))
    if not (np.all(np.isfinite(col)) and np.all(np.isfinite(row))):
        return np.inf
    # the residual r itself was computed in floats: account for its rounding too
    mag = np.abs(col).sum() + np.abs(row).sum() + (np.abs(model.A.T) @ np.abs(y) + np.abs(c)) @ np.maximum(
        np.abs(model.col_lower), np.abs(model.col_upper)
    )
    return float(col.sum() + row.sum() + FP_REL * mag + 1e-300)


LP_TIME_CAP = 10.0  # seconds for one bound LP; a stalled one only costs that bound (+inf)
PRIMAL_CAP = 2.0  # of which the warm-started primal simplex gets at most this much


class LpBoundSolver:
    """Solves max/min c^T x over one LP (a `MilpModel` with integrality ignored) with HiGHS."""

    def __init__(self, model: MilpModel) -> None:
        import highspy

        self.model = model
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", 1)
        # Only the objective changes between solves, so the last optimal basis stays primal
        # feasible: primal simplex restarts from it (measured 1.4-1.7x fewer iterations than
        # the default dual simplex), and presolve would throw that basis away.
        self.h.setOptionValue("presolve", "off")
        self.h.setOptionValue("simplex_strategy", 4)
        lp = highspy.HighsLp()
        csc = model.A.tocsc()
        lp.num_col_, lp.num_row_ = model.num_cols, model.num_rows
        lp.col_cost_ = np.zeros(model.num_cols)
        lp.col_lower_, lp.col_upper_ = model.col_lower, model.col_upper
        lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = csc.indptr, csc.indices, csc.data
        lp.sense_ = highspy.ObjSense.kMaximize
        self.h.passModel(lp)
        self._all = np.arange(model.num_cols, dtype=np.int32)
        self._ok = highspy.HighsModelStatus.kOptimal

    def maximise(self, c: np.ndarray, time_limit: float | None = None) -> float:
        """Sound upper bound on max c^T x (+inf if the LP could not be solved in time)."""
        cap = LP_TIME_CAP if time_limit is None else max(0.01, min(LP_TIME_CAP, time_limit))
        self.h.changeColsCost(len(self._all), self._all, np.asarray(c, dtype=np.float64))
        # Warm primal simplex first; it can stall (measured: one Adult 2x50 OBBT LP in 308 ran
        # into the 10 s cap where the others took 0.06 s), so after PRIMAL_CAP it starts again
        # cold with dual simplex for the rest of the cap.
        solved = self._run(min(cap, PRIMAL_CAP))
        if not solved and cap > PRIMAL_CAP:
            self.h.clearSolver()
            self.h.setOptionValue("simplex_strategy", 1)
            solved = self._run(cap - PRIMAL_CAP)
            self.h.setOptionValue("simplex_strategy", 4)
        if not solved:
            # Measured: primal simplex can stall for minutes on a bound LP of a Crypto 2x100 node.
            # Drop the basis it left so the next LP starts clean.
            self.h.clearSolver()
            return np.inf
        y = np.asarray(self.h.getSolution().row_dual)
        return min(rigorous_max(self.model, c, y), rigorous_max(self.model, c, -y))

    def _run(self, seconds: float) -> bool:
        # HiGHS compares time_limit with the run time summed over every run() of this object
        # (highspy 1.15): a fixed limit made every LP after the first 10 s return "time limit",
        # which silently ended OBBT after ~10 s of LPs (41 of 268 on an Adult 2x50 singleton)
        self.h.setOptionValue("time_limit", float(self.h.getRunTime() + seconds))
        self.h.run()
        return self.h.getModelStatus() == self._ok


def relaxation_model(
    weights: list[np.ndarray], biases: list[np.ndarray], lower: np.ndarray, upper: np.ndarray, bounds: LayerBounds, depth: int
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
) -> LayerBounds:
    """Pre-activation bounds of one concrete network, LP-tightened from layer 1 on.

    Layer 0 is affine in the box, where interval arithmetic is already exact.
    """
    bounds = interval_bounds(weights, biases, lower, upper) if start is None else start
    bounds = LayerBounds([lo.copy() for lo in bounds.lower], [hi.copy() for hi in bounds.upper])
    for k in range(1, len(weights)):
        model, z = relaxation_model(weights, biases, lower, upper, bounds, k)
        solver = LpBoundSolver(model)
        w, bias = weights[k], biases[k]
        for j in range(w.shape[0]):
            c = np.zeros(model.num_cols)
            np.add.at(c, z, w[j])
            hi = solver.maximise(c)
            lo = -solver.maximise(-c)
            pad = FP_REL * abs(bias[j])
            bounds.upper[k][j] = min(bounds.upper[k][j], hi + bias[j] + pad)
            bounds.lower[k][j] = max(bounds.lower[k][j], lo + bias[j] - pad)
        if k + 1 < len(weights):
            # later layers start from interval bounds of the tightened layer
            rest = interval_bounds(
                weights[k + 1 :], biases[k + 1 :], np.maximum(bounds.lower[k], 0), np.maximum(bounds.upper[k], 0)
            )
            for i, (lo, hi) in enumerate(zip(rest.lower, rest.upper)):
                bounds.lower[k + 1 + i] = np.maximum(bounds.lower[k + 1 + i], lo)
                bounds.upper[k + 1 + i] = np.minimum(bounds.upper[k + 1 + i], hi)
    return bounds


def lp_margin_upper(
    weights: list[np.ndarray], biases: list[np.ndarray], lower: np.ndarray, upper: np.ndarray, bounds: LayerBounds
) -> np.ndarray:
    """[C, C] matrix: sound upper bound of score_c - score_t over the domain (diagonal 0)."""
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
            out[c, t] = min(interval * (1 + FP_REL) + 1e-300, solver.maximise(coef) + db + FP_REL * abs(db) * 4)
    return out
