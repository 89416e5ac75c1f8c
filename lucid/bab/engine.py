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
unproved singleton is retried with a longer limit until the deadline (`Scheduler.retryable`).
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.bab.anytime import AnytimeBounds
from lucid.bab.events import EventLog
from lucid.bab.hooks import EngineHooks
from lucid.bab.invocation import Invocation
from lucid.bab.levels import ResidualProgress
from lucid.bab.node import FINAL, OPEN, PENDING, RUNNING, SETTLED, SPLIT, STUCK, Node
from lucid.bab.order_statistic import relevant, set_aside, track_networks
from lucid.bab.partition import PEEL_ROOT_ABOVE, peel_top, preload_kmeans, split_node
from lucid.bab.schedule import Scheduler
from lucid.bab.screening import ScreenBounds
from lucid.bab.state import INF, ClassState
from lucid.bab.workers import Executor
from lucid.deadline import Deadline, Phases
from lucid.errors import LucidError
from lucid.settings import VerifySettings


class Engine:
    """Runs the branch and bound of several classes on one shared executor.

    The engine owns the node life cycle (seed, solve, split, settle, retry, finish); it holds the
    collaborators that keep the bounds (`anytime`), the screened bounds (`screening`) and the
    schedule (`scheduler`), and the `invocation` whose clock and log they all share."""

    def __init__(
        self,
        executor: Executor,
        classes: list[int],
        num_networks: int,
        settings: VerifySettings,
        *,
        params: np.ndarray | Callable[[], np.ndarray] | None = None,
        hooks: EngineHooks | None = None,
        log: EventLog | None = None,
        states: dict[int, ClassState] | None = None,
        deadline: Deadline | None = None,
        phases: Phases | None = None,
    ) -> None:
        """`deadline`: when to stop (default: `settings.time_limit` from when `run` starts); one with
        a start makes an invocation's set-up (N's bounds, the initial screens) count against it too.
        `phases`: the run's named phases, when its set-up before the engine is named there too."""
        hooks = hooks if hooks is not None else EngineHooks()
        self.executor = executor
        self.settings = settings
        self.num_networks = num_networks  # stack size; positions 1..num_networks-1
        self._params = params
        self._search = None if settings.naive else hooks.search
        self.on_progress = hooks.on_progress
        self.on_checkpoint = hooks.on_checkpoint
        self.invocation = Invocation(log, deadline if deadline is not None else Deadline(settings.time_limit), phases)
        self.anytime = AnytimeBounds(settings, self.invocation, hooks.leaks)
        self.screening = ScreenBounds(num_networks, settings, self.anytime, self.invocation, hooks.screen, hooks.refine)
        self.states = states if states is not None else {c: ClassState(cls=c) for c in classes}
        if settings.residual:
            for cs in self.states.values():
                track_networks(cs, settings.residual_size(num_networks - 1), num_networks)
        if self.screening.enabled:
            for c, cs in self.states.items():
                if cs.screen is None:
                    cs.screen = self.screening.initial(c)
        self.scheduler = Scheduler(executor, self.states, settings, self.anytime, self.screening, self.invocation)
        self.levels = ResidualProgress(
            self.states, self.anytime, self.scheduler, executor, self.invocation, hooks.choose_size
        )

    def _pending(self) -> bool:
        """Whether some open class has a node waiting for a worker (with --residual M, one at or
        above the level: the others wait, `Scheduler.submit_ready`)."""
        for cs in self.states.values():
            if cs.done:
                continue
            if cs.residual_size is None:
                if cs.pending_heap:
                    return True
            elif any(
                nid in cs.nodes and cs.nodes[nid].state == PENDING and relevant(cs, cs.nodes[nid])
                for _, nid in cs.pending_heap
            ):
                return True
        return False

    def elapsed(self) -> float:
        """Seconds of the whole verification (across resumes), as the log and checkpoint count them."""
        return self.invocation.elapsed()

    def params(self) -> np.ndarray:
        """The networks' flattened parameters, which k-means splits on (computed on first use)."""
        if callable(self._params):
            self._params = self._params()
        return self._params

    # --- node life cycle ---------------------------------------------------------------------------
    def _new_node(
        self, cs: ClassState, positions: np.ndarray, upper: float, parent: Node | None, peel: bool = False
    ) -> Node:
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
        self.invocation.emit("queued", cs.cls, node=node.id, parent=node.parent, size=node.size, upper=upper)
        if self.anytime.can_close(cs, node):
            self.anytime.close(cs, node, "bound <= best lower")
        elif self.scheduler.set_aside_member(cs, node):
            pass
        elif peel:
            node.state = OPEN
            heapq.heappush(cs.open_heap, (-node.upper, node.id))
        else:
            heapq.heappush(cs.pending_heap, (-node.upper, node.id))
        return node

    def _seed(self, cs: ClassState) -> None:
        """The root node(s) of a fresh class."""
        positions = np.arange(1, self.num_networks, dtype=np.int64)
        if cs.residual_size is not None:
            with self.invocation.phase("leak seeding", cs.cls):
                self.anytime.seed_leaks(cs)
        self.invocation.emit("class_started", cs.cls, networks=len(positions))
        if self.settings.naive:
            for p in positions:
                self._new_node(cs, np.array([p]), INF, None)
        else:
            if cs.screen is not None:
                keep = cs.screen[positions] > -INF  # screened: no input can make it leak
                if not keep.all():
                    self.invocation.emit("screened", cs.cls, dropped=int((~keep).sum()), kept=int(keep.sum()))
                positions = positions[keep]
            if self._search is not None and len(positions):
                # A cheap witness first: with a good lower bound, the screen removes most networks
                # before the root hyper-network is even built (its MILP is then far tighter).
                t0 = self.elapsed()
                with self.invocation.phase("witness search", cs.cls):
                    found = self._search(cs.cls, positions, deadline=self.invocation.deadline.end)
                if found is not None:
                    self.anytime.apply_lower(
                        cs,
                        float(found.confidence),
                        found.leaking_row,
                        found.x,
                        "search",
                        update=False,
                        seconds=self.elapsed() - t0,
                    )
                self.screening.refine(cs, positions)
                positions = self.anytime.prune(cs, positions)
            if len(positions):
                peel = (
                    self.settings.bab
                    and cs.screen is not None
                    and len(positions) > PEEL_ROOT_ABOVE.get(self.settings.screen, INF)
                )
                self._new_node(cs, positions, self.screening.upper(cs, positions), None, peel=peel)
        self.anytime.update(cs)

    def _unseeded(self, cs: ClassState) -> None:
        """A class the time limit ended before its first node (a seed's witness search and screen
        refinement take seconds per class): it keeps its screened bound, or none."""
        positions = np.arange(1, self.num_networks, dtype=np.int64)
        if cs.residual_size is not None:
            self.anytime.update(cs)  # the level of the screened bounds
        elif cs.screen is not None:
            cs.upper = min(cs.upper, self.screening.upper(cs, positions))
        self.anytime.finish(cs, False, "time limit", stopped_in=self.invocation.stopped_in(cs.cls, started=False))

    def _on_result(self, key: tuple[int, int], outcome: Any) -> None:
        """A node's analysis reported: take its bound and leak, then close it or queue it as OPEN."""
        c, node_id = key
        self.scheduler.finished(key)
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
        screened = self.screening.upper(cs, node.positions)
        before = min(node.upper, screened)
        node.upper = min(node.upper, own, screened)
        if cs.residual_size is not None:  # a sound bound of each of its networks
            cs.network_bound[node.positions] = np.minimum(cs.network_bound[node.positions], node.upper)
        if not node.is_singleton and own >= before and cs.screen is not None and not self.settings.naive:
            node.peel = True  # the hyper-network MILP was no help here: peel, do not cluster
        node.status = outcome.status
        if cs.residual_size is not None and node.is_singleton and not node.proved:
            self.anytime.back_off(cs)  # its question was too hard: the class asks halfway from now on
        node.stats = dict(getattr(outcome, "stats", {}) or {})
        if outcome.lower is not None and math.isfinite(outcome.lower):
            node.lower = float(outcome.lower)
        self.scheduler.analysed(cs, node)
        self.invocation.emit(
            "solved",
            c,
            **node.event_fields(),
            milp_upper=own,
            lower=node.lower,
            status=node.status,
            seconds=float(getattr(outcome, "seconds", 0.0)),
            leaking_row=outcome.leaking_row,
            stats=node.stats,
        )
        if node.lower is not None:
            self.anytime.apply_lower(
                cs, node.lower, outcome.leaking_row, getattr(outcome, "witness", None), "milp", node=node.id
            )
        if self.anytime.can_close(cs, node):
            self.anytime.close(cs, node, "infeasible" if node.upper == -INF else "bound <= best lower")
        else:
            node.state = OPEN
            heapq.heappush(cs.open_heap, (-node.upper, node.id))
        self.anytime.update(cs)

    def _split(self, cs: ClassState, node: Node) -> None:
        """Replace `node` by its children: peeled singletons, or k-means clusters of its networks."""
        node.state = SPLIT
        cs.nodes.pop(node.id, None)
        self.screening.refine(cs, node.positions)  # peeling follows the best bounds (and the set)
        positions = self.anytime.prune(cs, node.positions, node.upper)
        if len(positions) == 0:
            self.invocation.emit(
                "closed",
                cs.cls,
                **node.event_fields(),
                reason="all networks screened below best lower",
            )
            return
        if node.peel and len(positions) > 1:
            groups = peel_top(positions, cs.screen, self.executor.capacity)
        else:
            groups = (
                [positions]
                if len(positions) == 1
                else split_node(self.params(), positions, proved=node.proved, random_state=self.settings.seed)
            )
        self.invocation.emit(
            "split",
            cs.cls,
            **node.event_fields(),
            children=[len(g) for g in groups],
            dropped=int(node.size - len(positions)),
            **({"peel": True} if node.peel else {}),
        )
        for g in groups:
            self._new_node(cs, g, min(node.upper, self.screening.upper(cs, g)), node, peel=node.peel and len(g) > 1)

    def _advance(self, cs: ClassState) -> None:
        """Apply the stopping and closing rules, then branch open nodes while workers would idle.

        A node that cannot be branched (a singleton, or the root with --no-bab) leaves the queue
        once solved: SETTLED if its bound is proved, STUCK if not (after the retries). Both stay
        active, so their bounds still count in the anytime upper bound; the class is exact once
        the largest active node is SETTLED — the paper's "proved singleton on top" rule.
        """
        cfg = self.settings
        while not cs.done:
            self.anytime.close_dominated(cs)
            self.anytime.update(cs)
            if not cs.nodes:
                # Everything closed: no network can leak above the best lower bound, or above the
                # bound of a node closed within the gap (then `AnytimeBounds.finish` says so).
                self.anytime.finish(cs, True, "all nodes closed")
                return
            if cs.lower is not None and cs.upper - cs.lower <= self.anytime.tolerance(cs):
                exact = cs.upper <= cs.lower
                self.anytime.finish(
                    cs,
                    True,
                    "upper = lower" if exact else "upper within the gap of the lower bound",
                    within_gap=not exact,
                )
                return
            if cs.residual_size is not None:
                if self.levels.decided(cs):
                    return
            elif (best := max(cs.nodes.values(), key=lambda n: (n.upper, n.state == SETTLED))).state == SETTLED:
                best.state = FINAL
                self.invocation.emit("final", cs.cls, **best.event_fields())
                self.anytime.finish(
                    cs, True, "proved singleton on top" if best.is_singleton else "hyper-network solved"
                )
                return
            elif best.state == STUCK and not any(n.state in (OPEN, PENDING, RUNNING) for n in cs.nodes.values()):
                # Nothing left that could improve the bound: the unproved bound stands (sound).
                self.anytime.finish(cs, False, "unproved node on top (node time limit)")
                return
            while cs.open_heap and (cs.open_heap[0][1] not in cs.nodes or cs.nodes[cs.open_heap[0][1]].state != OPEN):
                heapq.heappop(cs.open_heap)
            if not cs.open_heap:
                return  # waiting for pending / running nodes
            top = cs.nodes[cs.open_heap[0][1]]
            if not relevant(cs, top):
                return  # below the level: it cannot lower it (unless the level falls below it)
            if top.is_singleton or not (cfg.bab or cfg.naive):
                heapq.heappop(cs.open_heap)
                if top.proved:
                    top.state = SETTLED
                elif set_aside(cs, top):
                    top.state = STUCK  # in the set whatever its bound: retried only once the level waits for it
                elif self.scheduler.retryable(top):
                    self.scheduler.retry(cs, top)
                else:
                    top.state = STUCK
                continue
            # Branch only when a worker is free for a child: a node split while every worker is
            # busy would only wait, and after the running nodes report, their leaks can close or
            # prune it first. (With one worker the order of events is then fixed, not a race
            # between the split and a result that comes in within milliseconds.)
            pending = sum(1 for n in cs.nodes.values() if n.state == PENDING and relevant(cs, n))
            if pending + self.executor.in_flight >= self.executor.capacity:
                return
            heapq.heappop(cs.open_heap)
            self._split(cs, top)

    def _split_until_work(self) -> None:
        """Submitting may have closed the last pending node (its networks pruned by a lower bound)
        or set it aside (--residual M), leaving open nodes that only a split turns into work: split
        them until one round makes work or no new node. A round can make only nodes that are set
        aside again (the top of a peeled node that ranks among the M largest bounds: with M = 256
        and two workers, 128 rounds before the first singleton outside the set), and every split
        makes a node smaller, so this ends."""
        while not self.invocation.past():  # (past it, the main loop finishes the classes)
            made = sum(cs.next_id for cs in self.states.values())
            for cs in self.states.values():
                if not cs.done:
                    self._advance(cs)
            self.scheduler.submit_ready()
            if self.executor.in_flight or self._pending() or all(cs.done for cs in self.states.values()):
                return
            if sum(cs.next_id for cs in self.states.values()) == made:
                # No work anywhere, no class finished, nothing left to split: should not happen.
                raise RuntimeError("branch-and-bound stalled with open classes and no work")

    # --- main loop ---------------------------------------------------------------------------------
    def run(self, poll: float = 0.25) -> dict[int, ClassState]:
        """Verify every class until each is done or the deadline; `poll`: the longest wait for a
        result between scheduling rounds. Returns the class states."""
        if not self.invocation.fixed_start:
            self.invocation.start()
        for cs in self.states.values():
            if cs.done and cs.reason == "time limit" and (cs.nodes or cs.next_id == 0):
                # A resumed run continues what the last time limit cut short (or never started).
                cs.done, cs.complete, cs.reason = False, False, ""
                self.invocation.emit("class_reopened", cs.cls, upper=cs.upper, lower=cs.lower, open=len(cs.nodes))
        if self.settings.bab and not self.settings.naive:
            # scikit-learn takes seconds to import: overlap it with the root MILPs, not the first split.
            threading.Thread(target=preload_kmeans, daemon=True).start()
        for cs in self.states.values():
            if not cs.done and not cs.nodes and cs.solved == 0 and cs.next_id == 0:
                if self.invocation.past():
                    self._unseeded(cs)
                else:
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
                if self.invocation.past():
                    for cs in self.states.values():
                        if not cs.done:
                            self.anytime.finish(cs, False, "time limit", stopped_in=self.invocation.stopped_in(cs.cls))
                    break
                self.scheduler.submit_ready()
                if self.executor.in_flight == 0 and not self._pending():
                    self._split_until_work()
                wait = poll
                left = self.invocation.deadline.left()
                if left is not None:
                    wait = max(0.01, min(poll, left))
                results = self.executor.completed(wait)
                for key, outcome in results:
                    self._on_result(key, outcome)
                dirty = dirty or bool(results)
                if results:
                    self.levels.choose_size()
                if self.on_progress is not None:
                    self.on_progress(self)
        finally:
            if self.on_progress is not None:
                self.on_progress(self)
        self.levels.choose_size(final=True)
        if self.on_checkpoint is not None:
            self.on_checkpoint(self)
        return self.states
