"""One box of `lucid verify --regions K`: its screen, or its whole branch-and-bound.

A box starts from what its ancestors proved: their per-network screened bounds (sound over any
sub-box), their bound as a cap (`RegionTree.record`), and their best leaks inside the box (true
lower bounds there). Each box's verification records its bounds in the tree and logs one `region`
event, whose `seconds` `lucid log` sums.

With `--residual M` each box chooses its own residual sets: a screened box sets aside the M
networks its screen ranks highest and its level is the largest bound of the rest
(`lucid.residual.split_off`); a box's branch-and-bound chooses them as the plain strategy does:
its level is the (M+1)-th largest network bound over the box (lucid/bab/order_statistic.py).
Leaks found in an ancestor are not carried into such a box's branch-and-bound (the box's own
search seeds every network's leaks).
"""

from __future__ import annotations

import time

import numpy as np

# LiveDisplay and the executors are looked up through their modules at call time, so a test or a
# benchmark can substitute them.
import lucid.bab.display as live_display
import lucid.bab.workers as executors
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.scaling import rescale_stack
from lucid.analysis.screen import Screen
from lucid.bab.assembly import assemble_engine, screen_of
from lucid.bab.events import EventLog
from lucid.bab.order_statistic import residual_set
from lucid.bab.state import ClassState
from lucid.deadline import Deadline
from lucid.regions.tree import RegionTree
from lucid.residual import split_off
from lucid.rundir import bound_entry_value
from lucid.settings import VerifySettings

EXACT_TOLERANCE = 1e-6  # a bound within this (relative) of a leak in its box is that box's exact bound
# Seconds a finished box's last analyses get to end before their workers are replaced (restarting
# a worker costs seconds; waiting for a long MILP would overrun --time-limit).
REBIND_GRACE = 2.0


