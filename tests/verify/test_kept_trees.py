"""Kept trees: a singleton retry's time-limited MILP is continued by its next retry, soundly."""

from __future__ import annotations

import concurrent.futures as cf
import math

import numpy as np
import pytest
from bruteforce import exact_for, tiny_stack
from milp_models import market_split

import lucid.solvers.gurobi_backend as gurobi_backend
from lucid.bab.workers import Executor, ProcessExecutor, ThreadExecutor
from lucid.analysis.kept_trees import KEPT
from lucid.settings import VerifySettings
from lucid.solvers import INFEASIBLE, OPTIMAL, TIME_LIMIT, SolverOptions, available_solvers, resume, solve
from lucid.analysis.analyse import NodeRequest, analyse_node
from lucid.analysis.problem import VerificationProblem

needs_gurobi = pytest.mark.skipif(not available_solvers()["gurobi"], reason="gurobipy not installed")


@needs_gurobi
def test_a_kept_gurobi_tree_continues_where_its_time_limit_stopped_it():
    mdl = market_split(3)
    fresh = solve(mdl, "gurobi", SolverOptions(time_limit=0.05))
    assert fresh.status == TIME_LIMIT and fresh.tree is None  # nothing kept unless asked
    first = solve(mdl, "gurobi", SolverOptions(time_limit=0.05), keep=True)
    assert first.status == TIME_LIMIT and first.tree is not None
    result, steps = first, 0
    while result.status == TIME_LIMIT and steps < 1200:  # bounded; a loaded machine needs more steps
        # 0.05 s at a time: a solve that restarted from the root would never finish
        result = resume(result.tree, SolverOptions(time_limit=0.05))
        steps += 1
        assert result.upper_bound >= -1e-9  # the planted optimum is 0: every bound stays sound
    assert result.status == OPTIMAL and result.upper_bound == pytest.approx(0.0, abs=1e-9)
    assert result.tree is None and result.stats["resumed"] and steps > 1


def test_backends_that_cannot_continue_ignore_keep():
    result = solve(market_split(3), "highs", SolverOptions(time_limit=0.05), keep=True)
    assert result.tree is None


def _problem(seed=0):
    stack = tiny_stack(seed, hidden=(4, 4), classes=2)
    lower, upper = np.full(2, -1.0), np.ones(2)
    return stack, lower, upper, VerificationProblem.from_stack(stack, lower, upper)


@pytest.fixture
def interrupted_gurobi(monkeypatch):
    """While `state["stop"]` is set, every Gurobi solve stops at once at its time limit (as on a hard
    node); continuing a kept tree is unaffected."""
    state = {"stop": True}
    original = gurobi_backend.solve_gurobi

    def solve_gurobi(model, options, extra=None, keep=False):
        if state["stop"]:
            options = SolverOptions(**{**vars(options), "time_limit": 0.0})
        return original(model, options, extra, keep=keep)

    monkeypatch.setattr(gurobi_backend, "solve_gurobi", solve_gurobi)
    KEPT.clear()
    yield state
    KEPT.clear()


@needs_gurobi
def test_a_retry_continues_the_kept_milp_and_its_bound_is_the_exact_one(interrupted_gurobi):
    stack, lower, upper, problem = _problem()
    cls, p = 0, 1
    exact = exact_for(stack, p, cls, lower, upper)
    assert math.isfinite(exact)
    second = analyse_node(problem, cls, [p], settings=VerifySettings(solver="gurobi", split_time=0),
                          request=NodeRequest(attempt=2, keep_trees=True), solver_options=SolverOptions(time_limit=30))
    assert second.status == TIME_LIMIT and second.stats["kept"]  # what the executor reads
    assert second.upper >= exact and len(KEPT) == 1
    interrupted_gurobi["stop"] = False
    third = analyse_node(problem, cls, [p], settings=VerifySettings(solver="gurobi", split_time=0),
                         request=NodeRequest(attempt=3, keep_trees=True), solver_options=SolverOptions(time_limit=30))
    assert third.stats["solves"][-1].get("resumed") and len(KEPT) == 0
    assert third.status in (OPTIMAL, INFEASIBLE)
    assert exact <= third.upper <= exact + 1e-5  # the same answer a fresh solve proves
    fresh = analyse_node(problem, cls, [p], settings=VerifySettings(solver="gurobi", split_time=0),
                         request=NodeRequest(attempt=2), solver_options=SolverOptions(time_limit=30))
    assert third.upper == pytest.approx(fresh.upper, abs=1e-6)
    assert third.lower is not None and third.lower <= exact + 1e-9


