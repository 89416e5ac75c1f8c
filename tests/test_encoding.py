"""The Eq. 3 encoder: exact for singletons (raw dual bound = exact beta*), sound with every option."""

import numpy as np
import pytest
from bruteforce import exact_for, tiny_stack

from lucid.encodings import EncodingOptions
from lucid.encodings.idp import encode_idp
from lucid.hyper import hyper_network
from lucid.solvers import SolverOptions, solve
from lucid.verifier import VerificationProblem, node_difference_bounds


def raw_bound(problem, cls, positions, options, targets=None):
    hyper = hyper_network(problem.stack, positions)
    diff = node_difference_bounds(problem, hyper)
    model = encode_idp(problem.n_weights, problem.n_biases, problem.n_bounds, hyper, diff, problem.lower,
                       problem.upper, cls, options, targets=targets, margin_upper=problem.margin_upper)
    if model is None:
        return -np.inf, None
    result = solve(model, "highs", SolverOptions(time_limit=30))
    assert result.status in ("optimal", "infeasible")
    if result.incumbent is not None:  # the encoded optimum itself: exact up to solver tolerance
        exact_value.append(result.incumbent)
    return result.upper_bound, model


exact_value: list[float] = []  # last incumbent seen (the MILP's primal optimum)


@pytest.mark.parametrize("seed,lo", [(0, -1.0), (2, 0.0)])
@pytest.mark.parametrize("md,md_pre,bounds", [(False, False, "interval"), (True, False, "lp"), (True, True, "lp")])
def test_singleton_encoding_is_exact(seed, lo, md, md_pre, bounds):
    stack = tiny_stack(seed)
    lower, upper = np.full(2, lo), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper, bounds=bounds)
    options = EncodingOptions(md=md, md_pre=md_pre, ris=True, bounds=bounds)  # ris never touches singletons
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
