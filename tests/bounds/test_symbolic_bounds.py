"""Symbolic difference bounds (lucid/bounds/symbolic.py) against the exact brute force and sampling.

Every bound here is a privacy guarantee: it must never be below the true beta*_{c,{i}}. The exact
reference is tests/helpers/bruteforce.py (shares no code with lucid's bounds); the real leave-one-out case
uses the verifier's exact singleton MILP and its replayed witness (a true lower bound).
"""

import math
import time

import numpy as np
import pytest
import torch
from bruteforce import exact_for, network, tiny_stack

from lucid.bounds.pair import PairProblem
from lucid.bounds.stack_screen import symbolic_screen, symbolic_screens
from lucid.bounds.symbolic import ScreenOptions, difference_intervals, set_upper_bound, singleton_upper_bounds
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen, interval_screens, screen_upper_bounds

# (seed, hidden, classes, input dim, domain lower end, perturbation size)
CASES = [
    (0, (4, 4), 2, 2, -1.0, 0.15),
    (1, (4, 4), 3, 2, 0.0, 0.15),
    (2, (3, 3, 3), 2, 2, -1.0, 0.15),
    (3, (3, 3, 3), 3, 2, 0.0, 0.05),
    (4, (4, 4), 2, 3, 0.0, 0.05),
    (5, (3, 3, 3), 2, 3, 0.0, 0.1),
    (6, (3, 3), 3, 4, 0.0, 0.05),
    (7, (4, 4), 2, 2, 0.0, 0.02),
]
POSITIONS = np.arange(1, 5)


def setup(seed, hidden, classes, d, lo, noise):
    stack = tiny_stack(seed, hidden=hidden, classes=classes, d=d, noise=noise)
    lower, upper = np.full(d, lo), np.ones(d)
    return stack, lower, upper, VerificationProblem.from_stack(stack, lower, upper)


def args(problem, positions):
    st = problem.stack
    return (PairProblem([w[0] for w in st.weights], [b[0] for b in st.biases], [w[positions] for w in st.weights],
                        [b[positions] for b in st.biases], problem.n_bounds.lower, problem.n_bounds.upper,
                        problem.lower, problem.upper),)


@pytest.fixture(scope="module")
def exact_cache():
    return {}


def exact(cache, case, stack, cls, lower, upper):
    key = (case, cls)
    if key not in cache:
        cache[key] = np.array([exact_for(stack, p, cls, lower, upper) for p in POSITIONS])
    return cache[key]


def covers(bounds_kc, ex):
    """max over rivals of a per-rival Lagrangian bound must be >= beta* (nan marks the class itself)."""
    best = np.nanmax(bounds_kc, axis=1)
    return np.all((best >= ex) | (ex == -np.inf))


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("intermediate", ["symbolic", "interval"])
def test_every_fixed_lambda_and_alpha_is_above_the_exact_bound(case, intermediate, exact_cache):
    stack, lower, upper, problem = setup(*CASES[case])
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        for lam in (0.0, 0.3, 1.0, 2.5):
            for alpha in (None, 0.0, 0.5, 1.0):
                res = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                             ScreenOptions(lam=lam, alpha=alpha, intermediate=intermediate))
                assert np.all(res.bound >= ex), (cls, lam, alpha, res.bound, ex)
                assert covers(res.lagrangian, ex), (cls, lam, alpha, res.lagrangian, ex)  # before the cap


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_optimisation_iterate_is_above_the_exact_bound(case, exact_cache):
    stack, lower, upper, problem = setup(*CASES[case])
    lam0 = np.random.default_rng(case).uniform(0, 2, size=(len(POSITIONS), stack.num_classes))
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        start = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper)
        for lam, lr in ((1.0, 0.1), (lam0, 0.3)):
            res = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                         ScreenOptions(lam=lam, steps=12, lr=lr), keep_iterates=True)
            assert len(res.iterates) == 13
            for it in res.iterates:
                assert covers(it, ex)
            assert np.all(res.bound >= ex)
            # the result is the minimum over the iterates (the start included)
            rivals = [t for t in range(stack.num_classes) if t != cls]
            assert np.array_equal(np.stack(res.iterates)[:, :, rivals].min(axis=0), res.lagrangian[:, rivals])
            if np.isscalar(lam):  # by construction never looser than its own starting point
                assert np.all(res.bound <= start.bound)


