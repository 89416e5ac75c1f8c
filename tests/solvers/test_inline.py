"""The compact form (layer-0 pre-activations substituted out) keeps every bound and is sound in floating point."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from bruteforce import tiny_stack

from lucid.analysis.encode import EncodingOptions
from lucid.analysis.encode import EncoderInputs, encode_idp
from lucid.solvers.compact import inline_defined_columns
from lucid.hyper import hyper_network
from lucid.solvers import SolverOptions, available_solvers, solve
from lucid.solvers.solution_check import REPLAY_TOLERANCE, replay_solution
from lucid.analysis.problem import VerificationProblem, node_difference_bounds


def models(positions, relax_all, d=3, seed=4):
    stack = tiny_stack(seed, hidden=(8, 6), noise=0.5, d=d)
    lower, upper = np.full(d, -0.5), np.ones(d)  # negative lower bounds: the shifted encoding
    problem = VerificationProblem.from_stack(stack, lower, upper)
    hyper = hyper_network(problem.stack, np.asarray(positions))
    diff = node_difference_bounds(problem, hyper)
    out = []
    for cls in (0, 1):
        model = encode_idp(EncoderInputs.for_node(problem, hyper, diff), cls, EncodingOptions(), relax_all=relax_all)
        if model is not None:
            out.append(model)
    return out


@pytest.mark.parametrize("positions", [[2], [1, 2, 3]])
@pytest.mark.parametrize("relax_all", [True, False])
def test_the_compact_model_has_the_same_optimum_and_maps_solutions_back(positions, relax_all):
    found = models(positions, relax_all)
    assert found
    for model in found:
        compact, expand = inline_defined_columns(model)
        removed = len(model.meta["_defined"][0])
        assert removed > 0
        assert (compact.num_cols, compact.num_rows) == (model.num_cols - removed, model.num_rows - removed)
        full_r = solve(model, "highs", SolverOptions(time_limit=30))
        comp_r = solve(compact, "highs", SolverOptions(time_limit=30))
        assert comp_r.upper_bound == pytest.approx(full_r.upper_bound, abs=1e-7)
        back = expand(comp_r.solution)
        assert replay_solution(model, back).ok(REPLAY_TOLERANCE)
        assert np.array_equal(model.witness_input(back), compact.witness_input(comp_r.solution))


def test_substitution_rounding_is_covered_exactly():
    """For random points, the compact rows' exact activity stays inside their widened bounds
    whenever the original rows' exact activity is inside theirs (checked with rationals)."""
    rng = np.random.default_rng(0)
    model = models([2], relax_all=False, d=4, seed=3)[0]
    compact, _ = inline_defined_columns(model)
    J, R = (np.asarray(a) for a in model.meta["_defined"])
    n = model.num_cols
    K = np.setdiff1d(np.arange(n), J)
    keep = np.setdiff1d(np.arange(model.num_rows), R)
    A = sp.csr_matrix(model.A)
    D = A[R]
    rounded = 0
    for _ in range(20):
        xk = rng.uniform(np.where(np.isfinite(compact.col_lower), compact.col_lower, -1),
                         np.where(np.isfinite(compact.col_upper), compact.col_upper, 1))
        x = [Fraction(0)] * n
        for i, k in enumerate(K):
            x[k] = Fraction(float(xk[i]))
        for i, (r, j) in enumerate(zip(R, J)):  # zhat_j exactly from its defining row
            row = D[i]
            coef = Fraction(float(A[r, j]))
            rest = sum(Fraction(float(v)) * x[c] for c, v in zip(row.indices, row.data) if c != j)
            x[j] = (Fraction(float(model.row_lower[r])) - rest) / coef
        C = sp.csr_matrix(compact.A)
        for s, r in enumerate(keep):
            orig = A[r]
            a_orig = sum(Fraction(float(v)) * x[c] for c, v in zip(orig.indices, orig.data))
            new = C[s]
            a_comp = sum(Fraction(float(v)) * x[K[c]] for c, v in zip(new.indices, new.data))
            rounded += a_orig != a_comp
            lo, hi = model.row_lower[r], model.row_upper[r]
            if np.isfinite(lo):
                assert a_orig - a_comp <= Fraction(float(lo)) - Fraction(float(compact.row_lower[s]))
            if np.isfinite(hi):
                assert a_comp - a_orig <= Fraction(float(compact.row_upper[s])) - Fraction(float(hi))
    assert rounded > 0  # the merged coefficients did round: the widening was needed


def test_a_model_without_definitions_is_left_alone():
    model = models([2], relax_all=False)[0]
    model.meta.pop("_defined")
    compact, expand = inline_defined_columns(model)
    assert compact is model
    x = np.arange(model.num_cols, dtype=float)
    assert expand(x) is x


@pytest.mark.skipif(not available_solvers()["gurobi"], reason="gurobipy not installed")
def test_gurobi_solves_the_compact_form_and_reports_the_models_columns():
    from lucid.solvers.gurobi_backend import gurobi_size

    for model in models([2], relax_all=False):
        removed = len(model.meta["_defined"][0])
        assert gurobi_size(model)[1] == model.num_rows - removed
        g, h = solve(model, "gurobi"), solve(model, "highs")
        assert g.solution.shape == (model.num_cols,)
        assert g.upper_bound == pytest.approx(h.upper_bound, abs=1e-6)
