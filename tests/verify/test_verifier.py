"""analyse_node / screen_upper_bounds against the independent exact reference (tests/helpers/bruteforce.py)."""

import json
import math

import numpy as np
import pytest
from bruteforce import exact_for, exact_singleton_bound, grid_leak_max, network, tiny_stack

import lucid.solvers
from lucid.analysis.encode import EncodingOptions
from lucid.network import confidence, stack_from_tensors
from lucid.witness.replay import find_leak
from lucid.settings import VerifySettings
from lucid.solvers import SolverOptions, available_solvers
from lucid.analysis.analyse import NodeRequest, analyse_node
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import screen_upper_bounds

CASES = [(0, -1.0, 2), (2, 0.0, 2), (1, -1.0, 3)]


def make(seed, lo, classes):
    stack = tiny_stack(seed, hidden=(4, 6) if classes == 3 else (4, 4), classes=classes)
    lower, upper = np.full(2, lo), np.ones(2)
    return stack, lower, upper, VerificationProblem.from_stack(stack, lower, upper)


def check_lower(stack, out, positions, cls):
    """A claimed lower bound must be N's confidence at a point where some network of S truly disagrees."""
    if out.lower is None:
        return
    scores = stack.forward(out.witness[None, :])[:, 0, :]
    assert out.lower <= confidence(scores[0], cls)
    assert stack.removed[positions].tolist().count(out.leaking_row) == 1
    assert confidence(scores[stack.positions_of([out.leaking_row])[0]], cls) < 0


@pytest.mark.parametrize("seed,lo,classes", CASES)
def test_singleton_nodes_match_the_exact_bound(seed, lo, classes):
    stack, lower, upper, problem = make(seed, lo, classes)
    for cls in range(classes):
        screen = screen_upper_bounds(problem, cls, np.arange(1, 5))
        for p in range(1, 4 if classes == 2 else 3):
            exact = exact_for(stack, p, cls, lower, upper)
            out = analyse_node(problem, cls, [p])
            assert screen[p - 1] >= out.upper - 1e-6 or screen[p - 1] >= exact
            if exact == -np.inf:
                assert out.upper == -np.inf and out.lower is None
                continue
            assert out.status == "optimal"
            assert exact <= out.upper <= exact + 1e-5  # dual bound + safety margin
            assert out.upper >= grid_leak_max(stack, [p], cls, lower, upper, n=101)
            assert out.lower is not None and exact - 1e-6 <= out.lower <= exact  # repaired witness
            check_lower(stack, out, np.array([p]), cls)


@pytest.mark.parametrize("seed,lo,classes", CASES)
def test_hyper_nodes_are_monotone_and_cover_their_singletons(seed, lo, classes):
    stack, lower, upper, problem = make(seed, lo, classes)
    for cls in range(classes):
        singles = [exact_for(stack, p, cls, lower, upper) for p in range(1, 5)]
        small = analyse_node(problem, cls, [1, 2])
        large = analyse_node(problem, cls, [1, 2, 3, 4])
        assert small.upper >= max(singles[:2])
        assert large.upper >= max(singles)
        assert large.upper >= small.upper - 1e-6
        if large.lower is not None:
            assert large.lower <= max(singles) + 1e-9
            check_lower(stack, large, np.arange(1, 5), cls)


@pytest.mark.parametrize("md,md_pre,coupling,ris,tau", [
    (False, False, False, False, 0.01), (True, False, False, False, 0.01), (True, True, False, False, 0.01),
    (False, False, True, False, 0.01), (True, True, True, True, 0.01), (True, True, True, True, 100.0),
    (False, False, True, True, 100.0), (False, False, False, True, 100.0),
])
def test_every_technique_stays_above_the_exact_singleton_maximum(md, md_pre, coupling, ris, tau):
    stack, lower, upper, problem = make(0, -1.0, 2)
    options = EncodingOptions(md=md, md_pre=md_pre, coupling=coupling, ris=ris, tau=tau)
    for cls in range(2):
        best = max(exact_for(stack, p, cls, lower, upper) for p in range(1, 5))
        out = analyse_node(problem, cls, np.arange(1, 5), encoding=options)
        assert out.upper >= best
        if ris and tau >= 100:
            assert out.stats["relaxed"] > 0


