"""MPS export/import of MilpModel round-trips every field a solver sees."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from lucid.milp.model import MilpModel
from lucid.errors import LucidError
from lucid.solvers import SolverOptions, read_mps, solve, write_mps

INF = np.inf


def sample_model() -> MilpModel:
    rng = np.random.default_rng(7)
    n, m = 9, 6
    A = sp.random(m, n, density=0.5, format="csr", random_state=rng)
    A.data = np.round(A.data * 10 - 5, 6)
    return MilpModel(
        A=A,
        row_lower=np.array([-INF, 0.5, -1.0, 2.0, -INF, -3.25]),
        row_upper=np.array([4.0, INF, 1.0, 2.0, 1e-7, 7.0]),  # <=, >=, ranged, =, tiny, ranged
        col_lower=np.array([0, 0, -2, -INF, 0, 0, 0, -1.5, 0.0]),
        col_upper=np.array([1, 1, 3, INF, 2.5, INF, 1, 1.5, 4.0]),
        integrality=np.array([1, 1, 1, 0, 0, 0, 1, 0, 1], dtype=bool),
        objective=np.array([1.0, -2.0, 0.0, 0.0, 3.5, -1.0, 0.25, 0.0, 1e-3]),
        objective_offset=-1.75,
        names=[f"x{j}" for j in range(n)],
        row_names=[f"row{i}" for i in range(m)],
    )


def assert_same(a: MilpModel, b: MilpModel) -> None:
    assert (a.A != b.A).nnz == 0
    for field in ("row_lower", "row_upper", "col_lower", "col_upper", "objective"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    np.testing.assert_array_equal(a.integrality, b.integrality)
    assert a.objective_offset == b.objective_offset
    assert a.names == b.names and a.row_names == b.row_names


def test_round_trip(tmp_path):
    model = sample_model()
    write_mps(model, tmp_path / "m.mps")
    assert "OBJSENSE" in (tmp_path / "m.mps").read_text()
    assert_same(model, read_mps(tmp_path / "m.mps"))


def test_minimise_form_is_the_negated_model(tmp_path):
    model = sample_model()
    write_mps(model, tmp_path / "min.mps", minimise=True)
    back = read_mps(tmp_path / "min.mps")  # read_mps turns a minimisation back into max
    assert_same(model, back)


def test_round_trip_preserves_the_optimum(tmp_path):
    model = sample_model()
    write_mps(model, tmp_path / "m.mps")
    a = solve(model, "highs", SolverOptions(time_limit=10))
    b = solve(read_mps(tmp_path / "m.mps"), "highs", SolverOptions(time_limit=10))
    assert a.status == b.status == "optimal"
    assert a.upper_bound == pytest.approx(b.upper_bound, abs=1e-9)


def test_unnamed_model_gets_default_names(tmp_path):
    model = sample_model()
    model.names, model.row_names = [], []
    write_mps(model, tmp_path / "m.mps")
    back = read_mps(tmp_path / "m.mps")
    assert back.names == [f"c{j}" for j in range(model.num_cols)]


def test_bad_paths_are_user_errors(tmp_path):
    with pytest.raises(LucidError, match="no such file"):
        read_mps(tmp_path / "missing.mps")
    (tmp_path / "junk.mps").write_text("this is not MPS\n")
    with pytest.raises(LucidError, match="could not parse"):
        read_mps(tmp_path / "junk.mps")
    with pytest.raises(LucidError, match=r"\.mps"):
        write_mps(sample_model(), tmp_path / "model.txt")
    assert not list(tmp_path.glob(".*tmp"))
