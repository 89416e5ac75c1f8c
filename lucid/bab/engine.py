"""LUCID-Compute (paper Algorithm 1) with anytime lower bounds, pruning and parallel workers.

Per class c the engine keeps a max-priority queue of solved nodes (network sets S with a proved
upper bound on max_{i in S} beta*_{c,{i}}) and repeatedly pops the largest:
  * a singleton with a proved bound on top of everything (queued and in flight) is beta_c: stop;
  * otherwise S is split by k-means (a set of <= 8 whose MILP timed out: into singletons) and the
    children are analysed; an unsolved child carries its
    parent's bound, so the anytime upper bound max(queued, in flight) never rises.
Beyond the paper, every replayed witness (NodeOutcome.lower) is a real leaking input, so the best one
is a lower bound on beta_c; a node whose upper bound is <= it cannot change beta_c and is closed.
The class stops when upper - lower <= the tolerance max(gap, rel_gap * |lower|), when nothing is
left open, or at the time limit; the reported upper is then max(best lower, max open upper, the
largest bound of a node closed within the tolerance) — sound in every case. Node MILPs get the
level lower + tolerance as a cutoff: they only have to show that their networks stay below it,
which is usually proved at the root where the exact bound would take minutes: the model above
the level is small or infeasible, while the exact bound needs the branch-and-bound to close the
whole gap between relaxation and optimum (figures in benchmarks/results/idle_machine.md).

A node that hits its time limit keeps its (proved) dual bound and is branched like any other; an
unproved singleton cannot be branched, so it is retried with `RETRY_GROWTH` times the previous limit
(until the total time limit, or `MAX_SINGLETON_ATTEMPTS` solves without one) and otherwise keeps
its sound bound.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any, Callable

import numpy as np

from lucid.bab.node import FINAL, OPEN, PENDING, RUNNING, SETTLED, SPLIT, STUCK, Node
from lucid.bab.anytime import AnytimeBounds
from lucid.bab.schedule import Scheduling
from lucid.bab.split import PEEL_ROOT_ABOVE, peel_top, split_node
from lucid.bab.state import INF, ClassState
from lucid.errors import LucidError
from lucid.settings import VerifySettings

def _preload_kmeans() -> None:
    try:
        import sklearn.cluster  # noqa: F401
    except Exception:
        pass


class Engine(AnytimeBounds, Scheduling):
    """Runs the branch-and-bound of several classes on one shared executor (the rules here; which
    node runs next, where and for how long in `lucid.bab.schedule`)."""

    def __init__(
        self,
        executor: Any,
        classes: list[int],
        num_networks: int,
        config: VerifySettings,
        *,
        params: np.ndarray | Callable[[], np.ndarray] | None = None,
        screen: Callable[[int, np.ndarray], np.ndarray] | None = None,
        refine: Callable[[int, np.ndarray, float], np.ndarray] | None = None,
        search: Callable[[int, np.ndarray], Any] | None = None,
        log: Any = None,
        on_progress: Callable[["Engine"], None] | None = None,
        on_checkpoint: Callable[["Engine"], None] | None = None,
        states: dict[int, ClassState] | None = None,
    ) -> None:
        self.executor = executor
        self.config = config
        self.num_networks = num_networks  # stack size; positions 1..num_networks-1
        self._params = params
        self._screen_fn = screen
        self._refine_fn = None if screen is None else refine
        self._search_fn = None if config.naive else search
        self.log = log
        self.on_progress = on_progress
        self.on_checkpoint = on_checkpoint
        self.states = states if states is not None else {c: self._fresh_state(c) for c in classes}
        if screen is not None and not config.naive:
            for c, cs in self.states.items():
                if cs.screen is None:
                    cs.screen = self._screen(c)
        self._running: dict[tuple[int, int], float] = {}

    # --- setup -------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.log.elapsed() if self.log is not None else time.monotonic() - self._t0

    def _emit(self, event: str, cls: int | None = None, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, cls, **fields)

    def _screen(self, c: int) -> np.ndarray:
        positions = np.arange(1, self.num_networks, dtype=np.int64)
        values = np.full(self.num_networks, -INF)
        values[positions] = np.asarray(self._screen_fn(c, positions), dtype=np.float64)
        return values

    def _refine(self, cs: ClassState, positions: np.ndarray) -> None:
        """Tighten the screened bounds of the networks in `positions` that are above the class's
        cutoff and not refined yet (once each: a higher cutoff would not change the optimum)."""
        if self._refine_fn is None or cs.screen is None or cs.lower is None or self.config.naive:
            return
        if cs.refined is None:
            cs.refined = np.zeros(self.num_networks, dtype=bool)
        level = cs.lower + self.tolerance(cs)
        todo = positions[(cs.screen[positions] > level) & ~cs.refined[positions]]
        if not len(todo):
            return
        t0 = self.elapsed()
        tighter = np.asarray(self._refine_fn(cs.cls, todo, level), dtype=np.float64)
        cs.screen[todo] = np.minimum(cs.screen[todo], tighter)
        cs.refined[todo] = True
        self._emit("refined", cs.cls, networks=len(todo), below=int((cs.screen[todo] <= level).sum()),
                   seconds=self.elapsed() - t0)

    def _fresh_state(self, c: int) -> ClassState:
        return ClassState(cls=c)

    def params(self) -> np.ndarray:
        if callable(self._params):
            self._params = self._params()
        return self._params

    def _new_node(self, cs: ClassState, positions: np.ndarray, upper: float, parent: Node | None,
                  peel: bool = False) -> Node:
        """A child carrying `upper`; with `peel` it skips its MILP and waits, OPEN, to be peeled."""
        node = Node(
            id=cs.next_id,
            parent=None if parent is None else parent.id,
            positions=np.asarray(positions, dtype=np.int64),
            upper=upper,
            depth=0 if parent is None else parent.depth + 1,
            peel=peel,
        )
        cs.next_id += 1
        cs.nodes[node.id] = node
        self._emit("queued", cs.cls, node=node.id, parent=node.parent, size=node.size, upper=upper)
        if self._can_close(cs, node):
            self._close(cs, node, "bound <= best lower")
        elif peel:
            node.state = OPEN
            heapq.heappush(cs.open_heap, (-node.upper, node.id))
        else:
            heapq.heappush(cs.pending_heap, (-node.upper, node.id))
        return node

    def _screened_upper(self, cs: ClassState, positions: np.ndarray) -> float:
        if cs.screen is None or len(positions) == 0:
            return INF if len(positions) else -INF
        return float(cs.screen[positions].max())

    def _seed(self, cs: ClassState) -> None:
        """The root node(s) of a fresh class."""
        positions = np.arange(1, self.num_networks, dtype=np.int64)
        self._emit("class_started", cs.cls, networks=len(positions))
        if self.config.naive:
            for p in positions:
                self._new_node(cs, np.array([p]), INF, None)
        else:
            if cs.screen is not None:
                keep = cs.screen[positions] > -INF  # screened: no input can make it leak
                if not keep.all():
                    self._emit("screened", cs.cls, dropped=int((~keep).sum()), kept=int(keep.sum()))
                positions = positions[keep]
            if self._search_fn is not None and len(positions):
                # A cheap witness first: with a good lower bound, the screen removes most networks
                # before the root hyper-network is even built (its MILP is then far tighter).
                t0 = self.elapsed()
                found = self._search_fn(cs.cls, positions)
                if found is not None:
                    self._apply_lower(cs, float(found.confidence), found.leaking_row, found.x, "search",
                                      update=False, seconds=self.elapsed() - t0)
                self._refine(cs, positions)
                positions = self._prune(cs, positions)
            if len(positions):
                peel = (self.config.bab and cs.screen is not None
                        and len(positions) > PEEL_ROOT_ABOVE.get(self.config.screen, INF))
                self._new_node(cs, positions, self._screened_upper(cs, positions), None, peel=peel)
        self._update_anytime(cs)

    # --- node life cycle ---------------------------------------------------------------------------
    def _on_result(self, key: tuple[int, int], outcome: Any) -> None:
        c, node_id = key
        self._running.pop(key, None)
        cs = self.states[c]
        node = cs.nodes.get(node_id)
        if node is None or cs.done or node.state != RUNNING:
            return  # a result for a node closed meanwhile, or after the class finished
        if isinstance(outcome, BaseException):
            if isinstance(outcome, LucidError):
                raise outcome
            raise RuntimeError(f"analysing node {node_id} of class {c} failed: {outcome!r}") from outcome
        node.attempts += 1
        cs.solved += 1
        own = float(outcome.upper)
        screened = self._screened_upper(cs, node.positions)
        before = min(node.upper, screened)
        node.upper = min(node.upper, own, screened)
        if not node.is_singleton and own >= before and cs.screen is not None and not self.config.naive:
            node.peel = True  # the hyper-network MILP was no help here: peel, do not cluster
        node.status = outcome.status
        node.stats = dict(getattr(outcome, "stats", {}) or {})
        if outcome.lower is not None and math.isfinite(outcome.lower):
            node.lower = float(outcome.lower)
        self._emit(
            "solved", c, node=node.id, parent=node.parent, size=node.size, upper=node.upper, milp_upper=own,
            lower=node.lower, status=node.status, seconds=float(getattr(outcome, "seconds", 0.0)),
            leaking_row=outcome.leaking_row, stats=node.stats,
        )
        if node.lower is not None:
            self._apply_lower(cs, node.lower, outcome.leaking_row, getattr(outcome, "witness", None), "milp",
                              node=node.id)
        if self._can_close(cs, node):
            self._close(cs, node, "infeasible" if node.upper == -INF else "bound <= best lower")
        else:
            node.state = OPEN
            heapq.heappush(cs.open_heap, (-node.upper, node.id))
        self._update_anytime(cs)

    def _split(self, cs: ClassState, node: Node) -> None:
        node.state = SPLIT
        cs.nodes.pop(node.id, None)
        self._refine(cs, node.positions)  # peeling follows the best bounds
        positions = self._prune(cs, node.positions, node.upper)
        if len(positions) == 0:
            self._emit("closed", cs.cls, node=node.id, parent=node.parent, size=node.size, upper=node.upper,
                       reason="all networks screened below best lower")
            return
        if node.peel and len(positions) > 1:
            groups = peel_top(positions, cs.screen, self.executor.capacity)
        else:
            groups = [positions] if len(positions) == 1 else split_node(
                self.params(), positions, proved=node.proved, random_state=self.config.seed)
        self._emit("split", cs.cls, node=node.id, parent=node.parent, size=node.size, upper=node.upper,
                   children=[len(g) for g in groups], dropped=int(node.size - len(positions)),
                   **({"peel": True} if node.peel else {}))
        for g in groups:
            self._new_node(cs, g, min(node.upper, self._screened_upper(cs, g)), node, peel=node.peel and len(g) > 1)

    def _advance(self, cs: ClassState) -> None:
        """Apply the stopping and closing rules, then branch open nodes while workers would idle.

        A node that cannot be branched (a singleton, or the root with --no-bab) leaves the queue
        once solved: SETTLED if its bound is proved, STUCK if not (after the retries). Both stay
        active, so their bounds still count in the anytime upper bound; the class is exact once
        the largest active node is SETTLED — the paper's "proved singleton on top" rule.
        """
        cfg = self.config
        while not cs.done:
            self._close_dominated(cs)
            self._update_anytime(cs)
            if not cs.nodes:
                # Everything closed: no network can leak above the best lower bound, or above the
                # bound of a node closed within the gap (then `_finish` says so).
                self._finish(cs, True, "all nodes closed")
                return
            if cs.lower is not None and cs.upper - cs.lower <= self.tolerance(cs):
                exact = cs.upper <= cs.lower
                self._finish(cs, True, "upper = lower" if exact else "upper within the gap of the lower bound",
                             within_gap=not exact)
                return
            best = max(cs.nodes.values(), key=lambda n: (n.upper, n.state == SETTLED))
            if best.state == SETTLED:
                best.state = FINAL
                self._emit("final", cs.cls, node=best.id, parent=best.parent, size=best.size, upper=best.upper)
                self._finish(cs, True, "proved singleton on top" if best.is_singleton else "hyper-network solved")
                return
            if best.state == STUCK and not any(n.state in (OPEN, PENDING, RUNNING) for n in cs.nodes.values()):
                # Nothing left that could improve the bound: the unproved bound stands (sound).
                self._finish(cs, False, "unproved node on top (node time limit)")
                return
            while cs.open_heap and (
                cs.open_heap[0][1] not in cs.nodes or cs.nodes[cs.open_heap[0][1]].state != OPEN
            ):
                heapq.heappop(cs.open_heap)
            if not cs.open_heap:
                return  # waiting for pending / running nodes
            top = cs.nodes[cs.open_heap[0][1]]
            if top.is_singleton or not (cfg.bab or cfg.naive):
                heapq.heappop(cs.open_heap)
                if top.proved:
                    top.state = SETTLED
                elif self._retryable(top):
                    self._retry(cs, top)
                else:
                    top.state = STUCK
                continue
            # Branch only when a worker is free for a child: a node split while every worker is
            # busy would only wait, and after the running nodes report, their leaks can close or
            # prune it first. (With one worker the order of events is then fixed, not a race
            # between the split and a result that comes in within milliseconds.)
            pending = sum(1 for n in cs.nodes.values() if n.state == PENDING)
            if pending + self.executor.in_flight >= self.executor.capacity:
                return
            heapq.heappop(cs.open_heap)
            self._split(cs, top)

    def _retry(self, cs: ClassState, node: Node) -> None:
        node.state = PENDING  # keeps its bound
        heapq.heappush(cs.pending_heap, (-node.upper, node.id))
        self._emit("retry", cs.cls, node=node.id, parent=node.parent, size=node.size, upper=node.upper,
                   attempt=node.attempts + 1)

    # --- main loop ---------------------------------------------------------------------------------
    def run(self, poll: float = 0.25) -> dict[int, ClassState]:
        self._t0 = self._session_t0 = time.monotonic()
        for cs in self.states.values():
            if cs.done and cs.reason == "time limit" and cs.nodes:
                # A resumed run continues what the last time limit cut short.
                cs.done, cs.complete, cs.reason = False, False, ""
                self._emit("class_reopened", cs.cls, upper=cs.upper, lower=cs.lower, open=len(cs.nodes))
        if self.config.bab and not self.config.naive:
            # scikit-learn takes seconds to import: overlap it with the root MILPs, not the first split.
            import threading

            threading.Thread(target=_preload_kmeans, daemon=True).start()
        for cs in self.states.values():
            if not cs.done and not cs.nodes and cs.solved == 0 and cs.next_id == 0:
                self._seed(cs)
        dirty = True
        try:
            while True:
                for cs in self.states.values():
                    if not cs.done:
                        self._advance(cs)
                if dirty and self.on_checkpoint is not None:
                    # After the results *and* the splits/closures they caused, so a resumed run
                    # continues from a state at least as advanced as every event already logged.
                    self.on_checkpoint(self)
                    dirty = False
                if all(cs.done for cs in self.states.values()):
                    break
                if self.config.time_limit is not None and self.session_elapsed() >= self.config.time_limit:
                    for cs in self.states.values():
                        if not cs.done:
                            self._finish(cs, False, "time limit")
                    break
                self._submit_ready()
                if self.executor.in_flight == 0 and not any(
                    cs.pending_heap for cs in self.states.values() if not cs.done
                ):
                    # No work anywhere and no class finished: should not happen; fail loudly.
                    raise RuntimeError("branch-and-bound stalled with open classes and no work")
                wait = poll
                if self.config.time_limit is not None:
                    wait = max(0.01, min(poll, self.config.time_limit - self.session_elapsed()))
                results = self.executor.completed(wait)
                for key, outcome in results:
                    self._on_result(key, outcome)
                dirty = dirty or bool(results)
                if self.on_progress is not None:
                    self.on_progress(self)
        finally:
            if self.on_progress is not None:
                self.on_progress(self)
        if self.on_checkpoint is not None:
            self.on_checkpoint(self)
        return self.states
