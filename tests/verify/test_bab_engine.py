"""Queue logic of the branch-and-bound engine, with a deterministic in-test analyser.

`FakeAnalyser` is a TEST DOUBLE for lucid.analysis.analyse.analyse_node: every network i has a known true
bound v[i]; a node's "MILP" returns max(v[S]) + slack * (|S| - 1) (a sound, set-monotone over-
approximation, exact for singletons) and, as the replayed witness, v of the set's smallest member
(a true lower bound). The real analyser is exercised in test_verify_cli.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import math
import threading
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from lucid.bab.engine import Engine
from lucid.bab.hooks import EngineHooks
from lucid.bab.state import ClassState
from lucid.settings import VerifySettings
from lucid.bab.events import EventLog, read_events
from lucid.bab.partition import choose_k, split_positions
from lucid.bab.workers import Executor, ThreadExecutor
from lucid.analysis.time_shares import RETRY_GROWTH


@dataclass
class Outcome:
    upper: float
    lower: float | None
    status: str = "optimal"
    leaking_row: int | None = None
    witness: np.ndarray | None = None
    seconds: float = 0.0
    stats: dict = field(default_factory=dict)


class FakeAnalyser:
    def __init__(self, values: np.ndarray, slack: float = 0.05, timeout_above: int | None = None):
        self.values = values  # indexed by position; position 0 (N) unused
        self.slack = slack
        self.timeout_above = timeout_above
        self.calls: list[tuple[int, ...]] = []
        self.cutoffs: list[float] = []
        self.attempts: list[tuple[tuple[int, ...], int, float | None]] = []  # (positions, attempt, time limit)
        self.lock = threading.Lock()

    def __call__(self, cls: int, positions: np.ndarray, time_limit, cutoff=-math.inf, attempt=1):
        with self.lock:
            self.calls.append(tuple(int(p) for p in positions))
            self.cutoffs.append(cutoff)
            self.attempts.append((self.calls[-1], attempt, time_limit))
        v = self.values[positions]
        upper = float(v.max() + self.slack * (len(positions) - 1))
        status = "optimal"
        if self.timeout_above is not None and len(positions) > self.timeout_above:
            status, upper = "time_limit", upper + 1.0  # a weaker dual bound, still sound
        leaks = v > -math.inf
        lower = float(v[leaks][0]) if leaks.any() else None
        if leaks.any() and v.max() < cutoff:
            # like the real analyser: nothing above the cutoff is proved; the cutoff is the bound
            status, upper = "infeasible", min(upper, cutoff)
        return Outcome(upper=upper if leaks.any() else -math.inf, lower=lower, status=status,
                       leaking_row=int(positions[0]))


def make_engine(tmp_path, values, *, workers=2, params=None, screen=None, analyser=None, **cfg):
    analyser = analyser or FakeAnalyser(values)
    if params is None:
        params = np.random.default_rng(0).normal(size=(len(values), 5))
    log = EventLog(tmp_path / "log.jsonl")
    engine = Engine(ThreadExecutor(analyser, workers), [0], len(values), VerifySettings(**cfg), params=params,
                    hooks=EngineHooks(screen=screen), log=log)
    return engine, analyser, log


def anytime(events, cls=0):
    return [(e["upper"], e["lower"]) for e in events if e["event"] == "anytime" and e["class"] == cls]


def as_float(v):
    return None if v is None else float(v)


@pytest.mark.parametrize("workers", [1, 3])
def test_bab_finds_exact_max_and_log_is_monotone(tmp_path, workers):
    rng = np.random.default_rng(1)
    values = np.concatenate([[0.0], rng.uniform(0, 1, size=40)])
    engine, analyser, log = make_engine(tmp_path, values, workers=workers)
    cs = engine.run()[0]
    log.close()
    assert cs.done and cs.complete
    assert cs.upper == pytest.approx(values[1:].max(), abs=1e-12)
    assert cs.lower is not None and cs.lower <= cs.upper + 1e-12
    trace = anytime(read_events(tmp_path / "log.jsonl"))
    uppers = [as_float(u) for u, _ in trace]
    assert all(b <= a for a, b in zip(uppers, uppers[1:])), uppers
    for u, lo in trace:
        assert lo is None or as_float(lo) <= as_float(u) + 1e-12
    # pruning by the lower bound: far fewer than one MILP per network + the whole tree
    assert len(analyser.calls) < 2 * 40


def test_closing_rule_skips_dominated_nodes(tmp_path):
    # One network far above the rest: once its witness is seen, everything else closes.
    values = np.concatenate([[0.0], np.full(30, 0.1), [5.0]])
    engine, analyser, _ = make_engine(tmp_path, values, workers=1)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == pytest.approx(5.0)
    sizes = [len(c) for c in analyser.calls]
    assert sizes.count(1) <= 2  # never solves the 30 dominated singletons


def test_naive_solves_every_network(tmp_path):
    values = np.concatenate([[0.0], np.linspace(0, 1, 12)])
    engine, analyser, _ = make_engine(tmp_path, values, naive=True)
    cs = engine.run()[0]
    assert sorted(analyser.calls) == [(p,) for p in range(1, 13)]
    assert cs.upper == pytest.approx(1.0) and cs.complete


def test_no_bab_reports_the_hyper_network_bound(tmp_path):
    values = np.concatenate([[0.0], np.linspace(0, 1, 9)])
    engine, analyser, _ = make_engine(tmp_path, values, bab=False)
    cs = engine.run()[0]
    assert analyser.calls == [tuple(range(1, 10))]
    assert cs.upper == pytest.approx(1.0 + 0.05 * 8)


def test_timed_out_node_keeps_dual_bound_and_is_branched(tmp_path):
    values = np.concatenate([[0.0], np.linspace(0, 1, 16)])
    analyser = FakeAnalyser(values, timeout_above=4)
    engine, analyser, _ = make_engine(tmp_path, values, analyser=analyser, node_time_limit=1.0)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == pytest.approx(1.0)
    assert any(len(c) > 4 for c in analyser.calls) and any(len(c) == 1 for c in analyser.calls)


def test_infeasible_everywhere_gives_minus_inf(tmp_path):
    values = np.concatenate([[0.0], np.full(6, -math.inf)])
    engine, _, _ = make_engine(tmp_path, values)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == -math.inf and cs.lower is None


def test_screening_drops_networks_that_cannot_leak(tmp_path):
    values = np.concatenate([[0.0], np.linspace(0, 1, 10), np.full(10, -math.inf)])
    screen_calls = []

    def screen(cls, positions, deadline=None):
        screen_calls.append(len(positions))
        return values[positions] + 0.3  # sound: above every true value; -inf stays -inf

    engine, analyser, _ = make_engine(tmp_path, values, screen=screen)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == pytest.approx(1.0)
    assert screen_calls == [20]
    assert all(max(c) <= 10 for c in analyser.calls)  # the infeasible networks never reached the MILP


def test_gap_stops_early_with_sound_bounds(tmp_path):
    rng = np.random.default_rng(3)
    values = np.concatenate([[0.0], rng.uniform(0, 1, size=60)])
    engine, _, _ = make_engine(tmp_path, values, gap=0.5)
    cs = engine.run()[0]
    assert cs.complete and cs.upper <= cs.lower + 0.5  # the engine's form: upper - lower may be 1 ulp above
    assert cs.upper >= values[1:].max() - 1e-12 and cs.lower <= values[1:].max() + 1e-12


@pytest.mark.parametrize("rel_gap", [0.0, 0.25])
def test_relative_gap_closes_nodes_below_the_cutoff_and_keeps_their_bound(tmp_path, rel_gap):
    rng = np.random.default_rng(4)
    values = np.concatenate([[0.0], rng.uniform(0.5, 1.0, size=50)])
    analyser = FakeAnalyser(values, slack=0.2)
    engine, analyser, log = make_engine(tmp_path, values, analyser=analyser, rel_gap=rel_gap)
    cs = engine.run()[0]
    log.close()
    true_max = values[1:].max()
    assert cs.complete
    assert cs.lower <= true_max + 1e-12 <= cs.upper + 2e-12  # sound on both sides
    assert cs.upper <= cs.lower * (1 + rel_gap) + 1e-12  # and within the requested gap
    # every MILP after the first witness was told the level it must get below: lower * (1 + rel_gap)
    finite = [c for c in analyser.cutoffs if math.isfinite(c)]
    assert finite and all(c >= 0.5 for c in finite)
    events = read_events(tmp_path / "log.jsonl")
    closed_in_gap = [e for e in events if e["event"] == "closed" and "gap" in e["reason"]]
    # a finish that used the tolerance says so (reports must not call it exact)
    assert cs.within_gap == ("gap" in cs.reason) == (cs.upper > cs.lower)
    assert ClassState.from_json(0, cs.to_json()).within_gap == cs.within_gap
    if rel_gap == 0:
        assert cs.upper == pytest.approx(true_max) and not closed_in_gap
    else:
        # nodes closed within the gap keep their bounds in the reported upper bound
        assert closed_in_gap and cs.upper >= max(e["upper"] for e in closed_in_gap) - 1e-12


def test_relative_gap_costs_fewer_solves_than_exact(tmp_path):
    rng = np.random.default_rng(5)
    values = np.concatenate([[0.0], rng.uniform(0.9, 1.0, size=60)])
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    exact, a_exact, _ = make_engine(tmp_path / "a", values, analyser=FakeAnalyser(values, slack=0.05))
    loose, a_loose, _ = make_engine(tmp_path / "b", values, analyser=FakeAnalyser(values, slack=0.05), rel_gap=0.1)
    exact.run(), loose.run()
    assert len(a_loose.calls) < len(a_exact.calls)


def test_time_limit_returns_sound_anytime_bound(tmp_path):
    values = np.concatenate([[0.0], np.linspace(0, 1, 30)])

    class Slow(FakeAnalyser):
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            import time
            time.sleep(0.05)
            return super().__call__(cls, positions, time_limit, cutoff, attempt)

    engine, _, _ = make_engine(tmp_path, values, analyser=Slow(values), time_limit=0.3)
    cs = engine.run()[0]
    assert cs.done and not cs.complete
    assert cs.upper >= 1.0 - 1e-12


def test_split_is_a_deterministic_partition():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 6)) * 10
    params = np.concatenate([np.zeros((1, 6)), np.repeat(centres, 5, axis=0) + rng.normal(size=(20, 6)) * 0.01])
    positions = np.arange(1, 21)
    groups = split_positions(params, positions)
    assert len(groups) == 4  # the elbow of the distortion curve is at the 4 true clusters
    assert sorted(np.concatenate(groups).tolist()) == positions.tolist()
    assert [g.tolist() for g in groups] == [g.tolist() for g in split_positions(params, positions)]
    same = np.zeros((10, 3))
    halves = split_positions(same, np.arange(1, 10))
    assert len(halves) >= 2 and sorted(np.concatenate(halves).tolist()) == list(range(1, 10))


def test_small_unfinished_sets_go_to_singletons():
    from lucid.bab.partition import UNPROVED_SINGLETONS_AT, split_node

    rng = np.random.default_rng(1)
    # one outlier among near-identical networks: k-means would peel it off and keep the rest together
    params = np.concatenate([np.zeros((1, 5)), rng.normal(size=(7, 5)) * 0.01, np.full((1, 5), 10.0)])
    positions = np.arange(1, 9)
    assert [len(g) for g in split_node(params, positions, proved=True)] == [7, 1]
    assert [g.tolist() for g in split_node(params, positions[::-1], proved=False)] == [[p] for p in positions]
    big = np.concatenate([np.zeros((1, 5)), rng.normal(size=(UNPROVED_SINGLETONS_AT + 1, 5))])
    groups = split_node(big, np.arange(1, UNPROVED_SINGLETONS_AT + 2), proved=False)
    assert 2 <= len(groups) < UNPROVED_SINGLETONS_AT + 1  # larger sets still cluster
    assert sorted(np.concatenate(groups).tolist()) == list(range(1, UNPROVED_SINGLETONS_AT + 2))


@pytest.mark.parametrize("rel_gap", [0.0, 0.1])
def test_a_useless_hyper_network_milp_makes_the_node_peel_its_top_screened_networks(tmp_path, rel_gap, monkeypatch):
    import lucid.bab.engine

    monkeypatch.setattr(lucid.bab.engine, "PEEL_ROOT_ABOVE", {})  # the root gets its hyper MILP here
    rng = np.random.default_rng(6)
    values = np.concatenate([[0.0], rng.uniform(0.2, 1.0, size=40)])
    screen_values = values + rng.uniform(0.05, 0.3, size=41)  # sound, and in another order than values

    def screen(cls, positions, deadline=None):
        return screen_values[positions]

    # a hyper-network "MILP" far above the screen, as on Adult 2x50
    analyser = FakeAnalyser(values, slack=5.0)
    engine, analyser, log = make_engine(tmp_path, values, workers=1, screen=screen, analyser=analyser, rel_gap=rel_gap)
    cs = engine.run()[0]
    log.close()
    assert cs.complete and cs.upper >= values[1:].max() - 1e-12
    assert cs.upper <= cs.lower * (1 + rel_gap) + 1e-12
    assert len(analyser.calls[0]) > 1 and all(len(c) == 1 for c in analyser.calls[1:])  # no second hyper MILP
    singles = [c[0] for c in analyser.calls[1:]]
    assert singles == sorted(singles, key=lambda p: -screen_values[p])  # best-first by screened bound
    events = read_events(tmp_path / "log.jsonl")
    assert any(e["event"] == "split" and e.get("peel") for e in events)


def test_a_large_screened_root_is_peeled_without_a_hyper_network_milp(tmp_path):
    from lucid.bab.partition import PEEL_ROOT_ABOVE

    rng = np.random.default_rng(7)
    n = PEEL_ROOT_ABOVE["interval"] + 8
    values = np.concatenate([[0.0], rng.uniform(0.2, 1.0, size=n)])
    screen_values = values + rng.uniform(0.05, 0.3, size=n + 1)
    engine, analyser, log = make_engine(tmp_path, values, workers=1,
                                        screen=lambda c, pos, deadline=None: screen_values[pos],
                                        analyser=FakeAnalyser(values, slack=5.0), rel_gap=0.1)
    cs = engine.run()[0]
    log.close()
    assert cs.complete and cs.upper >= values[1:].max() - 1e-12  # sound
    assert analyser.calls and all(len(c) == 1 for c in analyser.calls)  # singletons only
    assert len(analyser.calls) < n  # the tolerance and the screen closed the rest


def test_peel_top_partitions_by_screened_bound():
    from lucid.bab.partition import peel_top

    screen = np.array([0.0, 0.3, 0.9, 0.1, 0.5])
    groups = peel_top(np.array([1, 2, 3, 4]), screen, 2)
    assert [g.tolist() for g in groups] == [[2], [4], [1, 3]]
    assert [g.tolist() for g in peel_top(np.array([3, 4]), screen, 2)] == [[4], [3]]


def test_choose_k_picks_the_elbow():
    assert choose_k({1: 100.0, 2: 60.0, 4: 10.0, 8: 8.0}) == 4
    assert choose_k({1: 100.0, 2: 20.0, 4: 15.0, 8: 10.0}) == 2


def test_search_witness_is_a_replayed_leak(tmp_path):
    from bab_fixtures import write_tiny_run
    from lucid.witness.search import CLASS_SEARCH, search_class_witness
    from lucid.network import confidence
    from lucid.rundir import open_run
    from lucid.analysis.analyse import analyse_node
    from lucid.analysis.problem import VerificationProblem

    run = open_run(write_tiny_run(tmp_path / "run", networks=6, seed=2))
    problem = VerificationProblem.from_run(run, bounds="interval")
    positions = np.arange(1, 7)
    found = 0
    for cls in (0, 1):
        w = search_class_witness(problem, cls, positions, effort=replace(CLASS_SEARCH, samples=64))
        if w is None:
            continue
        found += 1
        scores = problem.stack.forward(w.x[None, :])[:, 0, :]
        conf = confidence(scores, cls)
        assert conf[0] >= w.confidence  # claimed value is N's confidence, rounded down
        assert conf[1:].min() < 0  # some leave-one-out network really disagrees there
        assert np.all(w.x >= problem.lower) and np.all(w.x <= problem.upper)
        exact = max(analyse_node(problem, cls, np.array([p])).upper for p in positions)
        assert w.confidence <= exact
    assert found  # this fixture leaks for at least one class


def test_nodes_stop_before_the_session_deadline_so_their_bounds_count(tmp_path, monkeypatch):
    """A node MILP that uses its whole time limit must still report before the session ends."""
    import time

    import lucid.analysis.time_shares

    values = np.concatenate([[0.0], np.linspace(0, 1, 8)])
    seen_limits = []

    class UsesItsLimit(FakeAnalyser):
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            seen_limits.append(time_limit)
            time.sleep(time_limit)  # a solver that runs to its limit, then returns its dual bound
            out = super().__call__(cls, positions, time_limit, cutoff, attempt)
            out.status = "time_limit"
            return out

    # the product's margin for a 2-s session is 40 ms, less than a busy machine may take to hand
    # a finished thread's result over; a real session (minutes) has seconds
    monkeypatch.setattr(lucid.analysis.time_shares, "deadline_margin", lambda total: 0.5)
    engine, _, _ = make_engine(tmp_path, values, analyser=UsesItsLimit(values), workers=1, time_limit=2.0)
    cs = engine.run()[0]
    assert seen_limits and seen_limits[0] <= 1.5
    assert cs.solved >= 1  # the root's bound was collected, not lost at the deadline
    assert cs.upper >= 1.0 - 1e-12


def test_an_unproved_singleton_is_retried_with_its_attempt_number_and_a_longer_limit(tmp_path):
    """The analyser is told which attempt it serves (the verifier tightens bounds only on retries)."""
    values = np.concatenate([[0.0], np.linspace(0, 1, 6)])

    class FirstTryTimesOut(FakeAnalyser):
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            out = super().__call__(cls, positions, time_limit, cutoff, attempt)
            if len(positions) == 1 and attempt == 1 and out.status == "optimal":
                out.status, out.upper = "time_limit", out.upper + 0.5  # sound but weak
            return out

    analyser = FirstTryTimesOut(values)
    engine, _, _ = make_engine(tmp_path, values, analyser=analyser, workers=1, node_time_limit=3.0)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == pytest.approx(1.0)
    top = [(a, limit) for pos, a, limit in analyser.attempts if pos == (6,)]
    assert top[0] == (1, 3.0) and (2, 3.0 * RETRY_GROWTH) in top


def test_default_node_time_limit_is_a_share_of_the_total():
    from lucid.analysis.time_shares import default_node_time_limit

    assert default_node_time_limit(None) is None
    assert default_node_time_limit(60) == 20.0
    assert default_node_time_limit(3600) == 450.0


def test_checkpoint_state_keeps_the_gap_floor_and_peel_flags(tmp_path):
    from lucid.bab.engine import ClassState
    from lucid.bab.node import OPEN, Node

    cs = ClassState(cls=0, lower=0.5, upper=0.6, gap_floor=0.54)
    cs.nodes[3] = Node(id=3, parent=0, positions=np.array([4, 5]), upper=0.58, state=OPEN, peel=True)
    back = ClassState.from_json(0, cs.to_json())
    assert back.gap_floor == 0.54 and back.nodes[3].peel and back.open_heap == [(-0.58, 3)]
    old = cs.to_json()
    del old["gap_floor"]
    for n in old["nodes"]:
        del n["peel"]
    legacy = ClassState.from_json(0, old)  # a checkpoint written before these fields existed
    assert legacy.gap_floor == -math.inf and not legacy.nodes[3].peel


def test_the_last_open_singleton_gets_the_remaining_time_instead_of_a_longer_limit(tmp_path):
    """Once nothing else can need a worker, a retry with a longer limit would only restart it."""
    values = np.concatenate([[0.0], [0.2, 0.5, 0.9]])

    class NeedsTime(FakeAnalyser):  # a singleton is proved only with at least 20 s
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            out = super().__call__(cls, positions, time_limit, cutoff, attempt)
            if len(positions) == 1 and time_limit < 20.0:
                out.status, out.upper = "time_limit", out.upper + 0.5
            return out

    analyser = NeedsTime(values)
    engine, _, _ = make_engine(tmp_path, values, analyser=analyser, workers=1, node_time_limit=1.0, time_limit=300.0)
    cs = engine.run()[0]
    assert cs.complete and cs.upper == pytest.approx(0.9)
    singles = [(pos, a, limit) for pos, a, limit in analyser.attempts if len(pos) == 1]
    # the top network's retry, with nothing else left, runs for the remaining time
    assert [(pos, a) for pos, a, limit in singles if limit > 250.0] == [((3,), 2)]
    # while other nodes still waited for the worker, retries grew geometrically as before
    assert [limit for pos, a, limit in singles if pos == (2,)] == [1.0, RETRY_GROWTH, RETRY_GROWTH ** 2, RETRY_GROWTH ** 3]


def test_a_class_that_has_not_queued_its_root_is_work_a_singleton_must_not_starve(tmp_path):
    from lucid.bab.node import RUNNING, Node

    values = np.concatenate([[0.0], [0.2, 0.5, 0.9]])
    log = EventLog(tmp_path / "log.jsonl")
    engine = Engine(ThreadExecutor(FakeAnalyser(values), 1), [0, 1], len(values), VerifySettings(time_limit=100.0),
                    params=np.zeros((len(values), 2)), log=log)
    node = Node(id=0, parent=None, positions=np.array([3]), upper=1.0, state=RUNNING)
    engine.states[0].nodes[0] = node
    assert not engine.scheduler.last_work(node)  # class 1 will still queue a root
    engine.states[1].done = True
    assert engine.scheduler.last_work(node)
    engine.states[0].nodes[1] = Node(id=1, parent=None, positions=np.array([1, 2]), upper=1.0, state=RUNNING)
    assert not engine.scheduler.last_work(node)  # a running hyper-network node may split into new work


@pytest.mark.parametrize("rel_gap", [0.0, 0.05])
def test_the_first_singletons_seek_leaks_below_the_cutoff_once(tmp_path, rel_gap, monkeypatch):
    """Under a tolerance, a class's first singleton per worker is analysed without the cutoff (a
    floored model could never find a leak between the best lower bound and the cutoff); every
    other analysis, and that singleton's own retry, gets the cutoff. Exact mode has nothing to seek."""
    import lucid.bab.engine

    # the root's MILP supplies the first lower bound here (there is no search)
    monkeypatch.setattr(lucid.bab.engine, "PEEL_ROOT_ABOVE", {})
    values = np.concatenate([[0.0], np.linspace(0.1, 1.0, 10)])

    class TopTimesOutFirst(FakeAnalyser):
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            out = super().__call__(cls, positions, time_limit, cutoff, attempt)
            if tuple(positions) == (10,) and attempt == 1:  # no leak found, a weak bound: retried
                out.status, out.upper, out.lower = "time_limit", out.upper + 0.5, None
            return out

    analyser = TopTimesOutFirst(values, slack=0.5)
    engine, _, log = make_engine(tmp_path, values, analyser=analyser, workers=2, node_time_limit=5.0,
                                 rel_gap=rel_gap, screen=lambda c, pos, deadline=None: values[pos] + 0.01)
    cs = engine.run()[0]
    log.close()
    # a seek the class no longer needed may still be running in its thread: let it reach the analyser
    engine.executor._pool.shutdown(wait=True)
    assert cs.done and cs.upper >= values.max() - 1e-12
    started = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "started"]
    sought = [e for e in started if e.get("seek")]
    singles = [(pos, cut, a) for pos, cut, (_, a, _) in zip(analyser.calls, analyser.cutoffs, analyser.attempts)
               if len(pos) == 1]
    unfloored = [(pos, a) for pos, cut, a in singles if cut == -math.inf]
    if rel_gap == 0:
        assert not sought and cs.seekers == 0
    else:
        assert 1 <= len(sought) <= 2 and all(e["size"] == 1 and e["attempt"] == 1 for e in sought)
        assert len(unfloored) == len(sought) == cs.seekers and all(a == 1 for _, a in unfloored)
        assert any(pos == (10,) and a > 1 and math.isfinite(cut) for pos, cut, a in singles)
    assert ClassState.from_json(0, cs.to_json()).seekers == cs.seekers


