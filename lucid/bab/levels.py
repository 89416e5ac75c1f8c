"""`ResidualProgress`: the engine's collaborator for `--residual M` classes (lucid/bab/order_statistic.py).

It decides when a class's level is finished (every node at or above it is a settled or stuck
singleton; the stale and stuck ones are retried first while the deadline allows) and, with
`--residual auto`, chooses M again from the improved bounds. The engine keeps the node life
cycle; this keeps what only the level needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lucid.bab.anytime import AnytimeBounds
from lucid.bab.invocation import Invocation
from lucid.bab.node import SETTLED, STUCK
from lucid.bab.order_statistic import known_member, relevant, set_aside, worth_retrying
from lucid.bab.schedule import Scheduler
from lucid.bab.state import ClassState
from lucid.bab.workers import Executor

CHOOSE_EVERY = 2.0  # seconds between two choices of M (--residual auto): each is a pass over its inputs


class ResidualProgress:
    """When each residual class's level is finished, and M's re-choice (module docstring)."""

    def __init__(
        self,
        states: dict[int, ClassState],
        anytime: AnytimeBounds,
        scheduler: Scheduler,
        executor: Executor,
        invocation: Invocation,
        choose: Callable[[dict[int, ClassState]], int] | None = None,
    ) -> None:
        self.states, self.anytime, self.scheduler = states, anytime, scheduler
        self.executor, self.invocation = executor, invocation
        self._choose = choose
        self._chosen_at = -math.inf

    def decided(self, cs: ClassState) -> bool:
        """Finish the class once no node at or above the level can lower it (each is a settled or
        stuck singleton), True; first, while the deadline allows, stuck singletons set aside in
        the set are retried on the free workers (proving one harmless evicts it and lowers the
        level), those without a leak first."""
        above = [n for n in cs.nodes.values() if relevant(cs, n)]
        if any(n.state not in (SETTLED, STUCK) for n in above):
            return False
        cutoff = self.anytime.cutoff(cs)
        # proved only below an older question (the set has changed since, and its best leak
        # outside with it): asked again at the lower one
        stale = [n for n in above if n.state == SETTLED and n.status == "infeasible" and n.upper > cutoff]
        if stale and not self.invocation.past():
            for node in stale:
                self.scheduler.retry(cs, node)
            return False
        free = self.executor.capacity - self.executor.in_flight
        again = sorted(
            (
                n
                for n in above
                if n.state == STUCK and (n.attempts == 0 or self.scheduler.retryable(n)) and worth_retrying(cs, n)
            ),
            key=lambda n: (float(cs.network_leak[n.positions[0]]), -n.upper),
        )
        if again and not self.invocation.past():
            for node in again[: max(0, free)]:
                node.evicting = True
                self.scheduler.retry(cs, node)
            return True  # (no worker free: the retries wait for one)
        # the set's members need no proof; the level does
        proved = all(n.state == SETTLED or set_aside(cs, n) or known_member(cs, n) for n in above)
        self.anytime.finish(
            cs, proved, "the level's networks are proved" if proved else "unproved node at the level (node time limit)"
        )
        return True

    def choose_size(self, final: bool = False) -> None:
        """--residual auto: M chosen again from the improved bounds (at most every CHOOSE_EVERY
        seconds, and once at the end); a class finished at the old M goes on at the new one."""
        if self._choose is None or (not final and self.invocation.seconds() - self._chosen_at < CHOOSE_EVERY):
            return
        self._chosen_at = self.invocation.seconds()
        size = self._choose(self.states)
        for cs in self.states.values():
            if cs.residual_size is None or size >= cs.residual_size:
                continue
            cs.residual_size = size
            self.invocation.emit("residual_size", cs.cls, size=size)
            if cs.done and cs.reason != "time limit" and not final and not self.invocation.past():
                cs.done, cs.complete, cs.reason = False, False, ""
                self.invocation.emit("class_reopened", cs.cls, upper=cs.upper, lower=cs.lower, open=len(cs.nodes))
            if not final:
                self.anytime.update(cs)