@needs_gurobi
def test_a_kept_milp_is_not_continued_for_another_question(interrupted_gurobi):
    """A higher cutoff (the class's lower bound rose) or another problem gets a fresh model."""
    stack, lower, upper, problem = _problem()
    cls, p = 0, 1
    exact = exact_for(stack, p, cls, lower, upper)
    kw = dict(settings=VerifySettings(solver="gurobi", split_time=0), solver_options=SolverOptions(time_limit=30))
    analyse_node(problem, cls, [p], request=NodeRequest(exact - 0.2, 2, keep_trees=True), **kw)
    assert len(KEPT) == 1
    interrupted_gurobi["stop"] = False
    raised = analyse_node(problem, cls, [p], request=NodeRequest(exact + 0.05, 3, keep_trees=True), **kw)
    assert not raised.stats["solves"][-1].get("resumed")
    assert raised.status == INFEASIBLE and exact <= raised.upper <= exact + 0.05  # proved below the new cutoff
    interrupted_gurobi["stop"] = True
    analyse_node(problem, cls, [p], request=NodeRequest(attempt=2, keep_trees=True), **kw)
    assert len(KEPT) == 1
    interrupted_gurobi["stop"] = False
    _, _, _, other = _problem()  # equal networks, another problem object
    again = analyse_node(other, cls, [p], request=NodeRequest(attempt=3, keep_trees=True), **kw)
    assert not again.stats["solves"][-1].get("resumed") and exact <= again.upper <= exact + 1e-5
    assert len(KEPT) == 0


class _Pool:
    """Stands in for one worker's single-process pool: records what it was sent."""

    def __init__(self, index, log):
        self.index, self.log = index, log

    def submit(self, fn, *args):
        self.log.append((self.index, args))
        future = cf.Future()
        self.pending = future
        return future


class _Outcome:
    def __init__(self, kept):
        self.stats = {"kept": kept}


def test_the_process_executor_sends_a_retry_to_the_worker_that_kept_its_tree():
    executor = ProcessExecutor.__new__(ProcessExecutor)
    Executor.__init__(executor)
    executor.capacity = 2
    sent = []
    executor._pools = [_Pool(0, sent), _Pool(1, sent)]
    executor.submit("a", 0, np.array([1]), 1.0, 0.0)
    executor.submit("b", 0, np.array([2]), 1.0, 0.0)
    assert [w for w, _ in sent] == [0, 1]
    executor._pools[1].pending.set_result(_Outcome(kept=True))  # b's MILP stopped at its limit, kept by worker 1
    assert [k for k, _ in executor.completed(1.0)] == ["b"]
    assert executor.continuable() == ["b"]
    executor._pools[0].pending.set_result(_Outcome(kept=False))
    executor.completed(1.0)
    executor.submit("c", 0, np.array([3]), 1.0, 0.0)  # both idle: c takes the first
    assert sent[-1][0] == 0 and executor.continuable() == ["b"]
    executor.submit("b", 0, np.array([2]), 4.0, 0.0, 2, 2)  # worker 0 is busy, b goes home to 1
    assert sent[-1][0] == 1 and sent[-1][1][-2:] == (2, False)  # with the threads it was given (and its MILP)
    executor._pools[1].pending.set_result(_Outcome(kept=False))
    executor.completed(1.0)
    assert executor.continuable() == []  # proved: nothing kept any more


def test_a_tree_continued_elsewhere_is_forgotten_where_it_was():
    executor = ThreadExecutor(lambda *a: _Outcome(kept=True), 2)
    executor._kept["x"] = 1  # as if worker 1 held it
    executor._watch("x", cf.Future(), worker=0)
    assert "x" not in executor._kept
    executor.close()