@pytest.mark.parametrize("node_time_limit", [None, 5.0, 450.0])
def test_a_seek_gets_at_most_a_minute_when_it_can_be_retried(tmp_path, node_time_limit, monkeypatch):
    """A seek looks for a leak (the solver's early incumbents); under a long node limit it would
    spend the rest on a dual bound that its retry under the cutoff proves faster. Without a node
    limit there is no retry, so the seek keeps the whole limit (else the node could never be proved)."""
    import lucid.bab.engine
    from lucid.analysis.time_shares import SEEK_TIME_LIMIT

    monkeypatch.setattr(lucid.bab.engine, "PEEL_ROOT_ABOVE", {})
    values = np.concatenate([[0.0], np.linspace(0.1, 1.0, 10)])
    engine, analyser, log = make_engine(tmp_path, values, workers=2, node_time_limit=node_time_limit, rel_gap=0.1,
                                        screen=lambda c, pos, deadline=None: values[pos] + 0.01)
    cs = engine.run()[0]
    log.close()
    assert cs.done and cs.upper >= values.max() - 1e-12
    started = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "started"]
    sought = [e for e in started if e.get("seek")]
    others = [e for e in started if not e.get("seek") and e["attempt"] == 1]
    assert sought and others
    if node_time_limit is None:
        assert all(e["time_limit"] is None for e in sought)
    else:
        assert all(e["time_limit"] == min(node_time_limit, SEEK_TIME_LIMIT) for e in sought)
        assert all(e["time_limit"] == node_time_limit for e in others)


