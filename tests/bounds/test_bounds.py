"""Bounds: interval, LP-tightened and difference intervals contain every sampled value."""

import numpy as np
import pytest
from bruteforce import network, tiny_stack
from scipy.optimize import linprog

from lucid.bounds.difference import WeightIntervals, difference_bounds
from lucid.bounds.interval import interval_bounds
from lucid.bounds.lp import LpBoundSolver, lp_bounds, proves_empty, rigorous_max
from lucid.milp.model import MilpModel
from lucid.hyper import hyper_network


def sample_layers(weights, biases, x):
    pre, h = [], x
    for k, (w, b) in enumerate(zip(weights, biases)):
        p = h @ w.T + b
        pre.append(p)
        h = np.maximum(p, 0)
    return pre


@pytest.mark.parametrize("lo", [-1.0, 0.0])
def test_lp_bounds_contain_samples_and_are_tighter_than_intervals(lo):
    stack = tiny_stack(3, hidden=(8, 8), d=3)
    w, b = network(stack, 0)
    lower, upper = np.full(3, lo), np.ones(3)
    ib = interval_bounds(w, b, lower, upper)
    lb = lp_bounds(w, b, lower, upper)
    x = np.random.default_rng(0).uniform(lo, 1, size=(20000, 3))
    x[:8] = np.array(np.meshgrid(*[[lo, 1.0]] * 3)).reshape(3, -1).T  # the corners
    tighter = 0
    for k, p in enumerate(sample_layers(w, b, x)):
        assert np.all(p >= lb.lower[k]) and np.all(p <= lb.upper[k])
        assert np.all(lb.lower[k] >= ib.lower[k]) and np.all(lb.upper[k] <= ib.upper[k])
        tighter += np.sum(lb.upper[k] < ib.upper[k] - 1e-6)
    assert tighter > 0  # LP tightening must actually tighten something on a 2-hidden-layer net


def test_rigorous_dual_bound_is_above_the_lp_optimum_and_close():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(6, 4))
    model = MilpModel(
        A=A, row_lower=np.full(6, -np.inf), row_upper=rng.uniform(1, 2, 6), col_lower=-np.ones(4),
        col_upper=np.ones(4), integrality=np.zeros(4, bool), objective=np.zeros(4),
    )
    solver = LpBoundSolver(model)
    for _ in range(5):
        c = rng.normal(size=4)
        ref = -linprog(-c, A_ub=A, b_ub=model.row_upper, bounds=[(-1, 1)] * 4, method="highs").fun
        got = solver.maximise(c)
        assert ref <= got <= ref + 1e-7
    # any dual vector gives a valid (if loose) bound; zero duals give the box bound
    c = rng.normal(size=4)
    assert rigorous_max(model, c, np.zeros(6)) >= np.abs(c).sum() - 1e-12


def test_a_farkas_ray_closes_infeasible_lps_and_no_vector_closes_a_feasible_one():
    """`BoundedLp` re-solved with changing column boxes (as the splitting tier's domain LP): where
    scipy finds the LP infeasible, HiGHS' ray proves it (`proves_empty`); where it is feasible, the
    optimum's duals and random vectors never do."""
    import copy

    from lucid.solvers.lp import BoundedLp

    rng = np.random.default_rng(3)
    feasible = infeasible = proved = 0
    for _ in range(4):
        A = rng.normal(size=(3, 4))
        row_lower = rng.uniform(-2.0, 0.5, 3)
        model = MilpModel(A=A, row_lower=row_lower, row_upper=row_lower + rng.uniform(0.5, 2.0, 3),
                          col_lower=-np.ones(4), col_upper=np.ones(4), integrality=np.zeros(4, bool),
                          objective=rng.normal(size=4))
        lp = BoundedLp(model)
        for _ in range(15):
            lo = rng.uniform(-1.0, 0.5, 4)
            up = np.minimum(lo + rng.uniform(0.0, 1.5, 4), 1.0)
            ref = linprog(np.zeros(4), A_ub=np.vstack([A, -A]), b_ub=np.concatenate([model.row_upper, -row_lower]),
                          bounds=list(zip(lo, up)), method="highs")
            fixed = copy.copy(model)
            fixed.col_lower, fixed.col_upper = lo, up
            answer = lp.duals(lo, up)
            if ref.status == 0:
                assert answer.optimum is not None
                feasible += 1
                for y in (answer.optimum, rng.normal(size=3), 100 * rng.normal(size=3)):
                    assert not proves_empty(fixed, y)
            else:
                assert ref.status == 2 and answer.optimum is None
                infeasible += 1
                proved += answer.farkas is not None and proves_empty(fixed, answer.farkas)
    assert feasible >= 10 and infeasible >= 10 and proved >= 0.8 * infeasible, (feasible, infeasible, proved)


