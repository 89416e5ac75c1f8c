"""Which node runs next, on which worker, with how much time and how many solver threads.

`Scheduling` is the engine's scheduling half (`Engine` inherits it). It reads the engine's class
states, executor and settings and uses the engine's rules (`cutoff`, `tolerance`, `_can_close`,
`_prune`, `_close`, `_retry`); it decides:
- which pending node starts next (least busy class first, best bound first; singleton retries ahead
  of the queue on all but one worker);
- the node's time limit (the first attempt's limit, grown by RETRY_GROWTH per retry, capped by the
  session's remaining time) and solver threads (more than one only for the last work left);
- whether the node seeks a leak without the cutoff (for at most SEEK_TIME_LIMIT seconds).
"""

from __future__ import annotations

import heapq
import math
import time

from lucid.bab.node import FINAL, OPEN, PENDING, RUNNING, SETTLED, STUCK, Node
from lucid.bab.state import INF, ClassState

MAX_SINGLETON_ATTEMPTS = 3
# Each retry repeats the leak search, probe and OBBT (and, without a kept tree, restarts the
# MILP), so a short growth pays those costs, and the time-limited attempts before the one that
# proves the node, too often. Growing 4x reaches a given proof time in fewer attempts than
# doubling (60, 240, 960 s against 60, 120, 240, 480, 960 s), and a larger last limit costs
# nothing when the node is proved early (figures in benchmarks/results/idle_machine.md).
RETRY_GROWTH = 4
# A seek is after a leak (the primal side): its solver finds the incumbents it will find within
# about a minute (Adult 2x50: the class's best leak at 30 s), and the rest of a long node limit
# goes into the dual bound, which the seek's own retry under the cutoff proves far faster (Adult
# 2x50 with 8 000 rows: two 450-s seeks per class, one gaining nothing while its retry took 16 s).
SEEK_TIME_LIMIT = 60.0



def deadline_margin(time_limit: float) -> float:
    """Node MILPs stop this long before the session's deadline, so their bounds are collected."""
    return min(3.0, 0.02 * time_limit)