def test_a_retried_singleton_goes_ahead_of_higher_nodes_on_all_but_one_worker(tmp_path):
    """Longest work first: a retry (it used a whole node limit and cannot be split) starts before
    pending nodes with higher bounds, on at most capacity - 1 workers; with one worker, best-first."""
    values = np.concatenate([[0.0], np.linspace(0.1, 1.0, 40)])
    slow = 39  # the second-ranked network: its first attempt ends at its time limit

    class SlowOnce(FakeAnalyser):
        def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
            out = super().__call__(cls, positions, time_limit, cutoff, attempt)
            if tuple(positions) == (slow,) and attempt == 1:
                out.status, out.upper = "time_limit", out.upper + 0.1
            return out

    for workers in (1, 2):
        path = tmp_path / str(workers)
        path.mkdir()
        analyser = SlowOnce(values, slack=0.02)
        engine, _, log = make_engine(path, values, analyser=analyser, workers=workers, node_time_limit=5.0,
                                     screen=lambda c, pos, deadline=None: values[pos] + 0.3)
        cs = engine.run()[0]
        log.close()
        assert cs.complete and cs.upper == pytest.approx(1.0)
        events = read_events(path / "log.jsonl")
        retry_start = next(i for i, e in enumerate(events) if e["event"] == "started" and e["attempt"] == 2)
        retry_upper = events[retry_start]["upper"]
        queued_before = {e["node"] for e in events[:retry_start] if e["event"] == "queued"}
        overtaken = [e for e in events[retry_start:] if e["event"] == "started" and e["node"] in queued_before
                     and e["upper"] > retry_upper]
        assert bool(overtaken) == (workers == 2), (workers, overtaken)


