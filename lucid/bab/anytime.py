"""The anytime bounds of a class and the rules that keep them sound.

`AnytimeBounds` holds the rules the engine and its scheduler apply to a class's state: the
tolerance and cutoff derived from the best replayed lower bound, when a node may be closed, how a
replayed witness raises the lower bound, which networks the screen prunes, the anytime upper bound
(the largest of the best lower bound, every active node's bound and the bound of any node closed
within the tolerance; it never rises) and how a class finishes. Every rule here only closes work
that cannot change the reported upper bound, so the bound stays >= beta*_c in every case.

With `--residual M` the upper bound is the level and the lower bound its floor, both order
statistics of per-network bounds and leaks (lucid/bab/order_statistic.py): a closed node's
networks keep their own bounds there, so nothing needs a gap floor.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lucid.bab.invocation import Invocation
from lucid.bab.node import CLOSED, OPEN, PENDING, SETTLED, STUCK, Node
from lucid.bab.order_statistic import leak_floor, leak_outside, network_bounds, ranked
from lucid.bab.state import INF, ClassState
from lucid.errors import InconsistentBounds
from lucid.settings import VerifySettings
from lucid.witness.network_leaks import NetworkLeaks

SEED_SEARCHED = 256  # --residual M: the most networks searched one by one for leaks at a class's start
SEED_SEARCH_SHARE = 0.05  # of the time left, at most, for that search
# --residual M: once a singleton of the class could not be proved below its question in its time,
# the class's later questions lie this share of the way from the best leak outside the set up to the
# level, while the two are more than QUESTION_EXACT_WITHIN (relative) apart. Asked at the leak
# itself, a network whose own bound lies between the two (the networks the level is made of) cannot
# be proved in any time and holds its worker until its limit, while halfway it is proved in seconds
# (Adult 4k 2x50, class 0's 33rd and 34th networks: <= 0.50 in 1-2 s, 0.44-0.45 after 15 s at 0.42
# or 0.36, 0.51-0.58 after 37 s at 0.27-0.30; benchmarks/results/residual_adult4k.md). The level
# then falls in steps, the question with it, and the last questions are the leak's: once the two
# are within QUESTION_EXACT_WITHIN of the leak (relative), or of the class's level when it backed
# off times the same share (a leak at 0 would otherwise halve the distance for ever). A class whose
# questions are all answered in time (small networks, where the MILP is exact in seconds) keeps
# asking at the leak: each halfway step would cost it a round of analyses.
QUESTION_SHARE = 0.5
QUESTION_EXACT_WITHIN = 0.05


class AnytimeBounds:
    """The bound rules of every class of one verification (the states themselves are passed in)."""

    def __init__(self, settings: VerifySettings, invocation: Invocation, leaks: NetworkLeaks | None = None) -> None:
        self.settings = settings
        self.invocation = invocation
        self.leaks = leaks  # every network's own leaks (--residual M)

    def tolerance(self, cs: ClassState) -> float:
        """How far above the best lower bound a bound may stay (0: exact); with a class target, up
        to it (a bound <= the target is all the caller needs, and it is kept in upper)."""
        if cs.lower is None:
            return 0.0
        tolerance = max(self.settings.gap, self.settings.rel_gap * abs(cs.lower))
        if cs.target is not None and not self.settings.naive:
            tolerance = max(tolerance, cs.target - cs.lower)
        return tolerance

    def cutoff(self, cs: ClassState) -> float:
        """The question a node's MILP must get below: lower + tolerance (-inf without a lower bound).
        With --residual M, at least the best leak outside the current set (plus the tolerance):
        that set's level can be no lower, and the (M+1)-th largest leak, the level's own floor, is
        often far below it (then every analysis would have to find its network's exact bound).
        Once a question proved too hard (`back_off`), while the level is far above that leak, the
        question lies QUESTION_SHARE of the way up to the level. Only the question asked rises:
        nodes are closed against the floor alone, so a node proved below this cutoff stays open,
        below the level, and is analysed again if the level falls under its bound (the set changed)."""
        if self.settings.naive:
            return -INF
        question = -INF if cs.lower is None else cs.lower + self.tolerance(cs)
        if cs.residual_size is not None and cs.residual is not None:
            leak, _ = leak_outside(cs, cs.residual)
            if leak is not None:
                question = max(question, leak + max(self.settings.gap, self.settings.rel_gap * abs(leak)))
            scale = cs.backed_off
            if (
                scale is not None
                and math.isfinite(question)
                and math.isfinite(cs.level)
                and cs.level - question > QUESTION_EXACT_WITHIN * max(abs(question), QUESTION_EXACT_WITHIN * scale)
            ):
                question += QUESTION_SHARE * (cs.level - question)
        return question

    def back_off(self, cs: ClassState) -> None:
        """--residual M: a singleton of the class was not proved below its question in its time;
        the class's questions lie halfway up to the level from now on (`cutoff`)."""
        if cs.residual_size is not None and cs.backed_off is None and math.isfinite(cs.level):
            cs.backed_off = abs(cs.level)
            self.invocation.emit("question_backed_off", cs.cls, level=cs.level, share=QUESTION_SHARE)

    def can_close(self, cs: ClassState, node: Node) -> bool:
        """Whether `node` cannot raise the reported upper bound (infeasible, or within the tolerance)."""
        if self.settings.naive:
            return node.upper == -INF
        return node.upper == -INF or (cs.lower is not None and node.upper <= cs.lower + self.tolerance(cs))

    def close(self, cs: ClassState, node: Node, why: str) -> None:
        """Take `node` out of the class; a bound above the best lower one stays in the upper bound."""
        if cs.residual_size is None and cs.lower is not None and node.upper > cs.lower:
            # closed within the tolerance: its bound stays part of the reported upper bound
            cs.gap_floor = max(cs.gap_floor, node.upper)
            why = "bound within the gap of the best lower"
        node.state = CLOSED
        cs.nodes.pop(node.id, None)
        self.invocation.emit("closed", cs.cls, **node.event_fields(), reason=why)

    def apply_lower(
        self, cs: ClassState, value: float, row: int | None, x: Any, source: str, *, update: bool = True, **extra: Any
    ) -> None:
        """A replayed witness: a true lower bound on beta_c. (`update=False` while the root is not
        queued yet: an empty queue would otherwise read as "everything closed".)"""
        if cs.residual_size is not None:
            here = self._network_leaks(cs, value, row, x)
            if self._raise_floor(cs, x, here, source, **extra) and update:
                self.update(cs)
            return
        if not math.isfinite(value) or (cs.lower is not None and value <= cs.lower):
            return
        cs.lower = value
        cs.lower_row = None if row is None else int(row)
        cs.lower_witness = None if x is None else [float(v) for v in np.ravel(x)]
        self.invocation.emit("witness", cs.cls, lower=value, leaking_row=cs.lower_row, source=source, **extra)
        if update:
            self.update(cs)

    def _network_leaks(self, cs: ClassState, value: float, row: int | None, x: Any) -> np.ndarray | None:
        """Every network's leak at the witness `x` (a point usually leaks for many), and `value`
        for the network of `row` that the caller replayed; returns the leaks at x."""
        if self.leaks is None:
            raise ValueError("--residual needs the networks' own leaks (EngineHooks.leaks)")
        here = None
        if x is not None:
            here = self.leaks.at(cs.cls, np.asarray(x, dtype=np.float64))
            np.maximum(cs.network_leak, here, out=cs.network_leak)
        position = None if row is None else self.leaks.position(row)
        if position is not None and math.isfinite(value):
            cs.network_leak[position] = max(cs.network_leak[position], value)
        return here

    def seed_leaks(self, cs: ClassState) -> None:
        """--residual M, before the first node: every network's leaks at many candidate inputs,
        then a search per network for the 2(M+1) networks the screen ranks highest (those that
        decide the level's lower bound, which is the cutoff every analysis is asked about; a
        cutoff far below the level makes each singleton MILP compute its exact bound), within
        SEED_SEARCH_SHARE of the time left; the sampled leaks until the deadline (a network not
        reached keeps -inf: no leak is claimed)."""
        np.maximum(cs.network_leak, self.leaks.sampled(cs.cls, self.invocation.deadline.end), out=cs.network_leak)
        bounds = network_bounds(cs)
        order = np.lexsort((np.arange(len(bounds)), -bounds))
        top = order[order > 0][: min(2 * (cs.residual_size + 1), SEED_SEARCHED)]
        left = self.invocation.deadline.left()
        deadline = None if left is None else time.monotonic() + SEED_SEARCH_SHARE * max(0.0, left)
        np.maximum(cs.network_leak, self.leaks.searched(cs.cls, top, deadline), out=cs.network_leak)
        self._raise_floor(cs, None, None, "sampled")

    def _raise_floor(self, cs: ClassState, x: Any, here: np.ndarray | None, source: str, **extra: Any) -> bool:
        """The level's lower bound, the (M+1)-th largest leak, if it rose (True)."""
        value, position = leak_floor(cs.network_leak, cs.residual_size)
        if value is None or (cs.lower is not None and value <= cs.lower):
            return False
        cs.lower = value
        cs.lower_row = self.leaks.row(position)
        cs.lower_witness = [float(v) for v in np.ravel(x)] if here is not None and here[position] == value else None
        self.invocation.emit("witness", cs.cls, lower=value, leaking_row=cs.lower_row, source=source, **extra)
        return True

    def prune(self, cs: ClassState, positions: np.ndarray, cap: float = INF) -> np.ndarray:
        """Drop networks whose screened bound is within the tolerance of the best lower bound
        (<= it when exact): they cannot raise beta_c above the reported upper bound. `cap`: a
        bound of the node they come from, which also bounds each of them."""
        if cs.screen is None or cs.lower is None or self.settings.naive:
            return positions
        values = cs.screen[positions]
        keep = values > cs.lower + self.tolerance(cs)
        dropped = values[~keep]
        if cs.residual_size is None and dropped.size and min(dropped.max(), cap) > cs.lower:
            cs.gap_floor = max(cs.gap_floor, float(min(dropped.max(), cap)))
        return positions[keep]

    def update(self, cs: ClassState) -> None:
        """Anytime upper = max(best lower, every active node's bound); it only ever decreases.
        With --residual M: the level, the (M+1)-th largest network bound (for a fixed M it only
        ever decreases too)."""
        if cs.residual_size is not None:
            self._update_level(cs)
            return
        if cs.nodes:
            current = cs.active_max()
            if cs.lower is not None:
                current = max(current, cs.lower)
        else:
            current = cs.lower if cs.lower is not None else -INF
        current = max(current, cs.gap_floor)
        cs.upper = min(cs.upper, current)
        if cs.lower is not None and cs.upper < cs.lower:
            raise InconsistentBounds(
                f"internal error: class {cs.cls}'s proved upper bound {cs.upper!r} lies below a replayed leak "
                f"{cs.lower!r}, so some bound is unsound; no bounds are written (please report this run)"
            )
        state = (cs.upper, cs.lower)
        if state != cs.logged:
            cs.logged = state
            self.invocation.emit(
                "anytime", cs.cls, upper=cs.upper, lower=cs.lower, open=len(cs.nodes), solved=cs.solved
            )

    def _update_level(self, cs: ClassState) -> None:
        bounds = network_bounds(cs)
        unsound = np.flatnonzero(bounds[1:] < cs.network_leak[1:]) + 1
        if len(unsound):
            p = int(unsound[0])
            raise InconsistentBounds(
                f"internal error: class {cs.cls}'s proved bound {bounds[p]!r} of the network without row "
                f"{self.leaks.row(p)} lies below its replayed leak {cs.network_leak[p]!r}, so some bound is "
                "unsound; no bounds are written (please report this run)"
            )
        cs.residual, cs.upper, holder = ranked(bounds, cs.residual_size)
        state = (cs.upper, cs.lower, cs.residual_size)
        if state != cs.logged:
            cs.logged = state
            self.invocation.emit(
                "anytime",
                cs.cls,
                upper=cs.upper,
                lower=cs.lower,
                open=len(cs.nodes),
                solved=cs.solved,
                residual_size=cs.residual_size,
                holder=None if holder is None else self.leaks.row(holder) if self.leaks else holder,
            )

    def finish(
        self, cs: ClassState, complete: bool, reason: str, within_gap: bool = False, stopped_in: str | None = None
    ) -> None:
        """End the class with its anytime bounds as they stand (`complete`: no time limit cut it
        short; `stopped_in`: the phase a time limit stopped it in)."""
        # a node closed within the gap keeps its bound in upper: the finish is then not exact either
        kept = complete and cs.lower is not None and cs.gap_floor > cs.lower and cs.residual_size is None
        if kept and not within_gap:
            reason += ", some nodes closed within the gap"
        cs.done = True
        cs.complete = complete
        cs.reason = reason
        cs.stopped_in = stopped_in
        cs.within_gap = complete and (within_gap or kept)
        cs.seconds = self.invocation.elapsed()
        self.invocation.emit(
            "class_done",
            cs.cls,
            upper=cs.upper,
            lower=cs.lower,
            complete=complete,
            reason=reason,
            within_gap=cs.within_gap,
            solved=cs.solved,
            open=len(cs.nodes),
            **({} if stopped_in is None else {"stopped_in": stopped_in}),
        )
        if cs.residual_size is not None:
            self._log_set(cs)

    def _log_set(self, cs: ClassState) -> None:
        """The `residual` event: the class's set, its members' bounds and leaks (largest bound
        first), and the network that holds the level (the next largest bound)."""
        bounds = network_bounds(cs)
        members, level, holder = ranked(bounds, cs.residual_size)
        members = members[np.lexsort((members, -bounds[members]))]
        row = self.leaks.row if self.leaks is not None else int
        self.invocation.emit(
            "residual",
            cs.cls,
            networks=len(members),
            size=cs.residual_size,
            level=level,
            positions=[int(p) for p in members],
            rows=[row(int(p)) for p in members],
            bounds=[float(bounds[p]) for p in members],
            leaks=[float(cs.network_leak[p]) for p in members],
            holder=None
            if holder is None
            else {"row": row(holder), "bound": float(bounds[holder]), "leak": float(cs.network_leak[holder])},
        )

    def close_dominated(self, cs: ClassState) -> None:
        """Close every waiting node the best lower bound makes irrelevant (not running ones)."""
        for node in list(cs.nodes.values()):
            if node.state in (OPEN, PENDING, SETTLED, STUCK) and self.can_close(cs, node):
                self.close(cs, node, "bound <= best lower")
