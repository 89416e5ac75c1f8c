"""The solver-neutral MILP model every backend consumes.

The encoder emits one `MilpModel`; backends (lucid/solvers) translate it and never see
network details. Convention: *maximise* `objective @ x + objective_offset` subject to
row_lower <= A x <= row_upper, col_lower <= x <= col_upper, x[j] integer where integrality[j].
Infinite bounds are +-inf (numpy), never a large finite sentinel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp


@dataclass
class MilpModel:
    A: sp.csr_matrix  # [m, n]
    row_lower: np.ndarray  # [m]
    row_upper: np.ndarray  # [m]
    col_lower: np.ndarray  # [n]
    col_upper: np.ndarray  # [n]
    integrality: np.ndarray  # [n] bool
    objective: np.ndarray  # [n], maximised
    objective_offset: float = 0.0
    names: list[str] = field(default_factory=list)  # column names, for debugging/MPS export
    row_names: list[str] = field(default_factory=list)
    input_columns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Maps the columns of input_columns back to network inputs: x = input_offset + x_cols.
    # (The encoder may shift the domain so inputs are >= 0; the witness is reported unshifted.)
    input_offset: np.ndarray = field(default_factory=lambda: np.zeros(0))
    meta: dict = field(default_factory=dict)  # encoder statistics (binaries, relaxed neurons, ...)
    # A power of two: the encoder divided the networks' scores (and so beta) by it, so that the
    # solvers see magnitudes of order one. A value of the objective times it is in score units.
    objective_scale: float = 1.0

    def __post_init__(self) -> None:
        self.A = sp.csr_matrix(self.A)
        m, n = self.A.shape
        for name, arr, size in (
            ("row_lower", self.row_lower, m),
            ("row_upper", self.row_upper, m),
            ("col_lower", self.col_lower, n),
            ("col_upper", self.col_upper, n),
            ("integrality", self.integrality, n),
            ("objective", self.objective, n),
        ):
            if np.shape(arr) != (size,):
                raise ValueError(f"MilpModel.{name} has shape {np.shape(arr)}, expected ({size},)")
        self.integrality = np.asarray(self.integrality, dtype=bool)

    @property
    def num_cols(self) -> int:
        return self.A.shape[1]

    @property
    def num_rows(self) -> int:
        return self.A.shape[0]

    @property
    def num_integers(self) -> int:
        return int(self.integrality.sum())

    def witness_input(self, solution: np.ndarray) -> np.ndarray:
        """The network input encoded by a primal solution (float64, unshifted)."""
        x = np.asarray(solution, dtype=np.float64)[self.input_columns]
        return x + self.input_offset if len(self.input_offset) else x
