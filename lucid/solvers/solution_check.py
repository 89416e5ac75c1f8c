"""Independent re-check of a solver's primal solution against the `MilpModel` (float64).

Solvers work with tolerances, scaling and presolve; an incumbent is only trusted as a lower
bound after its row activities, column bounds and integrality are re-evaluated here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.milp.model import MilpModel

# A solver's primal solution must satisfy every row/bound/integrality to this absolute tolerance
# (solvers use 1e-6 feasibility tolerances on scaled models; big-M rows can amplify that).
REPLAY_TOLERANCE = 1e-5


@dataclass
class ReplayReport:
    objective: float  # objective @ x + offset, recomputed
    max_row_violation: float
    max_bound_violation: float
    max_integrality_violation: float

    def ok(self, tol: float) -> bool:
        return max(self.max_row_violation, self.max_bound_violation, self.max_integrality_violation) <= tol


def replay_solution(model: MilpModel, x: np.ndarray) -> ReplayReport:
    """Violations of every constraint of `model` by `x` (0 where satisfied)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (model.num_cols,):
        raise ValueError(f"solution has shape {x.shape}, expected ({model.num_cols},)")
    act = model.A @ x
    with np.errstate(invalid="ignore"):
        row_v = np.maximum(np.maximum(model.row_lower - act, act - model.row_upper), 0.0)
        col_v = np.maximum(np.maximum(model.col_lower - x, x - model.col_upper), 0.0)
    xi = x[model.integrality]
    int_v = np.abs(xi - np.round(xi))

    def worst(v: np.ndarray) -> float:
        return float(np.nanmax(v)) if v.size else 0.0

    return ReplayReport(
        objective=float(model.objective @ x + model.objective_offset),
        max_row_violation=worst(row_v),
        max_bound_violation=worst(col_v),
        max_integrality_violation=worst(int_v),
    )