def test_interval_bounds_give_the_same_singleton_answer():
    stack, lower, upper, _ = make(2, 0.0, 2)
    problem = VerificationProblem.from_stack(stack, lower, upper, bounds="interval")
    exact = exact_for(stack, 1, 0, lower, upper)
    out = analyse_node(problem, 0, [1])
    assert exact <= out.upper <= exact + 1e-5


def test_cnn_lowered_network_matches_torch_and_its_bound_is_exact():
    import torch

    rng = np.random.default_rng(7)
    k, d = 2, 4
    conv_w = rng.normal(size=(1, 2, 1, 3)) * 0.8
    dense_w = [rng.normal(size=(2, 4)), rng.normal(size=(2, 2))]
    tensors = {"removed": np.arange(-1, k - 1)}
    tensors["conv.0.weight"] = np.concatenate([conv_w] + [conv_w + 0.1 * rng.normal(size=conv_w.shape) for _ in range(k - 1)]).astype(np.float32)
    tensors["conv.0.bias"] = (0.2 * rng.normal(size=(k, 2))).astype(np.float32)
    for i, w in enumerate(dense_w):
        tensors[f"layers.{i}.weight"] = np.stack([w] + [w + 0.1 * rng.normal(size=w.shape) for _ in range(k - 1)]).astype(np.float32)
        tensors[f"layers.{i}.bias"] = (0.2 * rng.normal(size=(k, w.shape[0]))).astype(np.float32)
    stack = stack_from_tensors(tensors, {"type": "cnn"}, d)
    x = rng.uniform(0, 1, size=(50, d))
    with torch.no_grad():
        for p in range(k):
            h = torch.nn.functional.conv1d(torch.tensor(x)[:, None, :], torch.tensor(tensors["conv.0.weight"][p], dtype=torch.float64),
                                           torch.tensor(tensors["conv.0.bias"][p], dtype=torch.float64))
            h = torch.relu(h).flatten(1)
            h = torch.relu(h @ torch.tensor(tensors["layers.0.weight"][p], dtype=torch.float64).T + torch.tensor(tensors["layers.0.bias"][p], dtype=torch.float64))
            h = h @ torch.tensor(tensors["layers.1.weight"][p], dtype=torch.float64).T + torch.tensor(tensors["layers.1.bias"][p], dtype=torch.float64)
            assert np.allclose(stack.forward(x)[p], h.numpy(), atol=1e-9)
    lower, upper = np.zeros(d), np.ones(d)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    for cls in range(2):
        for p in (1,):
            exact, _ = exact_singleton_bound(network(stack, 0), network(stack, p), cls, lower, upper)
            out = analyse_node(problem, cls, [p])
            if exact == -np.inf:
                assert out.upper == -np.inf
            else:
                assert exact <= out.upper <= exact + 1e-5


def test_replay_drops_a_witness_that_does_not_leak():
    stack, lower, upper, _ = make(1, 0.0, 2)
    # class 1: no network of S can ever disagree (exact beta* = -inf), so nothing may be claimed
    for x in np.random.default_rng(0).uniform(0, 1, size=(20, 2)):
        assert find_leak(stack, np.arange(1, 5), x, 1, lower, upper) is None


def test_a_solver_bound_below_a_replayed_witness_is_never_output(monkeypatch):
    stack, lower, upper, problem = make(0, 0.0, 2)
    exact = exact_for(stack, 1, 0, lower, upper)
    real = lucid.solvers.solve

    def lying_solve(model, solver="highs", options=None, **kw):
        result = real(model, "highs", options)
        if solver == "highs":
            result.upper_bound = result.upper_bound - 0.5  # a "proved" bound below the truth
        return result

    monkeypatch.setattr(lucid.solvers, "solve", lying_solve)
    out = analyse_node(problem, 0, [1])
    assert out.upper >= exact or (math.isinf(out.upper) and out.status == "error")