@pytest.mark.parametrize("lo", [-1.0, 0.0])
def test_difference_intervals_and_hyper_bounds_contain_every_network_of_s(lo):
    stack = tiny_stack(4, hidden=(6, 6), classes=3, k=6, d=2)
    lower, upper = np.full(2, lo), np.ones(2)
    wn, bn = network(stack, 0)
    nb = lp_bounds(wn, bn, lower, upper)
    positions = np.arange(1, 6)
    hyper = hyper_network(stack, positions)
    diff = difference_bounds(wn, bn, WeightIntervals.of(hyper), nb, lower, upper)
    x = np.random.default_rng(2).uniform(lo, 1, size=(20000, 2))
    ref = sample_layers(wn, bn, x)
    for p in positions:
        got = sample_layers(*network(stack, p), x)
        for k in range(len(got)):
            d = got[k] - ref[k]
            assert np.all(d >= diff.pre.lower[k]) and np.all(d <= diff.pre.upper[k])
            assert np.all(got[k] >= diff.hyper.lower[k]) and np.all(got[k] <= diff.hyper.upper[k])
            if k < len(got) - 1:
                dz = np.maximum(got[k], 0) - np.maximum(ref[k], 0)
                assert np.all(dz >= diff.post.lower[k]) and np.all(dz <= diff.post.upper[k])


def test_hyper_network_of_a_singleton_is_exact_and_of_a_set_contains_each_member():
    stack = tiny_stack(5, k=4)
    single = hyper_network(stack, [2])
    assert single.exact
    for w_lo, w in zip(single.w_lo, stack.weights):
        assert np.array_equal(w_lo, w[2])
    hyper = hyper_network(stack, [1, 2, 3])
    assert not hyper.exact
    for lo, hi, w in zip(hyper.w_lo, hyper.w_hi, stack.weights):
        assert np.all(lo <= w[1:4]) and np.all(w[1:4] <= hi)
        assert np.all(lo == w[1:4].min(0)) and np.all(hi == w[1:4].max(0))


