"""Leaker rounds of `lucid verify --residual M`: a class whose level ends on a leak of a network
outside its residual set is verified again with that network inside (`leakers_moved_in`); the
plain strategy runs them after its branch-and-bound, `--regions` after each box's."""

from __future__ import annotations

import numpy as np

import lucid.bab.engine as bab_engine
import lucid.bab.workers as executors
from lucid.analysis.problem import VerificationProblem
from lucid.bab.events import EventLog
from lucid.bab.hooks import EngineHooks
from lucid.bab.partition import FlatParameters
from lucid.bab.state import ClassState
from lucid.deadline import Deadline
from lucid.residual import swap_in_leaker
from lucid.rundir import bound_entry_value
from lucid.settings import VerifySettings

RESIDUAL_ROUNDS = 8  # verifications again, each with the network whose leak sets a class's level moved into its set
PINNED = 1e-4  # a level within this (relative) of a leak is set by that leak (the engine stops within its float margins)
ROUND_GRACE = 2.0  # seconds the last round's analyses still running get before their workers are replaced


def leakers_moved_in(states: dict[int, ClassState], problem: VerificationProblem, settings: VerifySettings,
                      executor: executors.Executor, hooks: EngineHooks, deadline: Deadline,
                      log: EventLog, **where: int) -> dict[int, ClassState]:
    """With --residual M, every leak the searches find is of a network outside the set, so a class
    whose level ends on such a leak cannot fall below it while that network stays outside (the
    screen ranks loose networks that never leak above real leakers). Up to RESIDUAL_ROUNDS times,
    while the deadline allows, each such class is verified again from its screen with the leaking
    network swapped in for the member the screen ranks lowest (`lucid.residual.swap_in_leaker`),
    and keeps whichever level is lower (a round whose level ends on a leak of the member it evicted
    keeps that member in later rounds and evicts the next one; any other round that does not lower
    the level ends the class's rounds): each bounds every network outside its own set, so either
    is sound. These rounds write no checkpoint and no anytime events (a resume reconciles the log's
    anytime bounds with the checkpoint's sets: it continues from the first round's states, whose
    sets they belong to); each logs a `residual_round` event. The executor is rebound before each
    round: the last round's analyses still in flight would report under the node keys the new
    engine reuses, and their results must be dropped, never taken for the new nodes' (local
    executors only: not with a Dask scheduler). `where`: fields every event carries (a region's
    box). `deadline` must have begun (the branch-and-bound's before the rounds): an unbegun one
    would give every round a fresh span."""
    if deadline.seconds is not None and deadline.start is None:
        raise ValueError("leaker rounds need a begun deadline (the branch-and-bound's): each round would restart it")
    tried: set[int] = set()
    moved: dict[int, list[int]] = {c: [] for c in states}  # per class, the leakers moved in so far
    for _ in range(RESIDUAL_ROUNDS):
        redo, leakers = {}, {}
        for c, cs in states.items():
            if c in tried or cs.residual is None or not _pinned(cs):
                continue
            leaker = int(problem.stack.positions_of([cs.lower_row])[0])
            if leaker in cs.residual or len(moved[c]) >= len(cs.residual):
                continue
            members = swap_in_leaker(cs.residual, cs.screen, leaker, np.array(moved[c], dtype=np.int64))
            redo[c] = ClassState(cls=c, residual=members, screen=cs.screen.copy(),
                                 refined=None if cs.refined is None else cs.refined.copy())
            leakers[c] = leaker
        if not redo or deadline.past():
            return states
        executor.rebind(problem, grace=ROUND_GRACE)
        engine = bab_engine.Engine(executor, sorted(redo), len(problem.stack), settings,
                                   params=FlatParameters(problem.stack), hooks=hooks, states=redo, deadline=deadline)
        engine.run()
        for c, cs in engine.states.items():
            kept = cs.upper < states[c].upper
            log.emit("residual_round", c, **where, level=bound_entry_value(cs.upper, upper=True), kept=kept,
                     before=bound_entry_value(states[c].upper, upper=True), positions=cs.residual.tolist(),
                     bounds=[float(b) for b in np.sort(cs.screen[cs.residual])[::-1]])
            if kept:
                states[c] = cs
                moved[c].append(leakers[c])
            elif (evicted := _evicted_leaker(states[c], cs, problem)) is not None:
                moved[c].append(evicted)  # a real leaker too: it stays, and the next round evicts another
            else:
                tried.add(c)
    return states


def _evicted_leaker(before: ClassState, after: ClassState, problem: VerificationProblem) -> int | None:
    """The member a round evicted, if the round's level ends on a leak of that network (the screen
    ranked it lowest, yet it leaks above the level kept); None otherwise."""
    evicted = np.setdiff1d(before.residual, after.residual)
    if len(evicted) != 1 or not _pinned(after):
        return None
    return int(evicted[0]) if int(problem.stack.positions_of([after.lower_row])[0]) == int(evicted[0]) else None


def _pinned(cs: ClassState) -> bool:
    """Whether the class's level ends on a leak it found (within PINNED): a network that leaks."""
    return bool(cs.complete and cs.lower is not None and cs.lower_row is not None
                and cs.upper <= cs.lower + PINNED * max(1.0, abs(cs.lower)))