def test_a_bound_below_the_searched_witness_goes_to_another_backend(monkeypatch):
    """HiGHS once returned, without an incumbent, a dual bound below a witness found by search."""
    if not any(available_solvers().get(name) for name in ("scip", "gurobi")):
        pytest.skip("needs a second backend")
    stack, lower, upper, problem = make(0, 0.0, 2)
    exact = exact_for(stack, 1, 0, lower, upper)
    assert np.isfinite(exact)
    real = lucid.solvers.solve
    lied = []

    def lying_solve(model, solver="highs", options=None, **kw):
        result = real(model, solver, options)
        if solver == "highs":
            result.upper_bound -= 0.5  # below the truth, with no incumbent to contradict it
            result.solution, result.incumbent = None, None
            lied.append(result)
        return result

    monkeypatch.setattr(lucid.solvers, "solve", lying_solve)
    out = analyse_node(problem, 0, [1], encoding=EncodingOptions(obbt=False))
    assert lied and out.stats["search_lower"] is not None
    assert out.status == "optimal" and exact <= out.upper <= exact + 1e-5
    assert out.stats["solves"][0]["solver"] != "highs"


@pytest.mark.parametrize("solver", ["gurobi", "scip", "cbc", "highs+scip"])
def test_backends_agree_on_a_tiny_node(solver):
    if not all(available_solvers().get(name) for name in solver.split("+")):
        pytest.skip(f"{solver} not installed")
    stack, lower, upper, problem = make(0, -1.0, 2)
    ref = analyse_node(problem, 0, [1, 2, 3])
    try:
        got = analyse_node(problem, 0, [1, 2, 3], settings=VerifySettings(solver=solver), solver_options=SolverOptions(time_limit=30))
    except lucid.solvers.SolverError as exc:  # pragma: no cover - licence problems
        pytest.skip(str(exc))
    assert got.status == "optimal"
    assert abs(got.upper - ref.upper) <= 1e-5


def test_from_run_caches_n_bounds(tmp_path):
    from safetensors.numpy import save_file

    stack = tiny_stack(2)
    tensors = {"removed": stack.removed}
    for i, (w, b) in enumerate(zip(stack.weights, stack.biases)):
        tensors[f"layers.{i}.weight"] = w.astype(np.float32)
        tensors[f"layers.{i}.bias"] = b.astype(np.float32)
    save_file(tensors, str(tmp_path / "networks.safetensors"))
    meta = {"format": "lucid-run/1", "num_classes": 2, "input_dim": 2, "train_size": 4, "test_size": 0,
            "domain": {"lower": [0, 0], "upper": [1, 1]}, "architecture": {"type": "mlp", "hidden": [4, 4]},
            "labels": [0, 1]}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    from lucid.rundir import open_run

    first = VerificationProblem.from_run(open_run(tmp_path))
    cached = list((tmp_path / "cache").glob("n-bounds-lp-*.npz"))
    assert len(cached) == 1
    second = VerificationProblem.from_run(open_run(tmp_path))
    for a, b in zip(first.n_bounds.upper, second.n_bounds.upper):
        assert np.array_equal(a, b)
    assert np.array_equal(first.margin_upper, second.margin_upper)


@pytest.mark.parametrize("seed,lo,classes", [(0, -1.0, 2)])
def test_node_bound_tightening_stays_sound(seed, lo, classes):
    stack, lower, upper, problem = make(seed, lo, classes)
    # a zero-second probe forces the tightening path even on problems HiGHS would close at once
    options = EncodingOptions(obbt=True, obbt_probe=0.0)
    for cls in range(classes):
        exact = max(exact_for(stack, p, cls, lower, upper) for p in (1, 2))
        out = analyse_node(problem, cls, [1, 2], encoding=options, solver_options=SolverOptions(time_limit=20))
        assert out.upper >= exact
        single = analyse_node(problem, cls, [1], encoding=options, solver_options=SolverOptions(time_limit=20))
        assert single.upper >= exact_for(stack, 1, cls, lower, upper)


