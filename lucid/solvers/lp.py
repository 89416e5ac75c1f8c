"""One LP solved again and again with changing objectives (bound tightening), by HiGHS.

Only the row duals leave this module: the caller (`lucid.bounds.lp`) turns any duals into a
rigorous bound by weak duality, so an inaccurate LP optimum can loosen a bound but never make it
unsound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lucid.milp.model import MilpModel
from lucid.solvers.highs_instance import new_highs

LP_TIME_CAP = 10.0  # seconds for one bound LP; a stalled one only costs that bound (+inf)
PRIMAL_CAP = 2.0  # of which the warm-started primal simplex gets at most this much


def _highs_lp(model: MilpModel, cost: np.ndarray):
    """`model` as a HiGHS LP (integrality dropped), maximising cost^T x."""
    import highspy

    lp = highspy.HighsLp()
    csc = model.A.tocsc()
    lp.num_col_, lp.num_row_ = model.num_cols, model.num_rows
    lp.col_cost_ = cost
    lp.col_lower_, lp.col_upper_ = model.col_lower, model.col_upper
    lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = csc.indptr, csc.indices, csc.data
    lp.sense_ = highspy.ObjSense.kMaximize
    return lp


class ObjectiveLp:
    """max c^T x over one LP (a `MilpModel` with integrality ignored), for one c after another."""

    def __init__(self, model: MilpModel) -> None:
        import highspy

        self.model = model
        self.h = new_highs()
        self.h.setOptionValue("threads", 1)
        # Only the objective changes between solves, so the last optimal basis stays primal
        # feasible: primal simplex restarts from it (the new costs make it dual infeasible, so the
        # default dual simplex would need more iterations), and presolve would throw that basis away.
        self.h.setOptionValue("presolve", "off")
        self.h.setOptionValue("simplex_strategy", 4)
        self.h.passModel(_highs_lp(model, np.zeros(model.num_cols)))
        self._all = np.arange(model.num_cols, dtype=np.int32)
        self._ok = highspy.HighsModelStatus.kOptimal

    def duals(self, c: np.ndarray, time_limit: float | None = None) -> np.ndarray | None:
        """The row duals of max c^T x (None if the LP could not be solved in time)."""
        cap = LP_TIME_CAP if time_limit is None else max(0.01, min(LP_TIME_CAP, time_limit))
        self.h.changeColsCost(len(self._all), self._all, np.asarray(c, dtype=np.float64))
        # Warm primal simplex first; on a rare LP it stalls far beyond the others' time, so after
        # PRIMAL_CAP it starts again cold with dual simplex for the rest of the cap.
        solved = self._run(min(cap, PRIMAL_CAP))
        if not solved and cap > PRIMAL_CAP:
            self.h.clearSolver()
            self.h.setOptionValue("simplex_strategy", 1)
            solved = self._run(cap - PRIMAL_CAP)
            self.h.setOptionValue("simplex_strategy", 4)
        if not solved:
            # Primal simplex can stall for minutes on a bound LP of a large node.
            # Drop the basis it left so the next LP starts clean.
            self.h.clearSolver()
            return None
        return np.asarray(self.h.getSolution().row_dual, dtype=np.float64)

    def _run(self, seconds: float) -> bool:
        # HiGHS compares time_limit with the run time summed over every run() of this object
        # (highspy 1.15): with a fixed limit, once this object's LPs together had run that long
        # every further LP would return "time limit" at once and silently end OBBT, so the limit
        # is the run time so far plus this LP's share.
        self.h.setOptionValue("time_limit", float(self.h.getRunTime() + seconds))
        self.h.run()
        return self.h.getModelStatus() == self._ok


def inequality_multipliers(
    c: np.ndarray, a: np.ndarray, b: np.ndarray, lower: np.ndarray, upper: np.ndarray, time_limit: float = 1.0
) -> np.ndarray | None:
    """Multipliers y >= 0 of the rows of max c^T x s.t. a x <= b, lower <= x <= upper (x may be
    unbounded where lower / upper are infinite): at the LP's optimum, c^T x <= y^T b + max over
    the bounds of (c - a^T y)^T x is tight. None if HiGHS does not report an optimum in time.
    A small dense LP solved from scratch; the caller must check whatever it concludes from y."""
    import highspy

    rows, cols = a.shape
    model = MilpModel(
        A=sp.csr_matrix(np.asarray(a, dtype=np.float64)),
        row_lower=np.full(rows, -np.inf),
        row_upper=np.asarray(b, dtype=np.float64),
        col_lower=np.asarray(lower, dtype=np.float64),
        col_upper=np.asarray(upper, dtype=np.float64),
        integrality=np.zeros(cols, dtype=bool),
        objective=np.asarray(c, dtype=np.float64),
    )
    h = new_highs()
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit))
    h.passModel(_highs_lp(model, model.objective))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    # HiGHS' row dual of a maximisation is the objective's rate of change in the row's upper end:
    # >= 0 on these rows up to rounding, which the clip removes (any y >= 0 is a valid multiplier)
    return np.clip(np.asarray(h.getSolution().row_dual, dtype=np.float64), 0.0, None)


class BoundedLp:
    """max c^T x over one LP (a `MilpModel` with integrality ignored), solved again and again with
    changing column bounds (a branch and bound's domains fix some columns)."""

    def __init__(self, model: MilpModel, time_limit: float = 1.0) -> None:
        import highspy

        self.h = new_highs()
        self.h.setOptionValue("threads", 1)
        self.time_limit = float(time_limit)
        self.h.passModel(_highs_lp(model, np.asarray(model.objective, dtype=np.float64)))
        self._all = np.arange(model.num_cols, dtype=np.int32)
        self._ok = highspy.HighsModelStatus.kOptimal
        self._infeasible = highspy.HighsModelStatus.kInfeasible

    def duals(self, col_lower: np.ndarray, col_upper: np.ndarray) -> BoundDuals:
        """The row duals of the LP with these column bounds, or its Farkas ray where HiGHS finds it
        infeasible (neither: not solved in time; the last basis is kept otherwise: a bound change
        leaves it dual feasible, so the next solve is a short dual simplex)."""
        self.h.changeColsBounds(
            len(self._all), self._all, np.asarray(col_lower, dtype=np.float64), np.asarray(col_upper, dtype=np.float64)
        )
        self.h.setOptionValue("time_limit", float(self.h.getRunTime() + self.time_limit))  # see ObjectiveLp._run
        self.h.run()
        status = self.h.getModelStatus()
        if status == self._ok:
            return BoundDuals(optimum=np.asarray(self.h.getSolution().row_dual, dtype=np.float64))
        ray = None
        if status == self._infeasible:
            _, has_ray, values = self.h.getDualRay()
            ray = np.asarray(values, dtype=np.float64) if has_ray else None
        self.h.clearSolver()
        return BoundDuals(farkas=ray)


@dataclass(frozen=True)
class BoundDuals:
    """One `BoundedLp` solve: the row duals at an optimum, or a Farkas ray of an infeasible LP.
    Both are only candidates: the caller checks them by weak duality (`lucid.bounds.lp`)."""

    optimum: np.ndarray | None = None
    farkas: np.ndarray | None = None