class RecordingExecutor(Executor):
    """Takes submissions and runs nothing (the engine's choices, without thread timing)."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity
        self.sent = []
        self.split_only = []  # per submission

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1, threads=1, split_only=False):
        self.sent.append((key, tuple(int(p) for p in positions), time_limit, threads))
        self.split_only.append(split_only)
        self._watch(key, cf.Future(), worker=len(self._where))


def test_only_the_last_work_gets_the_idle_workers_threads(tmp_path):
    from lucid.bab.node import PENDING, Node

    values = np.concatenate([[0.0], [0.2, 0.5, 0.9]])
    executor = RecordingExecutor(2)
    engine = Engine(executor, [0], len(values), VerifySettings(time_limit=300.0, node_time_limit=1.0),
                    params=np.zeros((len(values), 2)), log=EventLog(tmp_path / "log.jsonl"))
    engine.invocation.start()
    cs = engine.states[0]

    def pending(node_id, positions, attempts=1):
        cs.nodes[node_id] = Node(id=node_id, parent=None, positions=np.array(positions), upper=1.0, state=PENDING,
                                 attempts=attempts)
        heapq.heappush(cs.pending_heap, (-1.0, node_id))

    pending(1, [3])
    pending(2, [1, 2])  # a hyper-network node: it may split into more work
    engine.scheduler.submit_ready()
    assert [threads for *_, threads in executor.sent] == [1, 1]
    executor.sent.clear()
    executor.completed(0.01)
    executor._where.clear(), executor._futures.clear()
    for node in cs.nodes.values():
        node.state = "closed"
    cs.nodes.clear()
    pending(3, [3], attempts=2)  # the only work left: it gets both workers' threads and the remaining time
    engine.scheduler.submit_ready()
    ((_, _, limit, threads),) = executor.sent
    assert threads == 2 and limit > 250.0


def test_a_time_limit_ends_the_seeds_and_their_screen_refinement_and_a_resume_seeds_the_rest(tmp_path):
    """A class's seed (witness search, then the optimised screen of every network above the cutoff)
    takes tens of seconds on a thousand networks of 64 inputs; a box of `--regions` given 20 s
    ran 138 s through ten of them. The refinement is handed the deadline and stops there (the
    networks it did not reach keep their screened bound, +inf from the hook), a class not seeded
    by then keeps its screened bound until a resume seeds it, and each class's summary names the
    phase the time ran out in."""
    import time

    values = np.concatenate([[0.0], np.linspace(0.1, 0.9, 1100)])
    refined, searched, deadlines = [], [], []

    def slow_refine(c, pos, level, deadline=None):  # 20 ms a network, until the deadline
        deadlines.append(deadline)
        out = np.full(len(pos), np.inf)
        for i, p in enumerate(pos):
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.02)
            out[i] = values[p] + 0.01
            refined.append(c)
        return out

    @dataclass
    class Leak:
        confidence: float = 0.05
        leaking_row: int = 1
        x: np.ndarray = field(default_factory=lambda: np.zeros(2))

    def search(c, pos, deadline=None):
        searched.append(c)
        return Leak()

    def engine_with(refine, limit, states=None):
        return Engine(ThreadExecutor(FakeAnalyser(values), 1), [0, 1], len(values), VerifySettings(time_limit=limit),
                      hooks=EngineHooks(screen=lambda c, pos, deadline=None: values[pos] + 0.5, refine=refine,
                                        search=search),
                      states=states, log=EventLog(tmp_path / "log.jsonl", append=True))

    t0 = time.monotonic()
    engine = engine_with(slow_refine, 1.0)
    states = engine.run()
    # class 0's refinement got the engine's deadline and ended there: the run within 1.5 s of its 1 s
    assert searched[0] == 0 and deadlines[0] == engine.invocation.deadline.end and set(refined) == {0}
    assert 0 < len(refined) < 60 and time.monotonic() - t0 < 2.5
    refined_at = np.flatnonzero(states[0].refined)
    assert len(refined_at) == len(refined)  # the networks not reached are left to refine later
    assert states[0].stopped_in == "its screen refinement"
    # class 1: not seeded, with nothing refined: a sound bound, not a finished one
    first = states[1]
    assert first.done and not first.complete and first.reason == "time limit"
    assert first.stopped_in == "class 0's screen refinement, before its start"
    assert 0.9 <= first.upper <= 0.9 + 0.5  # at most its screened bound, never below the true 0.9
    states = {c: ClassState.from_json(c, cs.to_json()) for c, cs in states.items()}  # as a checkpoint holds them
    states = engine_with(lambda c, pos, level, deadline=None: values[pos] + 0.01, 60.0, states).run()
    assert searched == [0, 1]  # resumed: the class never seeded is seeded now
    for cs in states.values():
        assert cs.complete and 0.9 <= cs.upper <= 0.9 + 0.05 and cs.stopped_in is None


class LyingRoot(FakeAnalyser):
    """A TEST DOUBLE whose analysis of the whole set proves a bound below a network's true one (as an
    unsound tier would); smaller sets are analysed honestly and replay a leak above that bound."""

    def __call__(self, cls, positions, time_limit, cutoff=-math.inf, attempt=1):
        out = super().__call__(cls, positions, time_limit, cutoff, attempt)
        if len(positions) == len(self.values) - 1:
            out.upper, out.lower = 0.5, float(self.values[positions].min())
        else:  # an honest child replays its best network's leak
            out.lower = float(self.values[positions].max())
        return out


def test_an_upper_bound_below_a_replayed_leak_stops_the_run(tmp_path):
    from lucid.errors import InconsistentBounds

    values = np.array([0.0, 0.1, 0.9, 0.2, 0.3, 0.15, 0.25])
    engine, _, _ = make_engine(tmp_path, values, workers=1, analyser=LyingRoot(values))
    with pytest.raises(InconsistentBounds, match="below a replayed leak"):
        engine.run()
    assert InconsistentBounds.exit_code == 3


def test_a_resumed_class_whose_pending_node_is_pruned_splits_its_open_node_instead_of_stalling(tmp_path):
    """A time limit left a class with a pending node and an open (solved, to be split) one. On the
    resume the best lower bound prunes the pending node's networks and closes it as it is submitted:
    the open node's split is the work left (the engine called this a stall and raised)."""
    from lucid.bab.node import OPEN, PENDING, Node

    values = np.array([0.0, 0.1, 0.2, 0.9, 0.8, 0.7, 0.6])
    cs = ClassState(cls=0, next_id=3, lower=0.5, lower_row=2, upper=1.5, solved=1, done=True, reason="time limit")
    cs.screen = values + 0.05
    cs.nodes[1] = Node(1, 0, np.array([1, 2]), 0.6, state=PENDING, depth=1)  # inherited: its screen says 0.25
    cs.nodes[2] = Node(2, 0, np.array([3, 4, 5, 6]), 1.5, state=OPEN, status="time_limit", attempts=1, depth=1)
    cs.rebuild_heaps()
    engine = Engine(ThreadExecutor(FakeAnalyser(values), 1), [0], len(values), VerifySettings(),
                    params=np.random.default_rng(0).normal(size=(len(values), 5)),
                    hooks=EngineHooks(screen=lambda c, pos, deadline=None: values[pos] + 0.05), states={0: cs},
                    log=EventLog(tmp_path / "log.jsonl"))
    states = engine.run()
    assert states[0].complete and states[0].upper == pytest.approx(0.9)