def test_witness_search_finds_only_true_leaks_and_never_beats_the_exact_bound():
    from dataclasses import replace

    from lucid.witness.replay import LeakQuery
    from lucid.witness.search import NODE_SEARCH, search_node_witness

    found_any = False
    for seed, lo in ((0, -1.0), (2, 0.0)):
        stack, lower, upper, _ = make(seed, lo, 2)
        for cls in range(2):
            for p in (1, 2):
                exact = exact_for(stack, p, cls, lower, upper)
                w = search_node_witness(LeakQuery(stack, np.array([p]), cls, lower, upper),
                                        replace(NODE_SEARCH, samples=512, starts=4))
                if w is None:
                    continue
                found_any = True
                assert w.confidence <= exact
                scores = stack.forward(w.x[None, :])[:, 0, :]
                assert confidence(scores[p], cls) < 0 and w.confidence <= confidence(scores[0], cls)
                assert np.all(w.x >= lower) and np.all(w.x <= upper)
    assert found_any


@pytest.mark.parametrize("seed,lo,classes", CASES)
def test_the_split_tier_proves_singletons_below_a_cutoff_without_a_milp(seed, lo, classes):
    """A singleton under a cutoff first gets the ReLU-splitting branch and bound: above the exact
    bound it proves the cutoff alone (no MILP); below it, the MILP still runs and the reported
    bound is the smaller sound one, never below the exact bound."""
    stack, lower, upper, problem = make(seed, lo, classes)
    proved = 0
    for cls in range(classes):
        for p in (1, 2):
            exact = exact_for(stack, p, cls, lower, upper)
            if exact == -np.inf:
                continue
            # 8 s until a split has proved a cutoff: a quarter of it for the first split (one case needs
            # 1.2 s of it alone, too close to 5 / 4 on a loaded machine); then 1 s (CI time): the MILP
            # proves the rest
            above = analyse_node(problem, cls, [p], request=NodeRequest(exact + 0.05),
                                 settings=VerifySettings(split_time=1.0 if proved else 8.0))
            assert exact <= above.upper <= exact + 0.05 + 1e-5 and above.status == "infeasible"
            if above.stats["split"]["proved"]:
                proved += 1
                assert "solves" not in above.stats  # no MILP
            # below the exact bound no split can prove the cutoff: a short split budget is enough to
            # show that the MILP then runs (the default one spends a quarter of 60 s before giving up)
            below = analyse_node(problem, cls, [p], request=NodeRequest(exact - 0.05),
                                 settings=VerifySettings(split_time=1.0))
            assert not below.stats["split"]["proved"] and below.stats["solves"]
            assert below.upper >= exact - 1e-9
    assert proved >= 1


@pytest.mark.parametrize("space, module, name", [("relu", "relu_split", "split_singleton"),
                                                 ("input", "input_split", "input_split_singleton")])
def test_a_split_bound_below_a_replayed_witness_is_dropped(monkeypatch, caplog, space, module, name):
    """The splitting tier's bound is checked like a solver's: were it below a leak the MILP replays,
    the node keeps the MILP's bound (and says so) instead of the wrong one."""
    import importlib

    import lucid.bounds.relu_split as rs

    stack, lower, upper, problem = make(*CASES[0])
    cls, p = next((c, q) for c in range(2) for q in (1, 2) if exact_for(stack, q, c, lower, upper) > -np.inf)
    exact = exact_for(stack, p, cls, lower, upper)
    wrong = rs.SplitResult(exact - 0.5, False, 1, 0.0, {})
    monkeypatch.setattr(importlib.import_module(f"lucid.bounds.{module}"), name, lambda *a, **k: wrong)
    out = analyse_node(problem, cls, [p], request=NodeRequest(exact - 0.6, 2),
                       settings=VerifySettings(split_space=space))
    assert out.stats["split"]["space"] == space
    assert out.lower is not None and out.lower > wrong.bound
    assert out.upper >= exact - 1e-9
    assert "UNSOUND" in caplog.text