@pytest.mark.parametrize("case", [0, 2, 3, 6])
@pytest.mark.parametrize("intermediate,steps", [("symbolic", 0), ("interval", 0), ("symbolic", 5)])
def test_difference_intervals_contain_sampled_differences(case, intermediate, steps):
    stack, lower, upper, problem = setup(*CASES[case])
    diff = difference_intervals(*args(problem, POSITIONS), intermediate=intermediate, intermediate_steps=steps)
    rng = np.random.default_rng(case)
    x = rng.uniform(lower, upper, size=(20000, len(lower)))
    x[: 2 ** len(lower)] = np.array(np.meshgrid(*zip(lower, upper))).reshape(len(lower), -1).T  # corners
    wn, bn = network(stack, 0)
    ref = _layers(wn, bn, x)
    for j, p in enumerate(POSITIONS):
        got = _layers(*network(stack, p), x)
        for k in range(len(got)):
            d = got[k] - ref[k]
            assert np.all(d >= diff.pre.lower[k][j]) and np.all(d <= diff.pre.upper[k][j])
            assert np.all(got[k] >= diff.hyper.lower[k][j]) and np.all(got[k] <= diff.hyper.upper[k][j])


def test_symbolic_intervals_are_never_looser_than_the_interval_ones():
    # by construction (intersection with the interval propagation), and tighter somewhere
    stack, lower, upper, problem = setup(*CASES[6])
    sym = difference_intervals(*args(problem, POSITIONS))
    ivl = difference_intervals(*args(problem, POSITIONS), intermediate="interval")
    tighter = 0
    for k in range(len(stack.weights)):
        assert np.all(sym.pre.lower[k] >= ivl.pre.lower[k]) and np.all(sym.pre.upper[k] <= ivl.pre.upper[k])
        tighter += np.sum(sym.pre.upper[k] < ivl.pre.upper[k] - 1e-9)
    assert tighter > 0


def _layers(weights, biases, x):
    pre, h = [], x
    for w, b in zip(weights, biases):
        p = h @ w.T + b
        pre.append(p)
        h = np.maximum(p, 0)
    return pre


@pytest.mark.parametrize("case", [0, 1, 4])
def test_the_adapter_has_the_contract_of_the_interval_screen(case, exact_cache):
    stack, lower, upper, problem = setup(*CASES[case])
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        ref = screen_upper_bounds(problem, cls, POSITIONS)
        for steps in (0, 5):
            got = symbolic_screen(problem, cls, POSITIONS, ScreenOptions(steps=steps))
            assert got.shape == ref.shape and got.dtype == np.float64
            assert np.all(got >= ex)
            assert np.all(got[ref == -np.inf] == -np.inf)  # same rival test as the interval screen
            assert np.all(got <= problem.margin_upper[cls].max())
        # subsets and order of positions are respected
        sub = symbolic_screen(problem, cls, POSITIONS[::-2])
        assert np.array_equal(sub, symbolic_screen(problem, cls, POSITIONS)[::-2])
    assert symbolic_screen(problem, 0, np.array([], dtype=np.int64)).shape == (0,)


@pytest.mark.parametrize("case", [1, 3, 6])
def test_screening_every_class_at_once_gives_each_class_its_own_screen(case, monkeypatch):
    """The screens of several classes share their class-independent work (the difference intervals,
    the joint system): each class must get exactly the bounds of its own screen, and a `Screen`
    told the classes screens them in one call and answers the others from it."""
    stack, lower, upper, problem = setup(*CASES[case])
    classes = list(range(stack.num_classes))
    positions = POSITIONS[::-1]
    together = symbolic_screens(problem, classes, positions, chunk=3)
    intervals = interval_screens(problem, classes, positions, chunk=3)
    for j, cls in enumerate(classes):
        assert np.array_equal(together[j], symbolic_screen(problem, cls, positions))
        assert np.array_equal(intervals[j], screen_upper_bounds(problem, cls, positions))
    import lucid.bounds.stack_screen as stack_screen

    calls = []
    monkeypatch.setattr(stack_screen, "symbolic_screens", lambda *a, **kw: calls.append(a[1]) or symbolic_screens(*a, **kw))
    screen = Screen(problem, "symbolic", classes=classes[::-1])
    for cls in classes:
        assert np.array_equal(screen.initial(cls, positions), np.minimum(intervals[cls], together[cls]))
    assert calls == [classes[::-1]]
    # a class it was not told of, or other positions, are screened on their own
    alone = Screen(problem, "symbolic", classes=[0])
    assert np.array_equal(alone.initial(1, positions), np.minimum(intervals[1], together[1]))
    assert np.array_equal(screen.initial(0, positions[:2]), np.minimum(intervals[0], together[0])[:2])
    assert calls[1:] == [[1], classes[::-1]]


