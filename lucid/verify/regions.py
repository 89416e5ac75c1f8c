"""The strategy of `lucid verify --regions K`: per-class bounds for up to K boxes of the domain.

The domain is verified first, as without regions. Then, while the deadline and K allow, the
leaf box that noises the most *public* probability mass is split in two and both halves are
verified by the same branch-and-bound, restricted to their box: N's bounds, the screen, the
splitting tier, the MILPs and the witness search all see the smaller box. A child starts from
what its parent proved (lucid/regions/one_box.py).

What "mass" means here: a sample of the domain that is public — a file of public inputs
(`--public-inputs`, in the data's units) or, without one, uniform samples of the domain. A sample
point x counts as noised in its leaf when N's confidence at x is <= the leaf's bound for N's
class at x. The training rows are never used to choose boxes. Whatever chooses them, the
guarantee holds (lucid/regions/__init__.py).

Screen first (unless the root's branch-and-bound finished every class): a box below the root
first gets only the screen (every network's bound over the box, seconds for thousands of
networks), which bounds most boxes around data far below their parent. The whole
branch-and-bound deepens a screened box only when no split is left to make (K leaves, or no leaf
worth splitting), the boxes with the most noised public points first: a cheap bound on many boxes
releases more than a tight bound on few.

With `--residual M` every box keeps its own residual sets and levels (lucid/regions/one_box.py),
and a public point counts as noised when its confidence is not above its leaf's level.

Anytime: a box that is not verified yet (or was cut short) keeps its parent's bound. The tree,
its bounds and the best leaks are checkpointed after every box, so `--resume` continues from the
last finished box; the log gets one `region` event per box.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid.bab.state import ClassState
from lucid.deadline import Deadline
from lucid.errors import LucidError
from lucid.network import confidence
from lucid.regions.choice import (
    box_owner,
    box_targets,
    box_time,
    box_to_continue,
    cheap_to_deepen,
    choose_leaf,
    choose_split,
    noised_mask,
    screen_first,
    share,
)
from lucid.regions.one_box import EXACT_TOLERANCE, BoxVerifier
from lucid.regions.reader import read_regions
from lucid.regions.tree import RegionTree
from lucid.rundir import Run, bound_entry, read_public_inputs
from lucid.settings import VerifySettings
from lucid.verify.lifecycle import Checkpoint, ResidualSets, VerificationRun, Verified

UNIFORM_SAMPLES = 4096  # public sample of the domain when no --public-inputs file is given


@dataclass
class _Look:
    """Where the public sample stands before the next piece of work."""

    leaf_of: np.ndarray  # each sample point's leaf
    noised: np.ndarray  # whether its leaf's bound noises it
    leaf: int | None  # the leaf to split next (None: no split left to make)
    unverified: list[int]  # leaves not verified yet (but the rests of carves)
    todo: list[int]  # ... of those, the ones with noised points
    deepen: list[int]  # screened leaves with noised points, the most first


class RegionRefinement:
    """The strategy (module docstring): one piece of work per step until the deadline or K."""

    def __init__(self) -> None:
        self.boxes: BoxVerifier | None = None

    def prepare(self, run: VerificationRun, saved: dict | None) -> dict[str, Any]:
        lower, upper = run.run.domain
        self.run, self.deadline = run, run.deadline
        tree: RegionTree | None = None
        self.leaks: dict[int, dict[int, dict]] = {}
        self.screened: set[int] = set()  # leaves with only their screen so far
        if saved is not None:
            try:
                tree = read_regions(saved["regions"], lower, upper, run.run.num_classes, str(run.checkpoint_path))
                self.leaks = {int(k): {int(c): w for c, w in v.items()} for k, v in saved["leaks"].items()}
                self.screened = {int(i) for i in saved.get("screened", [])}
            except (KeyError, TypeError, ValueError, AttributeError):
                raise LucidError(
                    f"checkpoint {run.checkpoint_path} is not a --regions checkpoint; delete it and "
                    "run without --resume"
                ) from None
        self.sample = public_sample(run.run, run.settings)
        self.root = root = run.load_problem()
        self.tree = RegionTree(root.lower, root.upper, run.run.num_classes) if tree is None else tree
        self.settings = settings = run.with_default_workers()
        scores = root.stack.select(slice(0, 1)).forward(self.sample)[0]
        self.sample_class, self.sample_conf = scores.argmax(axis=1), confidence(scores)
        self.kept: dict[int, dict[int, ClassState]] = {}  # node -> class -> its branch-and-bound, cut short
        return {"workers": settings.workers, "networks": len(root.stack) - 1, "regions": settings.regions}

    def step(self) -> bool:
        if self.boxes is None:  # the log is open now: the boxes' verifier writes to it
            self.boxes = BoxVerifier(self.tree, self.root, self.settings, self.run.event_log(), self.leaks)
        return self._step()

    def checkpoint(self) -> Checkpoint | None:
        # every finished box is kept; resume continues from there
        return Checkpoint(
            {},
            extra={
                "regions": self.tree.to_json(),
                "screened": sorted(self.screened),
                "leaks": {str(k): {str(c): w for c, w in v.items()} for k, v in self.leaks.items()},
            },
        )

    def close(self) -> None:
        if self.boxes is not None:
            self.boxes.close()

    def result(self) -> Verified:
        run, settings = self.run, self.settings
        residual = None
        if settings.residual:  # the domain's sets, and the file holding every leaf's networks too
            sets = {c: r for c, r in self.tree.residual[0].items() if c in run.classes}
            residual = ResidualSets(sets, int(settings.residual), self.tree.residual_sets())
        return Verified(
            _bounds_entries(self.tree, run.classes, self.leaks, run.elapsed()),
            regions=self.tree.to_json(),
            finished={"regions": len(self.tree.leaves())},
            residual=residual,
        )

    def _look(self) -> _Look:
        tree = self.tree
        self.screened &= set(tree.leaves())
        # (the rest of a carved box is verified over its parent's box: never again)
        unverified = [i for i in tree.leaves() if not tree.verified[i] and not tree.inherits_box(i)]
        leaf_of, noised = noised_mask(tree, self.sample, self.sample_class, self.sample_conf)
        counts = np.bincount(leaf_of[noised], minlength=len(tree))
        return _Look(
            leaf_of,
            noised,
            choose_leaf(tree, leaf_of, noised, self.settings.regions),
            unverified,
            [i for i in unverified if counts[i]],
            sorted((i for i in self.screened if counts[i]), key=lambda i: -counts[i]),
        )

    def _step(self) -> bool:
        """One piece of work: a split, a box's screen or its branch-and-bound. Boxes with noised
        public mass first; then splits; then the branch-and-bound of the screened boxes, most
        noised first; boxes without noised mass only when nothing else is left. False: done."""
        if self.deadline.past():
            return False
        look = self._look()
        if not look.todo and look.leaf is not None:
            self._split(look)
            return True
        if not look.todo and not look.deepen:
            if self._continue_cut_short(look):
                return True
            look.todo, look.deepen = look.unverified, sorted(self.screened)
            if not look.todo and not look.deepen:
                return False
        node = look.todo[0] if look.todo else look.deepen[0]
        here = (look.leaf_of == node) & look.noised
        # the root is verified as without --regions (every class: unseen inputs may have any class)
        classes = self.run.classes
        noised_here = set(self.sample_class[here].tolist())
        box_classes = classes if node == 0 else [c for c in classes if c in noised_here] or classes
        if look.todo and node != 0 and screen_first(self.tree, classes, self.settings):
            self.boxes.screen(node, box_classes)
            self.screened.add(node)
            if not cheap_to_deepen(
                self.tree,
                node,
                self.boxes.screens[node],
                self.sample_class[here],
                self.sample_conf[here],
                self.settings.residual,
            ):
                return True
            self.run.save_checkpoint()
            look.todo = []  # the screen left few networks to prove: its branch-and-bound now
            if self.deadline.past():  # the screen took the rest: the box stays screened
                return False
        waiting = len(look.unverified) + len(look.deepen) if look.todo else len(look.deepen)
        to_come = max(0, self.settings.regions - len(self.tree.leaves())) if look.leaf is not None else 0
        seconds = _limited(box_time, self.deadline, node, waiting, to_come)
        # A level only where the exact bound proved too dear: in a box whose parent's
        # verification of the class was cut short (a level stops a box that could go exact).
        parent = self.tree.parent[node]
        hard = [c for c in box_classes if parent >= 0 and not self.tree.complete[parent][c]]
        targets = box_targets(self.sample_class[here], self.sample_conf[here], hard, self.tree.bound_lower[node])
        self.kept[node] = self.boxes.verify(node, box_classes, Deadline(seconds), targets)
        self.screened.discard(node)
        return True

    def _split(self, look: _Look) -> None:
        """Split the leaf around its noised public points (lucid/regions/choice.py)."""
        tree, leaf, made = self.tree, look.leaf, len(self.tree)
        points = self.sample[(look.leaf_of == leaf) & look.noised]
        splits, kept = choose_split(
            tree, leaf, points, self.leaks.get(leaf, {}), room=self.settings.regions - len(tree.leaves())
        )
        at = leaf
        for split in splits:
            if split.box is not None:
                children = tree.carve(at, *split.box)
                self.boxes.log.emit(
                    "region_split",
                    None,
                    box=at,
                    lower=split.box[0].tolist(),
                    upper=split.box[1].tolist(),
                    children=list(children),
                )
            else:
                children = tree.split(at, split.feature, split.threshold)
                self.boxes.log.emit(
                    "region_split",
                    None,
                    box=at,
                    feature=split.feature,
                    threshold=split.threshold,
                    children=list(children),
                )
            at = int(tree.locate(kept[:1])[0])  # the next split is of the piece that holds `kept`
        if leaf in self.screened:  # the rest of a carve of a screened box keeps the box: deepen it later
            for rest in (i for i in range(made, len(tree)) if tree.inherits_box(i)):
                self.screened.add(rest)
                if tree.parent[rest] in self.boxes.screens:
                    self.boxes.screens[rest] = self.boxes.screens[tree.parent[rest]]

    def _continue_cut_short(self, look: _Look) -> bool:
        """Continue the cut-short box that could release the most noised public points (the root,
        at small K), where it stopped; False if there is none."""
        tree = self.tree
        again = box_to_continue(
            tree, look.leaf_of, look.noised, self.sample_class, {box: set(states) for box, states in self.kept.items()}
        )
        if again is None:
            return False
        node, box_classes, boxes = again
        here = np.isin(look.leaf_of, [i for i in tree.leaves() if box_owner(tree, i) == node]) & look.noised
        targets = box_targets(self.sample_class[here], self.sample_conf[here], box_classes, tree.bound_lower[node])
        seconds = _limited(share, self.deadline, boxes)
        self.kept[node] = self.boxes.verify(
            node, box_classes, Deadline(seconds), targets, continued=self.kept.pop(node)
        )
        return True


def _limited(rule, deadline: Deadline, *args: int) -> float | None:
    """A box's seconds by `rule` (choice.box_time / choice.share) from what the run's deadline has
    left (None without one)."""
    left = deadline.left()
    return None if left is None else rule(left, deadline.seconds, *args)


def public_sample(run: Run, settings: VerifySettings) -> np.ndarray:
    """The public points that weigh the boxes (network space, inside the domain)."""
    lower, upper = run.domain
    if settings.public_inputs is None:
        rng = np.random.default_rng(settings.seed)
        return lower + (upper - lower) * rng.random((UNIFORM_SAMPLES, len(lower)))
    return read_public_inputs(run, settings.public_inputs)


def _leaves_exact(tree: RegionTree, c: int) -> bool:
    """Every leaf's bound met a leak in that leaf (up to the safety margins): no leaf stopped at a
    target level or a --gap."""
    return all(_leaf_exact(tree.bound_upper[i][c], tree.bound_lower[i][c]) for i in tree.leaves())


def _leaf_exact(upper: float, lower: float) -> bool:
    """No leak possible (upper = -inf), or a leak found within the tolerance of the upper bound. A finite
    upper bound with no leak found (lower = -inf) is not exact: without the finite check, inf <= 1e-6 * inf."""
    if upper == -np.inf:
        return True
    return bool(np.isfinite(lower) and upper - lower <= EXACT_TOLERANCE * max(1.0, abs(lower)))


def _bounds_entries(tree: RegionTree, classes: list[int], leaks: dict, seconds: float) -> dict[str, dict]:
    """bounds.json's per-class entries: the domain's bound as the leaves prove it."""
    upper = tree.leaf_upper()
    lower = tree.best_lower()
    complete = tree.leaves_complete()
    out = {}
    for c in classes:
        row = None
        for node_leaks in leaks.values():
            leak = node_leaks.get(c)
            if leak is not None and leak["value"] == lower[c]:
                row = leak["row"]
        # complete: every leaf's verification of the class finished (exact, or down to its target level)
        done = bool(complete[c])
        out[str(c)] = bound_entry(
            upper[c],
            lower[c],
            complete=done,
            exact=done and _leaves_exact(tree, c),
            seconds=seconds,
            nodes=len(tree),
            reason="regions",
            leaking_row=row,
        )
    return out