@pytest.mark.parametrize("seed,lo,classes", CASES)
@pytest.mark.parametrize("obbt,attempt", [("singletons", 1), ("singletons", 2), (True, 2)])
def test_a_cutoff_proves_nodes_below_it_and_leaves_nodes_above_it_exact(seed, lo, classes, obbt, attempt):
    """attempt 1 is the plain bound-focused MILP, later attempts tighten bounds first (the MILP
    path: the ReLU-splitting tier before it is off here, see the next test)."""
    stack, lower, upper, problem = make(seed, lo, classes)
    encoding = EncodingOptions(obbt=obbt)
    milp_only = VerifySettings(split_time=0)
    # obbt=True differs from "singletons" only on hyper-network nodes (a singleton's is exact): its
    # singletons would repeat the ("singletons", 2) case (CI time)
    nodes = ([1], [2], [1, 2]) if obbt == "singletons" else ([1, 2],)
    for cls in range(classes):
        for positions in nodes:
            exact = max(exact_for(stack, p, cls, lower, upper) for p in positions)
            if exact == -np.inf:
                continue
            plain = analyse_node(problem, cls, positions, encoding=encoding, settings=milp_only)
            above = analyse_node(problem, cls, positions, encoding=encoding, request=NodeRequest(exact + 0.05, attempt),
                                 settings=milp_only)
            if len(positions) == 1:
                assert bool(above.stats["solves"][0].get("plain")) == (attempt == 1)
            # the leak search is skipped only on a singleton's first attempt (hyper-network nodes
            # search many networks at once: on Adult that found the class's first good leak)
            assert ("search_seconds" in above.stats) == (len(positions) > 1 or attempt > 1)
            assert exact <= above.upper <= max(plain.upper, exact + 0.05) + 1e-5
            if len(positions) == 1:
                # nothing reaches the cutoff: proved so, the bound reported is (about) the cutoff
                assert above.status == "infeasible" and above.upper <= exact + 0.05
            below = analyse_node(problem, cls, positions, encoding=encoding, request=NodeRequest(exact - 0.05, attempt),
                                 settings=milp_only)
            assert below.upper >= exact
            if len(positions) == 1:  # a singleton's bound is exact with or without the cutoff
                assert below.upper == pytest.approx(plain.upper, abs=1e-5)
            check_lower(stack, below, np.array(positions), cls)


def test_a_leak_above_a_proved_bound_drops_that_bound():
    """`with_leak` (the solver's, the targeted search's and the splitting tier's leaks): a higher
    leak raises the node's lower bound; one above its "proved" upper bound voids that bound."""
    from lucid.analysis.outcome import NodeOutcome, with_leak
    from lucid.solvers.base import ERROR, TIME_LIMIT
    from lucid.witness.replay import LeakWitness

    base = NodeOutcome(0.5, 0.2, np.zeros(2), 3, TIME_LIMIT, 1.0, {"solves": []})
    leak = lambda conf: LeakWitness(np.ones(2), conf, 1, 7, False)  # noqa: E731
    assert with_leak(base, None, 0) is base and with_leak(base, leak(0.1), 0) is base
    higher = with_leak(base, leak(0.4), 0)
    assert (higher.upper, higher.status, higher.lower, higher.leaking_row) == (0.5, TIME_LIMIT, 0.4, 7)
    above = with_leak(base, leak(0.6), 0)
    assert above.upper == math.inf and above.status == ERROR and above.lower == 0.6
    assert above.stats["unsound_bound"] == 0.5 and "unsound_bound" not in base.stats


def test_a_node_budget_extends_an_all_but_done_split_and_never_runs_past_its_limit():
    from lucid.analysis.time_shares import NodeTimeShares

    budget = NodeTimeShares(time_limit=100.0, start=0.0, split_time=25.0)
    assert budget.split_extension == 75.0  # the rest of the attempt
    assert budget.after_split(30.0).time_limit == 55.0  # the MILP gets as long as the split had
    late = budget.after_split(90.0)  # the split took its extension: the MILP gets what is left
    assert late.time_limit == 100.0 and late.seconds_left(90.0) == 10.0
    unlimited = NodeTimeShares(time_limit=None, start=0.0, split_time=25.0)
    assert unlimited.split_extension == 25.0 and unlimited.after_split(90.0) is unlimited