class Scheduling:
    def session_elapsed(self) -> float:
        """Seconds since this invocation started: --time-limit applies per invocation, so a resumed
        run gets the full limit again (elapsed() continues across resumes, for the log)."""
        return time.monotonic() - self._session_t0

    def _node_time_limit(self, node: Node) -> float | None:
        limit = self.config.node_limit
        if limit is not None:
            limit = limit * (RETRY_GROWTH ** max(0, node.attempts))
        if self.config.time_limit is not None:
            total = self.config.time_limit
            remaining = max(0.05, total - self.session_elapsed() - deadline_margin(total))
            limit = remaining if limit is None or self._last_work(node) else min(limit, remaining)
        return limit

    def _last_work(self, node: Node) -> bool:
        """Whether no other work can ever wait for `node`'s worker: it is a singleton and every other
        node of every unfinished class is a running singleton or finished (singletons never split).

        Then a node time limit only restarts the node, repeating its OBBT and (without a kept tree)
        its MILP, while the other workers have nothing to do; so the node gets all the remaining
        time at once."""
        if not node.is_singleton:
            return False
        for cs in self.states.values():
            if cs.done:
                continue
            if not cs.nodes:
                return False  # a class whose root is not queued yet (or about to finish)
            for other in cs.nodes.values():
                if other is node or other.state in (SETTLED, STUCK, FINAL):
                    continue
                if other.state != RUNNING or not other.is_singleton:
                    return False
        return True

    def _submit_ready(self) -> None:
        """Fill free worker slots, one class after another (least busy class first)."""
        while self.executor.in_flight < self.executor.capacity:
            candidates = []
            for c, cs in self.states.items():
                if cs.done:
                    continue
                while cs.pending_heap and (
                    cs.pending_heap[0][1] not in cs.nodes or cs.nodes[cs.pending_heap[0][1]].state != PENDING
                ):
                    heapq.heappop(cs.pending_heap)
                if cs.pending_heap:
                    busy = sum(1 for (k, _) in self._running if k == c)
                    candidates.append((busy, cs.pending_heap[0][0], c))
            if not candidates:
                return
            retry = self._preferred_retry()
            if retry is not None:
                cs, node = retry
                c = cs.cls
            else:
                _, _, c = min(candidates)
                cs = self.states[c]
                _, node_id = heapq.heappop(cs.pending_heap)
                node = cs.nodes[node_id]
            self._refine(cs, node.positions)
            kept = self._prune(cs, node.positions, node.upper)
            if len(kept) < node.size:
                self._emit("pruned", c, node=node.id, parent=node.parent, size=node.size, kept=len(kept))
                node.positions = kept
                node.upper = min(node.upper, self._screened_upper(cs, kept)) if len(kept) else -INF
            if self._can_close(cs, node):
                self._close(cs, node, "bound <= best lower")
                continue
            node.state = RUNNING
            limit = self._node_time_limit(node)
            cutoff = self.cutoff(cs)
            seek = self._seeks_leak(cs, node)
            if seek:
                cs.seekers += 1
                cutoff = -INF
                if self.config.node_limit is not None:  # retries exist: the seek's own retry proves it
                    limit = min(limit, SEEK_TIME_LIMIT)
            # The last work may use the idle workers' cores: nothing else can ever need them.
            threads = max(1, self.executor.capacity - self.executor.in_flight) if self._last_work(node) else 1
            self._running[(c, node.id)] = self.elapsed()
            extra = {"seek": True} if seek else {}
            if threads > 1:
                extra["threads"] = threads
            self._emit("started", c, node=node.id, parent=node.parent, size=node.size, upper=node.upper,
                       time_limit=limit, attempt=node.attempts + 1, **extra)
            self.executor.submit((c, node.id), c, node.positions, limit, cutoff, node.attempts + 1, threads)

    def _preferred_retry(self) -> tuple[ClassState, Node] | None:
        """A singleton retry to start before the best-first choice, or None.

        A retried singleton is the longest work there is (it already used a whole node time limit
        and cannot be split), and a class ends with its slowest node, while best-first order would
        start a retry only once its bound reached the top of the queue, possibly long after its
        first attempt. So, longest first, retries go ahead of other nodes on up to `capacity - 1`
        workers (the others stay best-first, for the anytime bound; one worker: best-first only).
        Among retries, one whose kept solver tree sits on an idle worker goes first, then the one
        whose bound is farthest above its class's cutoff, relative to it (the dual bound that has
        to fall most, so the longest work: a retry a few % above its cutoff is usually proved
        quickly and should not hold up one far above it). A candidate is a retry already queued or an
        unproved singleton still waiting in the open queue (where best-first would only retry it
        once it reached the top)."""
        lanes = self.executor.capacity - 1
        busy = sum(1 for (c, nid) in self._running
                   if (n := self.states[c].nodes.get(nid)) is not None and n.attempts > 0)
        if busy >= lanes:
            return None

        def candidate(cs: ClassState, node: Node | None) -> bool:
            return (node is not None and node.attempts > 0 and node.is_singleton
                    and (node.state == PENDING or (node.state == OPEN and self._retryable(node)))
                    and not self._can_close(cs, node))

        choice = None
        continuable = set(self.executor.continuable())
        for cs in self.states.values():
            if cs.done:
                continue
            level = self.cutoff(cs)
            for _, nid in (*cs.pending_heap, *cs.open_heap):
                node = cs.nodes.get(nid)
                if candidate(cs, node):
                    excess = (node.upper - level) / max(abs(level), 1e-12) if math.isfinite(level) else INF
                    rank = ((cs.cls, nid) in continuable, excess, node.upper)
                    if choice is None or rank > choice[0]:
                        choice = (rank, cs, node)
        if choice is None:
            return None
        _, cs, node = choice
        if node.state == OPEN:
            self._retry(cs, node)
        return cs, node

    def _seeks_leak(self, cs: ClassState, node: Node) -> bool:
        """Whether `node` is one of the class's first singletons (its top-screened networks, one per
        worker), analysed once without the cutoff to find leaks between the best lower bound and it.

        Under a cutoff every model is restricted to beta above lower + tolerance, so a leak below that
        level is never found by the MILPs that could see it, although the top-screened networks are
        where the class's best leak most likely lies. A first attempt without the cutoff can find it
        early and so raise the level every later singleton has to be proved below, which makes all of
        those proofs easier."""
        return (node.is_singleton and node.attempts == 0 and cs.seekers < self.executor.capacity
                and self.tolerance(cs) > 0 and not self.config.naive)

    def _retryable(self, node: Node) -> bool:
        """An unproved singleton gets another attempt with a longer node time limit; with a total
        time limit it keeps growing until that ends, else it gives up after a few."""
        return (node.is_singleton and not node.proved and self.config.node_limit is not None
                and (node.attempts < MAX_SINGLETON_ATTEMPTS or self.config.time_limit is not None))