def test_chunks_do_not_change_the_bounds():
    stack, lower, upper, problem = setup(*CASES[0])
    a = singleton_upper_bounds(*args(problem, POSITIONS), 0, problem.margin_upper, ScreenOptions(steps=3))
    b = singleton_upper_bounds(*args(problem, POSITIONS), 0, problem.margin_upper, ScreenOptions(steps=3, chunk=3))
    assert np.allclose(a.bound, b.bound, rtol=1e-9, atol=1e-12)


def test_a_repeated_network_keeps_one_copy_and_passes_as_the_copies_do():
    """`JointSystem.select` of one network repeated (the ReLU split's domains) keeps its matrices
    once and multiplies them in one product; the passes equal those of a system of real copies."""
    from lucid.bounds.joint import JointSystem

    stack, lower, upper, problem = setup(*CASES[0])
    pair = args(problem, POSITIONS)[0]
    root = JointSystem(pair.networks(np.array([2])))
    shared = root.select(np.zeros(6, dtype=np.int64))
    copies = JointSystem(pair.networks(np.full(6, 2)))
    assert shared.Wp[0].shape[0] == 1 and copies.Wp[0].shape[0] == 6
    gen = torch.Generator().manual_seed(0)
    top = root.L - 1
    A = torch.randn(6, 3, root.W[top].shape[0], generator=gen, dtype=torch.float64)
    E = torch.randn(6, 3, root.W[top].shape[0], generator=gen, dtype=torch.float64)
    assert torch.allclose(shared.backward(A, E, top), copies.backward(A, E, top), rtol=1e-12, atol=1e-12)
    assert torch.allclose(shared.magnitude(A, E, top), copies.magnitude(A, E, top), rtol=1e-12, atol=1e-12)
    again = shared.select(np.array([5, 1, 3]))  # rows of a one-copy system: the same network
    assert again.Wp[0].shape[0] == 1
    picked = copies.select(np.array([5, 1, 3]))
    assert picked.Wp[0].shape[0] == 3  # real copies of different rows stay copies
    assert torch.allclose(again.backward(A[:3], E[:3], top), picked.backward(A[:3], E[:3], top),
                          rtol=1e-12, atol=1e-12)
    mixed = root.select(np.array([0, 0]))  # still one network; a system of two differs per network
    two = JointSystem(pair.networks(np.array([1, 2])))
    assert mixed.Wp[0].shape[0] == 1 and two.select(np.array([0, 1])).Wp[0].shape[0] == 2


def test_a_set_bound_covers_every_member(exact_cache):
    stack, lower, upper, problem = setup(*CASES[1])
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (1,), stack, cls, lower, upper)
        for members in ([1, 2], [1, 3, 4], [2]):
            got = set_upper_bound(*args(problem, np.array(members)), cls, problem.margin_upper, ScreenOptions(steps=4))
            assert got >= max(ex[m - 1] for m in members)


