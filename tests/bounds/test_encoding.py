"""The Eq. 3 encoder: exact for singletons (raw dual bound = exact beta*), sound with every option."""

import numpy as np
import pytest
from bruteforce import exact_for, tiny_stack

from lucid.analysis.encode import EncodingOptions
from lucid.analysis.encode import EncoderInputs, encode_idp
from lucid.hyper import hyper_network
from lucid.solvers import SolverOptions, solve
from lucid.analysis.problem import VerificationProblem, node_difference_bounds


def raw_bound(problem, cls, positions, options, targets=None):
    hyper = hyper_network(problem.stack, positions)
    diff = node_difference_bounds(problem, hyper)
    model = encode_idp(EncoderInputs.for_node(problem, hyper, diff), cls, options, targets=targets)
    if model is None:
        return -np.inf, None
    result = solve(model, "highs", SolverOptions(time_limit=30))
    assert result.status in ("optimal", "infeasible")
    if result.incumbent is not None:  # the encoded optimum itself: exact up to solver tolerance
        exact_value.append(result.incumbent)
    return result.upper_bound, model


exact_value: list[float] = []  # last incumbent seen (the MILP's primal optimum)


@pytest.mark.parametrize("seed,lo", [(0, -1.0), (2, 0.0)])
@pytest.mark.parametrize("md,md_pre,coupling,bounds", [
    (False, False, False, "interval"), (False, False, True, "interval"), (True, False, False, "lp"),
    (True, True, False, "lp"), (True, True, True, "lp"),
])
def test_singleton_encoding_is_exact(seed, lo, md, md_pre, coupling, bounds):
    stack = tiny_stack(seed)
    lower, upper = np.full(2, lo), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper, bounds=bounds)
    # ris never touches singletons
    options = EncodingOptions(md=md, md_pre=md_pre, coupling=coupling, ris=True, bounds=bounds)
    for cls in range(2):
        for p in (1, 2):
            exact = exact_for(stack, p, cls, lower, upper)
            got, model = raw_bound(problem, cls, [p], options)
            if exact == -np.inf:
                assert got == -np.inf
                continue
            # HiGHS's dual bound may sit up to its 1e-6 objective tolerance above the optimum
            assert exact - 1e-9 <= got <= exact + 2e-6, (cls, p, got, exact)
            assert abs(exact_value[-1] - exact) <= 2e-6  # mip_feasibility_tolerance is 1e-6
            assert model.meta["exact_hyper"] and model.meta["relaxed"] == 0
            assert not any(n.startswith("h0.wlo") for n in model.row_names)  # equalities, no intervals


@pytest.mark.parametrize("disjunction", ["bigm", "split"])
def test_three_classes_both_disjunctions_are_exact_on_singletons(disjunction):
    stack = tiny_stack(1, hidden=(4, 6), classes=3)
    lower, upper = np.full(2, -1.0), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    options = EncodingOptions(ris=False, disjunction=disjunction)
    for cls in range(3):
        exact = exact_for(stack, 2, cls, lower, upper)
        if disjunction == "bigm":
            got, _ = raw_bound(problem, cls, [2], options)
        else:
            got = max(raw_bound(problem, cls, [2], options, targets=[t])[0] for t in range(3) if t != cls)
        assert (got == -np.inf) if exact == -np.inf else exact - 1e-9 <= got <= exact + 2e-6


def test_stable_neurons_get_no_binary():
    stack = tiny_stack(0)
    problem = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2))
    _, model = raw_bound(problem, 0, [1], EncodingOptions())
    unstable = sum(int(np.sum((lo < 0) & (hi > 0))) for lo, hi in zip(problem.n_bounds.lower[:-1], problem.n_bounds.upper[:-1]))
    assert model.meta["binaries_n"] == unstable
    assert model.num_integers == model.meta["binaries"]


def test_relu_coupling_rows_hold_for_every_real_pair_and_tighten_the_relaxation():
    from lucid.milp.builder import ModelBuilder
    from lucid.milp.matching import ReluColumns, add_relu_coupling

    rng = np.random.default_rng(5)
    # dhat intervals of every kind: non-negative, non-positive, mixed, degenerate
    a = np.array([0.0, 0.2, -0.3, -0.5, -1e-3, -0.4, 0.0])
    b_ = np.array([0.3, 0.6, -0.1, 0.0, 2e-3, 0.7, 0.0])
    n = len(a)
    b = ModelBuilder()
    zh, zhh, z, zz = (b.add_vars(n, -10, 10, name) for name in ("zhat", "zhat_h", "z", "z_h"))
    rows, coupled = add_relu_coupling(b, ReluColumns(zh, zhh, z, zz), a, b_, "rc")
    assert coupled.all()
    model = b.build(zh, np.zeros(0), {})
    assert rows == model.num_rows > 0
    for _ in range(2000):
        pre = rng.uniform(-1, 1, n)
        pre_h = pre + rng.uniform(a, b_)
        x = np.zeros(model.num_cols)
        x[zh], x[zhh], x[z], x[zz] = pre, pre_h, np.maximum(pre, 0), np.maximum(pre_h, 0)
        act = model.A @ x
        assert np.all(act >= model.row_lower - 1e-12) and np.all(act <= model.row_upper + 1e-12)
    # and it cuts: with dhat >= 0 the post-activation difference cannot be negative
    x = np.zeros(model.num_cols)
    x[zh[0]], x[zhh[0]], x[z[0]], x[zz[0]] = 0.5, 0.6, 0.5, 0.4
    act = model.A @ x
    assert np.any((act < model.row_lower - 1e-9) | (act > model.row_upper + 1e-9))


def test_relu_coupling_never_loosens_the_lp_relaxation():
    stack = tiny_stack(3, hidden=(6, 6))
    lower, upper = np.zeros(2), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    hyper = hyper_network(problem.stack, [1])
    diff = node_difference_bounds(problem, hyper)
    bounds = {}
    for coupling in (False, True):
        options = EncodingOptions(coupling=coupling)
        model = encode_idp(EncoderInputs.for_node(problem, hyper, diff), 0, options, relax_all=True)
        bounds[coupling] = solve(model, "highs", SolverOptions(time_limit=30)).upper_bound
    assert bounds[True] <= bounds[False] + 1e-9


@pytest.mark.parametrize("positions", [[1], [1, 2, 3]])
def test_leaving_out_implied_matching_rows_changes_no_bound(monkeypatch, positions):
    import lucid.analysis.encode as idp

    stack = tiny_stack(4, hidden=(6, 6), noise=0.5)
    lower, upper = np.zeros(2), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    hyper = hyper_network(problem.stack, positions)
    diff = node_difference_bounds(problem, hyper)

    def bounds():
        out = {}
        for cls in (0, 1):
            for relax_all in (True, False):  # the LP relaxation and the MILP
                model = encode_idp(EncoderInputs.for_node(problem, hyper, diff), cls, EncodingOptions(),
                                   relax_all=relax_all)
                if model is not None:
                    out[cls, relax_all] = (solve(model, "highs", SolverOptions(time_limit=30)).upper_bound,
                                           model.num_rows)
        return out

    lean = bounds()
    monkeypatch.setattr(idp, "implied_post_rows", lambda *a: np.zeros(len(a[0]), dtype=bool))
    monkeypatch.setattr(idp, "pre_row_implied", lambda *a: False)
    full = bounds()
    assert lean.keys() == full.keys()
    assert any(np.isfinite(v[0]) for v in lean.values())
    for key in lean:
        assert lean[key][0] == pytest.approx(full[key][0], abs=1e-7), key
        assert lean[key][1] < full[key][1]