class BoxVerifier:
    """Verifies boxes of one tree on one executor, which follows the box being verified.

    `screens` (node -> class -> per-network screened bounds) and `leaks` (node -> class -> the
    best leak found there) are what later boxes start from; the caller checkpoints `leaks`."""

    def __init__(
        self,
        tree: RegionTree,
        root: VerificationProblem,
        settings: VerifySettings,
        log: EventLog,
        leaks: dict[int, dict[int, dict]],
    ) -> None:
        self.tree, self.root, self.settings, self.log, self.leaks = tree, root, settings, log, leaks
        self.screens: dict[int, dict[int, np.ndarray]] = {}
        self.executor = executors.local_executor(root, settings)  # follows the box being verified (`rebind`)

    def close(self) -> None:
        self.executor.close()

    def problem(self, node: int) -> VerificationProblem:
        """The verification problem restricted to `node`'s box (its points: those inside)."""
        if node == 0:
            return self.root
        lo, hi = self.tree.box(node)
        stack = self.root.stack
        if self.root.neuron_scales is not None:
            # Back to the stored networks (exact: powers of two). The root's rescaled stack moves each
            # hidden neuron's factor into the next layer's columns, where it can pass the entry guard's
            # parameter limit; and the box's own scales must be relative to the stored networks.
            stack = rescale_stack(stack, [1.0 / s for s in self.root.neuron_scales])
        problem = VerificationProblem.from_stack(stack, lo, hi, bounds=self.root.bounds_method)
        if self.root.points is not None:
            inside = np.all((self.root.points >= lo) & (self.root.points <= hi), axis=1)
            problem.points = self.root.points[inside] if inside.any() else None
        return problem

    def screen(self, node: int, classes: list[int]) -> None:
        """The screen of `node`'s box for `classes`: each network's bound is the smaller of its own
        screen over the box and its nearest verified ancestor's (both sound over the box), and the
        box's bound per class the largest of them. Its lower bounds are the leaks its ancestors found
        inside it. Not complete unless the bound meets such a leak or is <= 0."""
        tree, t0 = self.tree, time.monotonic()
        problem = self.problem(node)
        prior = self.nearest_screens(node)
        open_classes = [c for c in classes if tree.bound_upper[node][c] > 0]
        upper = tree.bound_upper[node].copy()
        lower = np.full(tree.num_classes, -np.inf)
        inherited = self.inherited_leaks(node)
        self.leaks[node], self.screens[node] = {}, {}
        if open_classes:
            screen = Screen(problem, self.settings.screen, self.settings.device, open_classes)
            positions = np.arange(1, len(problem.stack), dtype=np.int64)
            known = {c: prior[c][positions] for c in open_classes if c in prior}
            size = self.settings.residual
            for c, found in screen.highest(open_classes, positions, known, rank=size + 1).items():
                bound = np.full(len(problem.stack), -np.inf)
                bound[positions] = found
                self.screens[node][c] = bound
                upper[c] = min(upper[c], float(bound.max()))
                if size:
                    tree.record_residual(node, c, split_off(bound, positions, size))
        for c, leak in inherited.items():
            lower[c] = leak["value"]
            self.leaks[node][c] = leak
        found = np.isfinite(lower)
        meets = upper <= np.where(
            found, lower + EXACT_TOLERANCE * np.maximum(1.0, np.abs(np.where(found, lower, 0))), -np.inf
        )
        seconds = round(time.monotonic() - t0, 3)  # the same figure in the tree and the log
        tree.record(node, upper, lower, seconds, ~(upper > 0) | meets)
        self._log_region(
            node,
            open_classes,
            seconds,
            screen_only=True,
            complete={str(c): bool(tree.complete[node][c]) for c in open_classes},
        )

    def verify(
        self,
        node: int,
        classes: list[int],
        deadline: Deadline,
        targets: dict[int, float] | None = None,
        continued: dict[int, ClassState] | None = None,
    ) -> dict[int, ClassState]:
        """The whole branch-and-bound of `node`'s box for `classes` within `deadline`, starting from
        its ancestors' screens and leaks; a box screened already (`screen`, or the rest of a
        screened carve, which keeps its box) starts from those bounds instead of screening again.
        `continued`: the states of the box's earlier branch-and-bound that a deadline cut short,
        continued where they stopped. Returns the states of the classes cut short this time."""
        tree, settings, t0 = self.tree, self.settings, time.monotonic()
        problem = self.problem(node)
        self.executor.rebind(problem, grace=REBIND_GRACE)
        parent_screens = self.nearest_screens(node)
        # A class whose bound is already <= 0 here releases every confident input: nothing to gain.
        open_classes = [c for c in classes if tree.bound_upper[node][c] > 0]
        if not open_classes:
            tree.record(node, tree.bound_upper[node], tree.bound_lower[node], 0.0, np.ones(tree.num_classes, bool))
            self._log_region(node, None, 0.0, skipped=True)
            return {}
        screen = screen_of(problem, settings, open_classes)

        def initial(c: int, positions: np.ndarray, deadline: float | None = None) -> np.ndarray:
            own = screen.initial(c, positions, deadline)  # (called only with a screen)
            prior = parent_screens.get(c)
            return own if prior is None else np.minimum(own, prior[positions])

        states = self._start_states(node, open_classes, targets, continued)
        title = f"lucid verify --regions: box {node} of at most {2 * settings.regions - 1}"
        with live_display.LiveDisplay(title, enabled=settings.progress) as display:
            engine = assemble_engine(
                problem,
                settings,
                self.executor,
                open_classes,
                screen=screen,
                initial=initial,
                on_progress=display.update,
                states=states,
                deadline=deadline,
            )
            engine.run()
            states = engine.states
        upper = tree.bound_upper[node].copy()  # classes not verified here keep what they had
        lower = np.full(tree.num_classes, -np.inf)
        complete = tree.complete[node] | ~(upper > 0)
        self.leaks[node], self.screens[node] = {}, {}
        for c, cs in states.items():
            upper[c], complete[c] = cs.upper, cs.complete
            if cs.residual_size is not None:  # the engine's upper is the level outside the set
                found = residual_set(cs)
                tree.record_residual(node, c, found)
                upper[c] = found.highest
            if cs.lower is not None:
                lower[c] = cs.lower
                if cs.lower_witness is not None:  # (a residual level's floor may come from sampled leaks)
                    self.leaks[node][c] = {"x": cs.lower_witness, "row": cs.lower_row, "value": cs.lower}
            if cs.screen is not None:
                self.screens[node][c] = cs.screen
        seconds = round(time.monotonic() - t0, 3)  # the same figure in the tree and the log
        tree.record(node, upper, lower, seconds, complete)
        self._log_region(node, open_classes, seconds, complete={str(c): bool(cs.complete) for c, cs in states.items()})
        return {c: _to_continue(cs) for c, cs in states.items() if cs.reason == "time limit"}

    def _start_states(
        self, node: int, classes: list[int], targets: dict[int, float] | None, continued: dict[int, ClassState] | None
    ) -> dict[int, ClassState]:
        """Each class's starting state in `node`'s box: its inherited leak, its screen if the box
        was screened, the state a deadline cut short if continued, and its target level."""
        states = {c: ClassState(cls=c) for c in classes}
        for c, leak in ({} if self.settings.residual else self.inherited_leaks(node)).items():
            if c in states:
                states[c].lower, states[c].lower_row, states[c].lower_witness = leak["value"], leak["row"], leak["x"]
        for c, bound in self.screens.get(node, {}).items():
            if c in states:
                states[c].screen = bound.copy()
        states.update({c: cs for c, cs in (continued or {}).items() if c in states})
        for c, cs in states.items():
            cs.target = (targets or {}).get(c)
        return states

    def _log_region(self, node: int, classes: list[int] | None, seconds: float, **fields: object) -> None:
        tree = self.tree
        lo, hi = tree.box(node)
        parent = tree.parent[node]
        bounds = (
            {}
            if classes is None
            else {
                "upper": {str(c): bound_entry_value(tree.bound_upper[node][c], upper=True) for c in classes},
                "lower": {str(c): bound_entry_value(tree.bound_lower[node][c], upper=False) for c in classes},
            }
        )
        self.log.emit(
            "region",
            None,
            box=node,
            parent=None if parent < 0 else parent,
            depth=tree.depth_of(node),
            box_lower=lo.tolist(),
            box_upper=hi.tolist(),
            seconds=seconds,
            **fields,
            **bounds,
        )

    def nearest_screens(self, node: int) -> dict:
        return nearest_screens(self.tree, node, self.screens)

    def inherited_leaks(self, node: int) -> dict[int, dict]:
        return inherited_leaks(self.tree, node, self.leaks)


def nearest_screens(tree: RegionTree, node: int, screens: dict) -> dict:
    """The per-network screened bounds of `node`'s nearest verified ancestor (the rest of a carve
    is never verified: its children start from the box it inherits). Sound for `node`: an
    ancestor's box holds it."""
    return next((screens[a] for a in tree.ancestors(node) if a in screens), {})


def inherited_leaks(tree: RegionTree, node: int, leaks: dict) -> dict[int, dict]:
    """Per class, the best leak any ancestor found inside `node`'s box: a true lower bound there."""
    lo, hi = tree.box(node)
    best: dict[int, dict] = {}
    for ancestor in tree.ancestors(node):
        for c, leak in leaks.get(ancestor, {}).items():
            x = np.asarray(leak["x"], dtype=np.float64)
            if np.all(x >= lo) and np.all(x <= hi) and (c not in best or leak["value"] > best[c]["value"]):
                best[c] = leak
    return best


def _to_continue(cs: ClassState) -> ClassState:
    """A class state cut short, as a later branch-and-bound of the same box continues it: through its
    checkpoint form, which turns the analyses that were running into ones to redo."""
    again = ClassState.from_json(cs.cls, cs.to_json())
    again.screen, again.refined = cs.screen, cs.refined
    return again