def test_bad_parameters_are_refused():
    stack, lower, upper, problem = setup(*CASES[0])
    with pytest.raises(ValueError):
        singleton_upper_bounds(*args(problem, POSITIONS), 0, options=ScreenOptions(lam=-0.1))
    with pytest.raises(ValueError):
        singleton_upper_bounds(*args(problem, POSITIONS), 0, options=ScreenOptions(alpha=1.5))
    with pytest.raises(ValueError):
        difference_intervals(*args(problem, POSITIONS), intermediate="lp")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_gives_the_cpu_bounds():  # pragma: no cover - only where a GPU exists
    stack, lower, upper, problem = setup(*CASES[2])
    cpu = symbolic_screen(problem, 0, POSITIONS, ScreenOptions(steps=5))
    gpu = symbolic_screen(problem, 0, POSITIONS, ScreenOptions(steps=5, device="cuda"))
    assert np.allclose(cpu, gpu, rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def wine_run(tmp_path_factory):
    from lucid.rundir import open_run
    from lucid.training import train_run

    path = train_run("sklearn:wine", tmp_path_factory.mktemp("wine") / "run", arch="2x8", epochs=10, batch_size=32,
                     progress=False)
    return VerificationProblem.from_run(open_run(path))


def test_real_leave_one_out_networks_against_the_exact_milp(wine_run):
    from lucid.analysis.analyse import analyse_node

    problem = wine_run
    positions = np.arange(1, len(problem.stack))
    for cls in (0, 2):
        sym = symbolic_screen(problem, cls, positions)
        opt = symbolic_screen(problem, cls, positions, ScreenOptions(steps=10))
        assert np.all(opt <= sym)
        ivl = screen_upper_bounds(problem, cls, positions)
        assert np.median(sym) < np.median(ivl)  # measured: about 2x tighter on this run
        for p in (1, 2):
            out = analyse_node(problem, cls, [p])
            assert out.status in ("optimal", "infeasible")
            if out.lower is not None:  # a replayed, truly leaking witness: a true lower bound
                assert opt[p - 1] >= out.lower and sym[p - 1] >= out.lower
            if out.status == "optimal" and math.isfinite(out.upper):  # exact up to the 1e-5 safety margin
                assert opt[p - 1] >= out.upper - 1e-5


def test_a_cutoff_optimises_only_the_networks_above_it(exact_cache):
    stack, lower, upper, problem = setup(*CASES[2])
    ex = exact(exact_cache, (2,), stack, 1, lower, upper)
    a = args(problem, POSITIONS)
    start = singleton_upper_bounds(*a, 1, problem.margin_upper)
    full = singleton_upper_bounds(*a, 1, problem.margin_upper, ScreenOptions(steps=8, lr=0.1))
    cutoff = float(np.median(start.bound))
    cut = singleton_upper_bounds(*a, 1, problem.margin_upper, ScreenOptions(steps=8, lr=0.1), cutoff=cutoff,
                                 keep_iterates=True)
    assert len(cut.iterates) == 9 and np.all(cut.bound >= ex)
    above = start.bound > cutoff
    assert above.any() and (~above).any()
    assert np.array_equal(cut.bound[~above], start.bound[~above])
    # the same discard decisions; above the cutoff the same optimised bounds
    assert np.array_equal(cut.bound > cutoff, full.bound > cutoff)
    high = full.bound > cutoff
    assert np.allclose(cut.bound[high], full.bound[high], rtol=1e-9, atol=1e-12)


def test_simplex_projection():
    from lucid.bounds.symbolic import _simplex

    v = torch.tensor([[0.2, 0.5, 0.9], [1.0, 0.0, 0.0], [-3.0, 4.0, 0.5], [0.3, 0.3, 0.4]], dtype=torch.float64)
    p = _simplex(v)
    assert torch.all(p >= 0) and torch.allclose(p.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.equal(p[1], v[1]) and torch.allclose(p[3], v[3]) and torch.equal(p[2], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("case", [1, 3, 6])
def test_multi_class_mixing_is_sound_in_every_iterate(case, exact_cache):
    stack, lower, upper, problem = setup(*CASES[case])
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        plain = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                       ScreenOptions(steps=10, lr=0.1, mix=False))
        mixed = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                       ScreenOptions(steps=10, lr=0.1), keep_iterates=True)
        for it in mixed.iterates:
            assert covers(it, ex)
        assert np.all(mixed.bound >= ex) and np.all(plain.bound >= ex)


@pytest.mark.parametrize("case", [0, 1, 2, 5])
def test_refined_survivors_stay_above_the_exact_bound(case, exact_cache):
    stack, lower, upper, problem = setup(*CASES[case])
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        plain = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                       ScreenOptions(steps=5, lr=0.1))
        refined = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper,
                                         ScreenOptions(steps=5, lr=0.1, refine_steps=5))
        assert np.all(refined.bound >= ex)
        assert np.all(refined.bound <= plain.bound)  # per rival the smaller of two sound bounds


@pytest.mark.parametrize("case", [0, 3, 5, 6])
def test_a_nodes_symbolic_intervals_hold_every_member_and_are_tighter(case):
    """What the encoder gets for a node with `--screen symbolic|optimised`: the interval
    propagation intersected with the hull of the members' symbolic intervals. Every member's
    sampled pre- and post-activation differences and pre-activations stay inside."""
    from lucid.hyper import hyper_network
    from lucid.analysis.problem import node_difference_bounds

    stack, lower, upper, problem = setup(*CASES[case])
    hyper = hyper_network(stack, POSITIONS)
    plain = node_difference_bounds(problem, hyper)
    tight = node_difference_bounds(problem, hyper, POSITIONS)
    rng = np.random.default_rng(10 + case)
    x = rng.uniform(lower, upper, size=(20000, len(lower)))
    ref = _layers(*network(stack, 0), x)
    for p in POSITIONS:
        got = _layers(*network(stack, p), x)
        for k in range(len(got)):
            d = got[k] - ref[k]
            assert np.all(d >= tight.pre.lower[k]) and np.all(d <= tight.pre.upper[k])
            assert np.all(got[k] >= tight.hyper.lower[k]) and np.all(got[k] <= tight.hyper.upper[k])
            if k < len(got) - 1:
                dz = np.maximum(got[k], 0) - np.maximum(ref[k], 0)
                assert np.all(dz >= tight.post.lower[k]) and np.all(dz <= tight.post.upper[k])
    for a, b in ((plain.pre, tight.pre), (plain.post, tight.post), (plain.hyper, tight.hyper)):
        assert all(np.all(lo2 >= lo1) for lo1, lo2 in zip(a.lower, b.lower))
        assert all(np.all(hi2 <= hi1) for hi1, hi2 in zip(a.upper, b.upper))
    width = lambda lb: sum(float(np.sum(hi - lo)) for lo, hi in zip(lb.lower, lb.upper))
    assert width(tight.pre) < width(plain.pre)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]])