def test_the_per_lp_time_cap_is_per_lp_not_per_solver_object(monkeypatch):
    # HiGHS measures time_limit against the run time summed over all run() calls of one object;
    # a fixed cap once ended every LP after the first few seconds of OBBT with "time limit".
    import time

    import lucid.solvers.lp as lp
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n, m = 300, 200
    model = MilpModel(A=sp.csr_matrix(rng.normal(size=(m, n))), row_lower=np.full(m, -np.inf), row_upper=np.ones(m),
                      col_lower=np.zeros(n), col_upper=np.ones(n), integrality=np.zeros(n, bool), objective=np.zeros(n))
    solver = LpBoundSolver(model)
    t0 = time.perf_counter()
    assert np.isfinite(solver.maximise(rng.normal(size=n)))
    # 10x one LP: an LP of its own never reaches it, even with the other test worker taking
    # most of the core; the LPs together pass it, by HiGHS's own clock, well before the loop ends
    cap = 10 * max(time.perf_counter() - t0, 1e-3)
    monkeypatch.setattr(lp, "LP_TIME_CAP", cap)
    monkeypatch.setattr(lp, "PRIMAL_CAP", cap)
    values = []
    while solver.lp.h.getRunTime() < 2 * cap:
        values.append(solver.maximise(rng.normal(size=n)))
    assert len(values) >= 4 and all(np.isfinite(v) for v in values)
    # and each value is the LP optimum (up to the rigorous bound's slack)
    c = rng.normal(size=n)
    ref = linprog(-c, A_ub=model.A.toarray(), b_ub=model.row_upper, bounds=[(0, 1)] * n, method="highs")
    assert solver.maximise(c) == pytest.approx(-ref.fun, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("lo", [-1.0, 0.0])
def test_point_weights_by_midpoint_and_radius_give_the_corner_bounds_and_contain_every_product(lo):
    from lucid.bounds.interval import FP_REL, interval_matvec, point_matvec

    rng = np.random.default_rng(7)
    w = rng.normal(size=(9, 5, 4))
    z_lo = rng.uniform(lo, 0.5, size=(9, 4))
    z_hi = z_lo + rng.uniform(0, 0.5, size=(9, 4)) * (rng.random((9, 4)) > 0.2)  # some of zero width
    for weights in (w, w[0]):  # per row, and one shared matrix
        got_lo, got_hi, mag = point_matvec(weights, z_lo, z_hi)
        want_lo, want_hi, _ = interval_matvec(weights, weights, z_lo, z_hi)
        assert np.allclose(got_lo, want_lo, rtol=0, atol=1e-12) and np.allclose(got_hi, want_hi, rtol=0, atol=1e-12)
        z = rng.uniform(z_lo, z_hi, size=(2000, 9, 4))
        z[:2] = z_lo, z_hi  # the corners too
        values = np.einsum("...oi,...i->...o", np.broadcast_to(weights, w.shape), z)
        pad = FP_REL * mag
        assert np.all(values >= got_lo - pad) and np.all(values <= got_hi + pad)


def test_difference_bounds_of_singletons_match_the_interval_path():
    """The screens pass one network per row (the same arrays as lower and upper weights), which
    takes the midpoint-radius path: the same bounds as the general interval path, up to rounding."""
    stack = tiny_stack(4, hidden=(6, 6), classes=3, k=6, d=2)
    lower, upper = np.array([-1.0, 0.0]), np.ones(2)
    wn, bn = network(stack, 0)
    nb = lp_bounds(wn, bn, lower, upper)
    ws = [w[1:] for w in stack.weights]
    bs = [b[1:] for b in stack.biases]
    fast = difference_bounds(wn, bn, WeightIntervals.points(ws, bs), nb, lower, upper)
    general = difference_bounds(wn, bn, WeightIntervals(ws, [w.copy() for w in ws], bs, [b.copy() for b in bs]), nb, lower,
                                upper)
    for got, want in ((fast.pre, general.pre), (fast.hyper, general.hyper)):
        for a, b in zip(got.lower + got.upper, want.lower + want.upper):
            assert np.allclose(a, b, rtol=1e-9, atol=1e-9)
    x = np.random.default_rng(3).uniform(lower, upper, size=(20000, 2))
    ref = sample_layers(wn, bn, x)
    for p in range(1, 6):
        got = sample_layers(*network(stack, p), x)
        for k in range(len(got)):
            d = got[k] - ref[k]
            assert np.all(d >= fast.pre.lower[k][p - 1]) and np.all(d <= fast.pre.upper[k][p - 1])


def test_lp_tightening_cut_short_by_its_deadline_keeps_sound_bounds(monkeypatch):
    """N's LP bounds at `--time-limit`: the tightening stops at the deadline, the neurons it has
    not reached keep their interval bounds, and every bound still holds every sample; the margin
    bounds whose LP gets no time keep their interval value."""
    import lucid.bounds.lp as lp

    stack = tiny_stack(3, hidden=(8, 8), d=3)
    w, b = network(stack, 0)
    lower, upper = np.zeros(3), np.ones(3)
    ib = interval_bounds(w, b, lower, upper)
    none = lp_bounds(w, b, lower, upper, deadline=0.0)  # long past: nothing tightened
    assert all(np.array_equal(x, y) for x, y in zip(none.lower + none.upper, ib.lower + ib.upper))
    full = lp_bounds(w, b, lower, upper)
    asked = []
    monkeypatch.setattr(lp, "past", lambda end: asked.append(end) or len(asked) > 3)  # three neurons, then stop
    cut = lp_bounds(w, b, lower, upper, deadline=1e18)
    x = np.random.default_rng(0).uniform(0, 1, size=(20000, 3))
    for k, p in enumerate(sample_layers(w, b, x)):
        assert np.all(p >= cut.lower[k]) and np.all(p <= cut.upper[k])
        assert np.all(cut.lower[k] <= full.lower[k] + 1e-12) and np.all(cut.upper[k] >= full.upper[k] - 1e-12)
    assert np.array_equal(cut.upper[1][3:], ib.upper[1][3:])  # the neurons not reached: their interval bounds
    margin = lp.lp_margin_upper(w, b, lower, upper, full, deadline=0.0)
    scores = sample_layers(w, b, x)[-1]
    for c in range(scores.shape[1]):
        for t in range(scores.shape[1]):
            assert np.all(scores[:, c] - scores[:, t] <= margin[c, t])
