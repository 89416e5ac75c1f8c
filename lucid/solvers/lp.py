"""One LP solved again and again with changing objectives (bound tightening), by HiGHS.

Only the row duals leave this module: the caller (`lucid.bounds.lp`) turns any duals into a
rigorous bound by weak duality, so an inaccurate LP optimum can loosen a bound but never make it
unsound.
"""

from __future__ import annotations

import numpy as np

from lucid.milp.model import MilpModel

LP_TIME_CAP = 10.0  # seconds for one bound LP; a stalled one only costs that bound (+inf)
PRIMAL_CAP = 2.0  # of which the warm-started primal simplex gets at most this much


class ObjectiveLp:
    """max c^T x over one LP (a `MilpModel` with integrality ignored), for one c after another."""

    def __init__(self, model: MilpModel) -> None:
        import highspy

        from lucid.solvers.highs_instance import new_highs

        self.model = model
        self.h = new_highs()
        self.h.setOptionValue("threads", 1)
        # Only the objective changes between solves, so the last optimal basis stays primal
        # feasible: primal simplex restarts from it (the new costs make it dual infeasible, so the
        # default dual simplex would need more iterations), and presolve would throw that basis away.
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