def test_the_tightening_pass_takes_rows_and_gets_the_products_bit_for_bit(case, monkeypatch):
    """`_tighten`'s objectives select neurons, so its top affine step takes rows of the matrices
    (`_rows_step`) instead of products with selection matrices: the bounds must be the same bits."""
    from lucid.bounds.joint import JointSystem

    stack, lower, upper, problem = setup(*case)
    pair = args(problem, POSITIONS)[0]
    fast = JointSystem(pair)
    monkeypatch.setattr(JointSystem, "_rows_step", lambda self, *a, **k: None)  # `first=None`: the products
    slow = JointSystem(pair)
    assert fast.L > 2  # a hidden layer above the first one: tightened
    for name in ("dl", "du", "hl", "hu"):
        for a, b in zip(getattr(fast, name), getattr(slow, name)):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("case,rank", [(1, 1), (3, 1), (6, 1)])
def test_a_box_screen_tightens_only_the_networks_that_could_be_highest(case, rank, monkeypatch):
    """`Screen.highest`: per class its `rank` largest bounds are exactly the `rank` largest of the
    full screen taken with the prior bounds (rank M + 1 for residual sets of M networks), every
    network's bound is that full screen's or its interval (or prior) bound, never below the full
    one, and the symbolic screen saw only some networks."""
    import lucid.analysis.screen as screen_module
    import lucid.bounds.stack_screen as stack_screen

    stack, lower, upper, problem = setup(*CASES[case])
    classes = list(range(stack.num_classes))
    rng = np.random.default_rng(case)
    prior = {c: rng.uniform(-0.5, 3.0, len(POSITIONS)) for c in classes}
    for c in classes:
        prior[c][-1] = -10.0  # the last network is known far below: it can only stay so
    intervals = interval_screens(problem, classes, POSITIONS)
    full = np.minimum(np.minimum(intervals, symbolic_screens(problem, classes, POSITIONS)),
                      np.array([prior[c] for c in classes]))
    seen = []
    monkeypatch.setattr(stack_screen, "symbolic_screens",
                        lambda p, cl, pos, **kw: seen.extend(pos) or symbolic_screens(p, cl, pos, **kw))
    monkeypatch.setattr(screen_module, "LAZY_BATCH", len(classes))  # one network per class a pass: several passes
    got = Screen(problem, "symbolic").highest(classes, POSITIONS, prior, rank=rank)
    for j, c in enumerate(classes):
        assert np.array_equal(np.sort(got[c])[-rank:], np.sort(full[j])[-rank:])
        cheap = np.minimum(intervals[j], prior[c])
        assert np.all(got[c] >= full[j]) and np.all((got[c] == full[j]) | (got[c] == cheap))
    assert len(seen) == len(set(seen)) and 0 < len(seen) and POSITIONS[-1] not in seen, seen


def test_a_box_screen_for_residual_sets_tightens_the_m_plus_one_highest(monkeypatch):
    """With residual sets of M networks a box needs its M + 1 highest bounds tight (the largest
    outside the set is its level): rank 2 tightens past the point where the largest alone stops."""
    import lucid.analysis.screen as screen_module

    stack, lower, upper, problem = setup(*CASES[6])
    full = np.minimum(interval_screens(problem, [0], POSITIONS), symbolic_screens(problem, [0], POSITIONS))[0]
    monkeypatch.setattr(screen_module, "LAZY_BATCH", 1)
    highest = Screen(problem, "symbolic").highest([0], POSITIONS, rank=1)[0]
    second = Screen(problem, "symbolic").highest([0], POSITIONS, rank=2)[0]
    assert highest.max() == full.max() and np.sort(highest)[-2] > np.sort(full)[-2]  # rank 1 stops early here
    assert np.array_equal(np.sort(second)[-2:], np.sort(full)[-2:]) and np.all(second >= full)


