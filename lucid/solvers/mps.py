"""MPS import/export of `MilpModel` (for debugging, regression fixtures and other solvers).

HiGHS's own reader/writer does the parsing and formatting (free-format MPS with OBJSENSE), so
the files interoperate with every solver's command-line tool.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lucid.atomic import write_atomic
from lucid.errors import LucidError
from lucid.milp.model import MilpModel
from lucid.solvers.highs_instance import new_highs


def _highs():
    return new_highs()


def to_highs_lp(model: MilpModel, minimise: bool = False):
    """The model as a `highspy.HighsLp` (row-wise matrix) — built without Python loops.

    Maximises the objective, or with `minimise` minimises its negation (for file-based solvers
    whose MPS readers ignore OBJSENSE).
    """
    import highspy

    A = sp.csr_matrix(model.A)
    A.sort_indices()
    lp = highspy.HighsLp()
    lp.num_col_ = model.num_cols
    lp.num_row_ = model.num_rows
    sign = -1.0 if minimise else 1.0
    lp.sense_ = highspy.ObjSense.kMinimize if minimise else highspy.ObjSense.kMaximize
    lp.offset_ = sign * float(model.objective_offset)
    lp.col_cost_ = sign * np.asarray(model.objective, dtype=np.float64)
    lp.col_lower_ = np.asarray(model.col_lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(model.col_upper, dtype=np.float64)
    lp.row_lower_ = np.asarray(model.row_lower, dtype=np.float64)
    lp.row_upper_ = np.asarray(model.row_upper, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = model.num_cols
    lp.a_matrix_.num_row_ = model.num_rows
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    if model.integrality.any():
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if v else highspy.HighsVarType.kContinuous for v in model.integrality
        ]
    if len(model.names) == model.num_cols:
        lp.col_names_ = list(model.names)
    if len(model.row_names) == model.num_rows:
        lp.row_names_ = list(model.row_names)
    return lp


def write_mps(model: MilpModel, path: str | os.PathLike, *, minimise: bool = False) -> None:
    """Write `model` as free MPS (OBJSENSE MAX; with `minimise`, min of -objective), atomically.

    Column names are the model's, or c0..c{n-1} when it has none (HiGHS's default).
    """
    path = Path(path)
    if path.suffix.lower() != ".mps":
        raise LucidError(f"write_mps: {path} must end in .mps")
    h = _highs()
    h.passModel(to_highs_lp(model, minimise))

    def write(tmp: str) -> None:
        # HiGHS picks the format from the extension, so write via a .mps-named temporary.
        target = tmp + ".mps"
        try:
            status = h.writeModel(target)
            if status != status.kOk and not os.path.exists(target):
                raise LucidError(f"write_mps: HiGHS could not write {path}")
            os.replace(target, tmp)
        finally:
            if os.path.exists(target):
                os.unlink(target)

    write_atomic(path, write)


def read_mps(path: str | os.PathLike) -> MilpModel:
    """Read an MPS (or LP) file into a `MilpModel`; a minimisation is negated into a maximisation."""
    import highspy

    path = Path(path)
    if not path.is_file():
        raise LucidError(f"read_mps: no such file {path}")
    h = _highs()
    status = h.readModel(str(path))
    if status == highspy.HighsStatus.kError:
        raise LucidError(f"read_mps: HiGHS could not parse {path}")
    model = from_highs_lp(h.getLp())
    model.meta["source"] = str(path)
    return model


def from_highs_lp(lp) -> MilpModel:
    """A `highspy.HighsLp` as a `MilpModel`; a minimisation is negated into a maximisation."""
    import highspy

    n, m = lp.num_col_, lp.num_row_
    mat = lp.a_matrix_
    start = np.asarray(mat.start_, dtype=np.int64)
    index = np.asarray(mat.index_, dtype=np.int64)
    value = np.asarray(mat.value_, dtype=np.float64)
    if mat.format_ == highspy.MatrixFormat.kColwise:
        A = sp.csc_matrix((value, index, start), shape=(m, n)).tocsr()
    else:
        A = sp.csr_matrix((value, index, start), shape=(m, n))
    sign = -1.0 if lp.sense_ == highspy.ObjSense.kMinimize else 1.0
    integrality = np.zeros(n, dtype=bool)
    if len(lp.integrality_):
        integrality = np.array([v != highspy.HighsVarType.kContinuous for v in lp.integrality_], dtype=bool)
    return MilpModel(
        A=A,
        row_lower=np.asarray(lp.row_lower_, dtype=np.float64),
        row_upper=np.asarray(lp.row_upper_, dtype=np.float64),
        col_lower=np.asarray(lp.col_lower_, dtype=np.float64),
        col_upper=np.asarray(lp.col_upper_, dtype=np.float64),
        integrality=integrality,
        objective=sign * np.asarray(lp.col_cost_, dtype=np.float64),
        objective_offset=sign * float(lp.offset_),
        names=list(lp.col_names_),
        row_names=list(lp.row_names_),
    )