def test_a_peeled_node_whose_top_networks_are_all_in_the_residual_set_is_split_until_work(tmp_path, monkeypatch):
    """--residual M with M far above the workers: each split of a peeled node makes `capacity`
    singletons that rank among the M largest bounds, each set aside unanalysed, so the first work
    (a singleton outside the set) takes many splits. Adult 8k 2x50, M = 256 on two workers once
    ended in "branch-and-bound stalled" after two rounds of splits: each split's screen refinement
    lowered the networks at the top, so its children, the new top, were checked against the set
    ranked before it and set aside only when submitted, after `_advance` had stopped splitting."""
    import lucid.bab.screening
    from lucid.bab.hooks import EngineHooks
    from lucid.bab.node import OPEN, PENDING, STUCK, Node

    networks, size = 60, 12
    monkeypatch.setattr(lucid.bab.screening, "RESIDUAL_REFINE_BATCH", size)
    bounds = np.concatenate([[-np.inf], np.linspace(1.0, 2.0, networks)])
    refined = []

    def refine(c, positions, level, deadline=None):  # lowers what it refines below every other network
        refined.append(len(positions))
        return bounds[positions] - 1.5

    executor = RecordingExecutor(2)
    hooks = EngineHooks(screen=lambda c, positions, deadline=None: bounds[positions], refine=refine)
    engine = Engine(executor, [0], len(bounds), VerifySettings(time_limit=300.0, node_time_limit=1.0, residual=size),
                    params=np.zeros((len(bounds), 2)), hooks=hooks, log=EventLog(tmp_path / "log.jsonl"))
    engine.invocation.start()
    cs = engine.states[0]
    cs.lower = -2.0  # (a leak far below: nothing is pruned)
    engine.anytime.update(cs)
    cs.nodes[0] = Node(id=0, parent=None, positions=np.arange(1, len(bounds)), upper=2.0, state=OPEN, peel=True)
    cs.next_id = 1
    heapq.heappush(cs.open_heap, (-2.0, 0))
    engine._split_until_work()
    assert len(refined) > 2  # the ranking changed at more than two splits
    started = [positions[0] for _, positions, _, _ in executor.sent]
    top = set(np.argsort(-np.minimum(cs.screen, cs.network_bound))[:size].tolist())
    assert started and all(p not in top for p in started)  # work outside the set, none of its members
    aside = {int(n.positions[0]) for n in cs.nodes.values() if n.is_singleton and n.state == STUCK}
    assert top <= aside
    assert not any(n.state == PENDING and int(n.positions[0]) in top for n in cs.nodes.values() if n.is_singleton)