# --- under a deadline (`--time-limit`): every bound still sound, the unreached ones crude --------------


def _past_after(calls: int):
    """A stand-in for lucid.deadline.past that says the deadline has passed from its `calls`-th
    question on (a deadline that runs out in the middle of the work, deterministically)."""
    asked = []

    def past(end):
        asked.append(end)
        return end is not None and len(asked) >= calls

    return past


@pytest.mark.parametrize("case", [1, 3, 6])
def test_an_optimisation_cut_short_by_its_deadline_stays_above_the_exact_bound(case, exact_cache, monkeypatch):
    """The optimised screen's Adam steps stop at the deadline with the iterates they have: each is
    a sound bound, so the result lies between the full optimisation's and the starting point's."""
    import lucid.bounds.symbolic as symbolic

    stack, lower, upper, problem = setup(*CASES[case])
    options = ScreenOptions(steps=20, lr=0.1)
    for cls in range(stack.num_classes):
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        start = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper)
        full = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper, options)
        monkeypatch.setattr(symbolic, "past", _past_after(4))  # a few steps, then the deadline
        cut = singleton_upper_bounds(*args(problem, POSITIONS), cls, problem.margin_upper, options,
                                     deadline=time.monotonic() + 3600, keep_iterates=True)
        monkeypatch.undo()
        assert np.all(cut.bound >= ex) and np.all(cut.bound >= full.bound - 1e-12) and np.all(cut.bound <= start.bound)
        for it in cut.iterates:
            assert covers(it, ex)


def test_networks_a_deadline_left_unscreened_keep_a_sound_bound(exact_cache):
    """A past deadline leaves every network to its crudest sound bound: +inf from the symbolic and
    optimised screens (the caller keeps what it had), N's own margin bound from the interval screen
    (`unscreened_bound`, above every network's exact bound), and the interval bound from the
    screen of every class at once."""
    from lucid.analysis.screen import unscreened_bound
    from lucid.bounds.symbolic import class_screens

    case = 3
    stack, lower, upper, problem = setup(*CASES[case])
    gone = 0.0  # a time.monotonic() value long past
    classes = list(range(stack.num_classes))
    assert np.all(singleton_upper_bounds(*args(problem, POSITIONS), 0, problem.margin_upper,
                                         ScreenOptions.optimised(), deadline=gone).bound == np.inf)
    assert np.all(class_screens(*args(problem, POSITIONS), classes, problem.margin_upper, deadline=gone) == np.inf)
    assert np.all(symbolic_screen(problem, 0, POSITIONS, ScreenOptions.optimised(), deadline=gone) == np.inf)
    crude = interval_screens(problem, classes, POSITIONS, deadline=gone)
    for cls in classes:
        ex = exact(exact_cache, (case,), stack, cls, lower, upper)
        assert np.all(crude[cls] == unscreened_bound(problem, cls)) and np.all(crude[cls] >= ex)
        screen = Screen(problem, "optimised", classes=[cls])
        assert np.array_equal(screen.initial(cls, POSITIONS, deadline=gone), crude[cls])
        assert np.all(screen.refine(cls, POSITIONS, -np.inf, deadline=gone) == np.inf)


def test_a_nodes_hull_is_given_up_unless_it_covers_every_member(monkeypatch):
    """The symbolic hull bounds only the members it was taken over: a deadline that stops it after
    some of them leaves the node its interval difference bounds."""
    import lucid.analysis.problem as problem_module
    from lucid.hyper import hyper_network
    from lucid.analysis.problem import node_difference_bounds

    stack, lower, upper, problem = setup(*CASES[0])
    hyper = hyper_network(stack, POSITIONS)
    plain = node_difference_bounds(problem, hyper)
    monkeypatch.setattr(problem_module, "SYMBOLIC_CHUNK", 1)
    monkeypatch.setattr("lucid.deadline.past", _past_after(3))  # two networks, then the deadline
    cut = node_difference_bounds(problem, hyper, POSITIONS, deadline=1.0)
    for a, b in ((plain.pre, cut.pre), (plain.post, cut.post), (plain.hyper, cut.hyper)):
        assert all(np.array_equal(x, y) for x, y in zip(a.lower + a.upper, b.lower + b.upper))
