"""Which node runs next, on which worker, with how much time and how many solver threads.

`Scheduler` decides, over the class states it shares with the engine:
- which pending node starts next (least busy class first, best bound first; singleton retries ahead
  of the queue on all but one worker);
- the node's time limit (`lucid.analysis.time_shares.attempt_time_limit`) and solver threads (more than one
  only for the last work left);
- whether the node seeks a leak without the cutoff;
- whether an unproved singleton is retried.
"""

from __future__ import annotations

import heapq
import math

from lucid.analysis.time_shares import attempt_time_limit, node_limit
from lucid.bab.anytime import AnytimeBounds
from lucid.bab.invocation import Invocation
from lucid.bab.milp_worth import MilpWorth
from lucid.bab.node import FINAL, OPEN, PENDING, RUNNING, SETTLED, STUCK, Node
from lucid.bab.order_statistic import known_member, relevant, set_aside
from lucid.bab.screening import ScreenBounds
from lucid.bab.state import INF, ClassState
from lucid.bab.workers import Executor
from lucid.settings import VerifySettings

# Without --time-limit, an unproved singleton gets this many attempts, then keeps its sound bound.
MAX_SINGLETON_ATTEMPTS = 3


class Scheduler:
    """Starts pending nodes on the executor's free workers and keeps track of the running ones."""

    def __init__(
        self,
        executor: Executor,
        states: dict[int, ClassState],
        settings: VerifySettings,
        anytime: AnytimeBounds,
        screening: ScreenBounds,
        invocation: Invocation,
    ) -> None:
        self.executor = executor
        self.states = states
        self.settings = settings
        self.anytime = anytime
        self.screening = screening
        self.invocation = invocation
        self.running: dict[tuple[int, int], float] = {}  # (class, node id) -> when it started
        self.milp_worth: dict[int, MilpWorth] = {}  # --residual M classes' singleton MILPs

    def finished(self, key: tuple[int, int]) -> None:
        """The node `key` has reported (or was lost): its worker is free."""
        self.running.pop(key, None)

    def analysed(self, cs: ClassState, node: Node) -> None:
        """A singleton of a --residual M class reported (`node.stats`, `node.status`): count whether
        its MILP helped (`lucid.bab.milp_worth`), saying so when the class stops running them."""
        if cs.residual_size is None or not node.is_singleton:
            return
        worth = self.milp_worth.setdefault(cs.cls, MilpWorth())
        wanting = worth.wanting
        worth.record(node.stats, node.status)
        if worth.wanting != wanting:
            self.invocation.emit("singleton_milps", cs.cls, kept=not worth.wanting, runs=worth.runs, wins=worth.wins)

    def _split_only(self, cs: ClassState, node: Node, seek: bool, threads: int) -> bool:
        """Whether `node` gets its split alone: a singleton of a --residual M class whose MILPs
        were found no help, asked about a cutoff on one thread."""
        if cs.residual_size is None or not node.is_singleton or seek or threads > 1:  # (--naive refuses --residual)
            return False
        return self.milp_worth.setdefault(cs.cls, MilpWorth()).split_only()

    def last_work(self, node: Node) -> bool:
        """Whether no other work can ever wait for `node`'s worker: it is a singleton and every other
        node of every unfinished class is a running singleton or finished (singletons never split).

        Then a node time limit only restarts the node, repeating its OBBT and (without a kept tree)
        its MILP, while the other workers have nothing to do; so the node gets all the remaining
        time at once, and the idle workers' solver threads."""
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

    def submit_ready(self) -> None:
        """Fill free worker slots, one class after another (least busy class first)."""
        while self.executor.in_flight < self.executor.capacity:
            chosen = self._next_node()
            if chosen is None:
                return
            cs, node = chosen
            self.screening.refine(cs, node.positions)
            kept = self.anytime.prune(cs, node.positions, node.upper)
            if len(kept) < node.size:
                self.invocation.emit("pruned", cs.cls, node=node.id, parent=node.parent, size=node.size, kept=len(kept))
                node.positions = kept
                node.upper = min(node.upper, self.screening.upper(cs, kept)) if len(kept) else -INF
            if self.anytime.can_close(cs, node):
                self.anytime.close(cs, node, "bound <= best lower")
                continue
            if self.set_aside_member(cs, node):
                continue
            self._start(cs, node)

    def set_aside_member(self, cs: ClassState, node: Node) -> bool:
        """With --residual M, a singleton in the set is set aside unanalysed (STUCK, True): one
        whose network leaks at or above the level (`lucid.bab.order_statistic.known_member`), or
        one that ranks among the M largest bounds and was never analysed. Analysing a member can
        only lower the level by evicting it, while every network outside the set that is not yet
        below the level holds it up: those go first, and members are analysed (evictions tried)
        once the level waits for nothing else (`ResidualProgress.decided`)."""
        if not (known_member(cs, node) or (node.attempts == 0 and not node.evicting and set_aside(cs, node))):
            return False
        node.state = STUCK
        self.invocation.emit(
            "set_aside",
            cs.cls,
            **node.event_fields(),
            leak=float(cs.network_leak[node.positions[0]]),
        )
        return True

    def _next_node(self) -> tuple[ClassState, Node] | None:
        """A preferred retry, else the best pending node of the least busy class; None: none pending."""
        candidates = []
        for c, cs in self.states.items():
            if cs.done:
                continue
            while cs.pending_heap and (
                cs.pending_heap[0][1] not in cs.nodes or cs.nodes[cs.pending_heap[0][1]].state != PENDING
            ):
                heapq.heappop(cs.pending_heap)
            # with --residual M a node below the level waits: it cannot lower it (nor can any
            # node after it in the queue), and a worker it held would be missing at the level
            if cs.pending_heap and relevant(cs, cs.nodes[cs.pending_heap[0][1]]):
                busy = sum(1 for (k, _) in self.running if k == c)
                candidates.append((busy, cs.pending_heap[0][0], c))
        if not candidates:
            return None
        retry = self._preferred_retry()
        if retry is not None:
            return retry
        _, _, c = min(candidates)
        cs = self.states[c]
        _, node_id = heapq.heappop(cs.pending_heap)
        return cs, cs.nodes[node_id]

    def _start(self, cs: ClassState, node: Node) -> None:
        """Send `node` to a worker, with its time limit, cutoff and solver threads."""
        node.state = RUNNING
        last_work = self.last_work(node)
        cutoff = self.anytime.cutoff(cs)
        seek = self._seeks_leak(cs, node)
        if seek:
            cs.seekers += 1
            cutoff = -INF
        limit = attempt_time_limit(
            self.settings, node.attempts, self.invocation.deadline, last_work=last_work, seek=seek
        )
        # The last work may use the idle workers' cores: nothing else can ever need them.
        threads = max(1, self.executor.capacity - self.executor.in_flight) if last_work else 1
        self.running[(cs.cls, node.id)] = self.invocation.elapsed()
        split_only = self._split_only(cs, node, seek, threads)
        extra = {"seek": True} if seek else {}
        if threads > 1:
            extra["threads"] = threads
        if split_only:
            extra["split_only"] = True
        self.invocation.emit(
            "started",
            cs.cls,
            **node.event_fields(),
            time_limit=limit,
            attempt=node.attempts + 1,
            **extra,
        )
        self.executor.submit(
            (cs.cls, node.id), cs.cls, node.positions, limit, cutoff, node.attempts + 1, threads, split_only
        )

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
        busy = sum(
            1 for (c, nid) in self.running if (n := self.states[c].nodes.get(nid)) is not None and n.attempts > 0
        )
        if busy >= lanes:
            return None

        def candidate(cs: ClassState, node: Node | None) -> bool:
            return (
                node is not None
                and node.attempts > 0
                and node.is_singleton
                and (node.state == PENDING or (node.state == OPEN and self.retryable(node) and not set_aside(cs, node)))
                and relevant(cs, node)
                and not self.anytime.can_close(cs, node)
            )

        choice = None
        continuable = set(self.executor.continuable())
        for cs in self.states.values():
            if cs.done:
                continue
            level = self.anytime.cutoff(cs)
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
            self.retry(cs, node)
        return cs, node

    def _seeks_leak(self, cs: ClassState, node: Node) -> bool:
        """Whether `node` is one of the class's first singletons (its top-screened networks, one per
        worker), analysed once without the cutoff to find leaks between the best lower bound and it.

        Under a cutoff every model is restricted to beta above lower + tolerance, so a leak below that
        level is never found by the MILPs that could see it, although the top-screened networks are
        where the class's best leak most likely lies. A first attempt without the cutoff can find it
        early and so raise the level every later singleton has to be proved below, which makes all of
        those proofs easier."""
        return (
            node.is_singleton
            and node.attempts == 0
            and cs.seekers < self.executor.capacity
            and self.anytime.tolerance(cs) > 0
            and not self.settings.naive
            # (--residual M seeds every network's leaks at the start instead)
            and cs.residual_size is None
        )

    def retryable(self, node: Node) -> bool:
        """An unproved singleton gets another attempt with a longer node time limit; with a total
        time limit it keeps growing until that ends, else it gives up after a few."""
        deadline = self.invocation.deadline
        return (
            node.is_singleton
            and not node.proved
            and node_limit(self.settings, deadline) is not None
            and (node.attempts < MAX_SINGLETON_ATTEMPTS or deadline.seconds is not None)
        )

    def retry(self, cs: ClassState, node: Node) -> None:
        """Queue `node` again; it keeps its bound meanwhile."""
        node.state = PENDING
        heapq.heappush(cs.pending_heap, (-node.upper, node.id))
        self.invocation.emit(
            "retry",
            cs.cls,
            **node.event_fields(),
            attempt=node.attempts + 1,
        )
