"""The screened bound of every network, per class, as the engine and its scheduler use it.

A screen bounds each single network without a solver; a node's bound is at most the largest
screened bound of its networks. The optimised screen also refines, once per network, the bounds
of the networks a node is about to solve that are still above the class's cutoff. Both are handed
the engine's deadline and end by it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lucid.bab.anytime import AnytimeBounds
from lucid.bab.invocation import Invocation
from lucid.bab.order_statistic import network_bounds, ranked
from lucid.bab.state import INF, ClassState
from lucid.settings import VerifySettings

# (class, positions, deadline=) -> a sound bound per network; deadline: a time.monotonic() value (or
# None) by which the screen ends, the networks it did not reach by then keeping a cruder sound bound
ScreenFn = Callable[..., np.ndarray]
# (class, positions, level, deadline=) -> tighter sound bounds; +inf for the networks not reached by
# the deadline
RefineFn = Callable[..., np.ndarray]

RESIDUAL_REFINE_BATCH = 128  # --residual M: networks per refinement once one at or above the level needs it


class ScreenBounds:
    """Computes, refines and reads the per-network screened bounds stored in each `ClassState`."""

    def __init__(
        self,
        num_networks: int,
        settings: VerifySettings,
        anytime: AnytimeBounds,
        invocation: Invocation,
        screen: ScreenFn | None = None,
        refine: RefineFn | None = None,
    ) -> None:
        self.num_networks = num_networks  # stack size; positions 1..num_networks-1
        self.settings = settings
        self.anytime = anytime
        self.invocation = invocation
        self._screen = screen
        self._refine = None if screen is None else refine

    @property
    def enabled(self) -> bool:
        """Whether classes get screened bounds (a screen was given and the run is not --naive)."""
        return self._screen is not None and not self.settings.naive

    def initial(self, c: int) -> np.ndarray:
        """Class `c`'s screened bound per position (position 0, N itself: -inf), within the deadline."""
        positions = np.arange(1, self.num_networks, dtype=np.int64)
        values = np.full(self.num_networks, -INF)
        with self.invocation.phase("initial screen"):
            values[positions] = np.asarray(
                self._screen(c, positions, deadline=self.invocation.deadline.end), dtype=np.float64
            )
        return values

    def refine(self, cs: ClassState, positions: np.ndarray) -> None:
        """Tighten the screened bounds of the networks in `positions` that are above the class's
        cutoff and not refined yet (once each: a higher cutoff would not change the optimum).
        The optimised screen of a thousand networks of 64 inputs takes tens of seconds per class,
        so it is handed the deadline: the networks it has not reached by then keep their sound
        bound, and are refined when next asked. With --residual M, only networks at or above the
        level (and the next below it: `RESIDUAL_REFINE_BATCH` in all)."""
        if self._refine is None or cs.screen is None or cs.lower is None or self.settings.naive:
            return
        if cs.refined is None:
            cs.refined = np.zeros(self.num_networks, dtype=bool)
        level = cs.lower + self.anytime.tolerance(cs)
        todo = positions[(cs.screen[positions] > level) & ~cs.refined[positions]]
        if cs.residual_size is not None:
            # Only networks at or above the residual level can lower it; the others are refined
            # when the level reaches them, if it does. Refining every network at a class's start
            # held the workers idle for minutes (Adult 4k 2x50: 107 s and 50 s for 3 000 networks
            # on a loaded machine). A singleton's split starts from this bound itself. A call has
            # a fixed cost (tens of ms, in this process, while finished workers wait for it), so
            # the highest networks below the level come along, RESIDUAL_REFINE_BATCH in all.
            if len(positions) == 1:
                return
            todo = todo[np.argsort(-cs.screen[todo], kind="stable")]
            above = int((cs.screen[todo] >= cs.upper).sum())
            todo = todo[: max(above, RESIDUAL_REFINE_BATCH)] if above else todo[:0]
        if not len(todo) or self.invocation.past():
            return
        t0 = self.invocation.elapsed()
        with self.invocation.phase("screen refinement", cs.cls):
            tighter = np.asarray(
                self._refine(cs.cls, todo, level, deadline=self.invocation.deadline.end), dtype=np.float64
            )
        cs.screen[todo] = np.minimum(cs.screen[todo], tighter)
        if cs.residual_size is not None:
            # the set as the tighter bounds rank it, so that a node made next is set aside if it is in
            # it (the level follows at the next `AnytimeBounds.update`)
            cs.residual = ranked(network_bounds(cs), cs.residual_size)[0]
        todo = todo[tighter < INF]
        cs.refined[todo] = True
        if len(todo):
            self.invocation.emit(
                "refined",
                cs.cls,
                networks=len(todo),
                below=int((cs.screen[todo] <= level).sum()),
                seconds=self.invocation.elapsed() - t0,
            )

    @staticmethod
    def upper(cs: ClassState, positions: np.ndarray) -> float:
        """The largest screened bound of `positions` (+inf unscreened, -inf for no networks)."""
        if cs.screen is None or len(positions) == 0:
            return INF if len(positions) else -INF
        return float(cs.screen[positions].max())
