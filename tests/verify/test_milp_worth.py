"""A --residual M class's singletons get their split alone once their MILPs were measured and found
no help (`lucid.bab.milp_worth`), and such an analysis is still a sound bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_bab_engine import RecordingExecutor

from lucid.bab.engine import Engine
from lucid.bab.events import EventLog, read_events
from lucid.bab.milp_worth import MIN_RUNS, PROBE_EVERY, WIN_MARGIN, WIN_SHARE, MilpWorth
from lucid.bab.node import PENDING, Node
from lucid.rundir import encode_float
from lucid.settings import VerifySettings


def stats(split_upper, milp_upper, proved=False):
    """An analysis's stats as `analyse_node` writes them: the split's bound, then its MILP's."""
    solves = [] if milp_upper is None else [{"upper_bound": encode_float(milp_upper)}]
    return {"split": {"upper": encode_float(split_upper), "proved": proved}, "solves": solves}


def test_milps_that_never_beat_the_split_are_skipped_but_for_one_probe_in_every_few():
    worth = MilpWorth()
    for _ in range(MIN_RUNS - 1):
        worth.record(stats(0.50, 0.55), "time_limit")
    assert not worth.wanting and not worth.split_only()  # not measured enough yet
    worth.record(stats(0.50, 0.55), "time_limit")
    assert worth.wanting
    decisions = [worth.split_only() for _ in range(3 * PROBE_EVERY)]
    assert decisions.count(False) == 3 and all(not d for d in decisions[PROBE_EVERY - 1 :: PROBE_EVERY])


@pytest.mark.parametrize("win", [stats(0.50, 0.45), stats(0.50, 0.55)])
def test_a_milp_that_helps_often_enough_is_kept(win):
    worth = MilpWorth()
    status = "time_limit" if win["solves"][0]["upper_bound"] == encode_float(0.45) else "infeasible"
    runs = MIN_RUNS * 2
    wins = -(-runs // WIN_SHARE)  # one in WIN_SHARE
    for i in range(runs):
        worth.record(win if i < wins else stats(0.50, 0.60), status if i < wins else "time_limit")
    assert worth.wins == wins and not worth.wanting and not worth.split_only()


def test_a_milp_a_hair_below_the_split_is_no_win():
    worth = MilpWorth()
    for _ in range(MIN_RUNS):
        worth.record(stats(0.50, 0.50 * (1 - WIN_MARGIN / 2)), "time_limit")
    assert worth.wins == 0 and worth.wanting
    worth.record(stats(0.50, 0.50 * (1 - 2 * WIN_MARGIN)), "time_limit")
    assert worth.wins == 1


def test_analyses_without_both_tiers_count_for_nothing():
    worth = MilpWorth()
    for s in (stats(0.3, None, proved=True), stats(0.5, None), {"solves": [{"upper_bound": "0.1"}]},
              {**stats(0.5, 0.6), "race": "split"}):
        for _ in range(MIN_RUNS):
            worth.record(s, "time_limit")
    assert worth.runs == 0 and not worth.wanting


def test_a_residual_class_sends_its_singletons_split_only_after_its_milps_lost(tmp_path):
    executor = RecordingExecutor(1)
    values = np.concatenate([[-math.inf], np.linspace(0.2, 0.9, 40)])
    engine = Engine(executor, [0], len(values), VerifySettings(time_limit=300.0, node_time_limit=1.0, residual=4),
                    params=np.zeros((len(values), 2)), log=EventLog(tmp_path / "log.jsonl"))
    engine.invocation.start()
    cs = engine.states[0]
    engine.scheduler.analysed(cs, Node(id=99, parent=None, positions=np.arange(1, 10), upper=1.0))  # a hyper node
    singletons = [Node(id=i, parent=None, positions=np.array([i + 1]), upper=1.0) for i in range(MIN_RUNS)]
    for node in singletons:
        node.stats, node.status = stats(0.5, 0.6), "time_limit"
        engine.scheduler.analysed(cs, node)
    for i in range(PROBE_EVERY):
        node = Node(id=100 + i, parent=None, positions=np.array([20 + i]), upper=1.0, state=PENDING)
        cs.nodes[node.id] = node
        engine.scheduler._start(cs, node)
    assert executor.split_only == [True] * (PROBE_EVERY - 1) + [False]
    engine.invocation.log.close()
    events = read_events(tmp_path / "log.jsonl")
    said = [e for e in events if e["event"] == "singleton_milps"]
    assert [(e["kept"], e["runs"], e["wins"]) for e in said] == [(False, MIN_RUNS, 0)]
    assert [e.get("split_only", False) for e in events if e["event"] == "started"] == executor.split_only
    # a plain class (no --residual) never skips its MILPs
    plain_executor = RecordingExecutor(1)
    plain = Engine(plain_executor, [0], len(values), VerifySettings(time_limit=300.0, node_time_limit=1.0),
                   params=np.zeros((len(values), 2)), log=EventLog(tmp_path / "plain.jsonl"))
    plain.invocation.start()
    for node in singletons:
        plain.scheduler.analysed(plain.states[0], node)
    node = Node(id=200, parent=None, positions=np.array([30]), upper=1.0, state=PENDING)
    plain.states[0].nodes[node.id] = node
    plain.scheduler._start(plain.states[0], node)
    assert plain_executor.split_only == [False]


@pytest.mark.parametrize("seed,hidden,classes,d", [(0, (4, 4), 2, 2), (1, (4, 4), 3, 2), (5, (3, 3, 3), 2, 3)])
def test_a_split_only_analysis_runs_no_milp_and_its_bound_is_sound(seed, hidden, classes, d):
    from bruteforce import exact_for, tiny_stack

    from lucid.analysis.analyse import NodeRequest, analyse_node
    from lucid.analysis.problem import VerificationProblem

    stack = tiny_stack(seed, hidden=hidden, classes=classes, d=d, noise=0.15)
    lower, upper = np.zeros(d), np.ones(d)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    settings = VerifySettings()
    checked = 0
    for cls in range(classes):
        for position in (1, 2, 3):
            exact = exact_for(stack, position, cls, lower, upper)
            if not math.isfinite(exact):
                continue
            for cutoff in (exact - 0.05, exact + 0.05):
                out = analyse_node(problem, cls, np.array([position]), settings=settings,
                                   solver_options=settings.solver_options(0.5),
                                   request=NodeRequest(cutoff=cutoff, split_only=True))
                assert "solves" not in out.stats and out.stats["split"]["space"] in ("relu", "input")
                assert out.upper >= exact - 1e-9  # sound, proved or not
                assert (out.status == "infeasible") == (out.upper <= cutoff)
                if out.lower is not None:
                    assert out.lower <= exact + 1e-9
                checked += 1
    assert checked >= 4
