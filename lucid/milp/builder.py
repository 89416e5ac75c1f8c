"""A small sparse row builder that produces a `MilpModel`.

Constraints are added in blocks of rows with the same number of (column, value) entries, which
is how every layer-wise constraint family here looks; zero entries are dropped at the end.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from lucid.milp.model import MilpModel


class ModelBuilder:
    def __init__(self) -> None:
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._names: list[str] = []
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rlo: list[np.ndarray] = []
        self._rhi: list[np.ndarray] = []
        self._row_names: list[str] = []
        self.num_cols = 0
        self.num_rows = 0
        self.objective: dict[int, float] = {}

    def add_vars(self, n: int, lower, upper, name: str, integer: bool = False) -> np.ndarray:
        lb = np.broadcast_to(np.asarray(lower, dtype=np.float64), (n,)).copy()
        ub = np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)).copy()
        if np.any(lb > ub):
            raise ValueError(f"empty column bounds for {name}")
        idx = np.arange(self.num_cols, self.num_cols + n)
        self._lb.append(lb)
        self._ub.append(ub)
        self._int.append(np.full(n, integer))
        self._names.extend(f"{name}[{j}]" for j in range(n))
        self.num_cols += n
        return idx

    def add_rows(self, cols: np.ndarray, vals: npt.ArrayLike, lower, upper, name: str) -> np.ndarray:
        """Rows lower_r <= sum_k vals[r, k] * x[cols[r, k]] <= upper_r (cols, vals: [m, k])."""
        cols = np.atleast_2d(np.asarray(cols, dtype=np.int64))
        vals = np.broadcast_to(np.atleast_2d(np.asarray(vals, dtype=np.float64)), cols.shape)
        m = cols.shape[0]
        if m == 0:
            return np.zeros(0, dtype=np.int64)
        rows = np.arange(self.num_rows, self.num_rows + m)
        self._rows.append(np.repeat(rows, cols.shape[1]))
        self._cols.append(cols.ravel())
        self._vals.append(vals.ravel())
        self._rlo.append(np.broadcast_to(np.asarray(lower, dtype=np.float64), (m,)).copy())
        self._rhi.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (m,)).copy())
        self._row_names.extend(f"{name}[{j}]" for j in range(m))
        self.num_rows += m
        return rows

    def build(self, input_columns: np.ndarray, input_offset: np.ndarray, meta: dict) -> MilpModel:
        def cat(parts: list[np.ndarray], dt: type = np.float64) -> np.ndarray:
            return np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)

        vals = cat(self._vals)
        keep = vals != 0.0
        A = sp.csr_matrix(
            (vals[keep], (cat(self._rows, np.int64)[keep], cat(self._cols, np.int64)[keep])),
            shape=(self.num_rows, self.num_cols),
        )
        A.sum_duplicates()
        objective = np.zeros(self.num_cols)
        for j, v in self.objective.items():
            objective[j] = v
        return MilpModel(
            A=A,
            row_lower=cat(self._rlo),
            row_upper=cat(self._rhi),
            col_lower=cat(self._lb),
            col_upper=cat(self._ub),
            integrality=cat(self._int, bool),
            objective=objective,
            names=self._names,
            row_names=self._row_names,
            input_columns=np.asarray(input_columns, dtype=np.int64),
            input_offset=np.asarray(input_offset, dtype=np.float64),
            meta=meta,
        )
