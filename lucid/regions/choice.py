"""Where `lucid verify --regions K` refines (lucid/verify/regions.py runs the refinement): which leaf
box to cut next, where to cut it, the level each class of a new box must reach, how much of the
run a box gets, and whether a new box is screened first and when its branch-and-bound comes.
These choices only steer the time; every box's bound is proved whatever they pick, so the
guarantee never depends on them (lucid/regions/tree.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.regions import MAX_DEPTH, RegionTree
from lucid.settings import VerifySettings


def noised_mask(
    tree: RegionTree, sample: np.ndarray, sample_class: np.ndarray, sample_conf: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(leaf of each sample point, whether the point is noised under its leaf's bound, or level
    with residual sets: a residual network that disagrees is not counted, it is rare)."""
    leaf = tree.locate(sample)
    return leaf, is_noised(sample_conf, tree.release_bounds()[leaf, sample_class])


def is_noised(confidences: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Whether each point is noised under its bound: its confidence is not above it (a bound
    <= 0 counts as 0)."""
    return ~(confidences > np.maximum(bounds, 0.0))


def choose_leaf(tree: RegionTree, leaf_of: np.ndarray, noised: np.ndarray, max_leaves: int) -> int | None:
    """The leaf with the most noised sample points (`noised_mask`'s output; None: K leaves already,
    or nothing to gain)."""
    if len(tree.leaves()) >= max_leaves:
        return None
    counts = np.bincount(leaf_of[noised], minlength=len(tree))
    candidates = [i for i in tree.leaves() if counts[i] > 1 and tree.depth_of(i) < MAX_DEPTH and _splittable(tree, i)]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (counts[i], -i))


@dataclass(frozen=True)
class Split:
    """How to split a leaf: a carve (`box`, the closed box split off) or an axis cut."""

    box: tuple[np.ndarray, np.ndarray] | None = None
    feature: int = -1
    threshold: float = 0.0


def choose_split(
    tree: RegionTree, node: int, points: np.ndarray, node_leaks: dict[int, dict], room: int
) -> tuple[list[Split], np.ndarray]:
    """How to split `node`, from its noised sample points P (`points`) and its known leaks: the
    splits to make in turn, each of the piece that holds the returned points (P, or the cluster
    of P a carve keeps), which is the new box to verify.

    First a box around P: the smallest box holding P, widened by `TRIM_MARGIN` of the domain's
    width on every side (unseen inputs near P stay in it), tightened on every side where that
    cuts off at least `MIN_TRIM` of the width. Leaks with high confidence usually sit far from the
    data, and in many dimensions most of a box is far from it, so a box hugging P has a far lower
    bound, and only inputs near the noised points gain from a lower bound (the others are released
    under the parent's bound already). When the K leaves allow one per tightened side, the box is
    cut out by axis *trims*, so the pieces cut off are boxes of their own that time left over can
    verify (an unseen input just outside the margin gains from them); otherwise it is carved (one
    leaf), and the rest of the leaf keeps the parent's bound and box.

    When P spans the box, the carve hugs the densest *cluster* of P instead (`_cluster`): a small
    box around data is cheap to verify (the screen alone bounds most networks far below the whole
    domain's bound), while halving a wide box barely lowers its bound. The rest of the leaf holds
    the other noised points and is carved in turn when it is chosen. Without a cluster of two
    points, an axis cut between the two middle points of P, on the feature that leaves most of P
    on a side without a leak (or, without leaks, cuts P most evenly)."""
    lo, hi = tree.box(node)
    domain_width = tree.upper - tree.lower
    witnesses = [np.asarray(w["x"], dtype=np.float64) for w in node_leaks.values()]
    box = _hug(lo, hi, points, domain_width)
    if box is not None and _share(lo, hi, *box) <= HUG_MAX_SHARE:
        trims = _trims(lo, hi, *box, witnesses)
        if len(trims) <= min(room, MAX_DEPTH - tree.depth_of(node)):
            return trims, points
        return [Split(box=box)], points
    cluster = _cluster(points, domain_width)
    if cluster is not None:
        box = _hug(lo, hi, cluster, domain_width)
        if box is not None:
            return [Split(box=box)], cluster
    best, best_score = None, None
    for f in range(len(lo)):
        threshold = _middle_cut(points[:, f], lo[f], hi[f])
        if threshold is None:
            continue
        right = points[:, f] >= threshold
        sides = (int((~right).sum()), int(right.sum()))
        leak_sides = {int(w[f] >= threshold) for w in witnesses}
        clean = sum(n for side, n in enumerate(sides) if side not in leak_sides)
        score = (clean if witnesses else 0, min(sides), hi[f] - lo[f])
        if best_score is None or score > best_score:
            best, best_score = (f, threshold), score
    if best is None:  # every noised point sits at one value: halve the widest side
        f = int(np.argmax(hi - lo))
        best = (f, float(lo[f] + (hi[f] - lo[f]) / 2))
    return [Split(feature=best[0], threshold=best[1])], points


MIN_TRIM = 0.1  # a carve's side must cut off at least this share of the box's width
TRIM_MARGIN = 0.02  # a carve leaves this share of the domain's width beside its points: unseen inputs near them stay in
CLUSTER_RADII = (0.3, 0.2, 0.1, 0.05, 0.4)  # a carved cluster: the points within this share of the domain's
# width (L-inf) of its centre, the first radius that makes one. The widest first: a box around
# data already bounds far below the domain's bound while holding the unseen inputs near the data,
# which a tight box misses (measured in benchmarks/results/regions_findings.md); the narrower ones
# inside it, once its cluster holds all its points; 0.4 last, for points spread over many
# features (8x8 images)
CLUSTER_SEEDS = 256  # centres tried (a seeded subset of P)
HUG_MAX_SHARE = 0.75  # a box around all of P must keep at most this mean share of the widths to be worth a box


def _share(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """The mean share of [lo, hi]'s widths that [a, b] keeps (features of width 0 left out)."""
    wide = hi > lo
    return float(np.mean((b[wide] - a[wide]) / (hi[wide] - lo[wide]))) if wide.any() else 1.0


def _hug(
    lo: np.ndarray, hi: np.ndarray, points: np.ndarray, domain_width: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The box holding `points` with the margin (a share of the domain's width, so that hugging the
    same points again changes nothing), inside [lo, hi], tightened only on the sides where that
    cuts off at least MIN_TRIM of the box's width; None when no side is."""
    width = hi - lo
    a = points.min(axis=0) - TRIM_MARGIN * domain_width
    b = points.max(axis=0) + TRIM_MARGIN * domain_width
    low = (width > 0) & (a - lo >= MIN_TRIM * width)
    high = (width > 0) & (hi - b >= MIN_TRIM * width)
    if not (low.any() or high.any()):
        return None
    return np.where(low, a, lo), np.where(high, b, hi)


def _trims(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray, witnesses: list[np.ndarray]) -> list[Split]:
    """Axis cuts that make [lo, hi] into [a, b], those moving the most known leaks out of it
    first, then those cutting off the largest share of the width."""
    width = np.where(hi > lo, hi - lo, 1.0)
    # x >= a goes right: the box stays right
    keyed = [
        (sum(w[f] < a[f] for w in witnesses), (a[f] - lo[f]) / width[f], int(f), float(a[f]))
        for f in np.flatnonzero(a > lo)
    ]
    # x < b goes left: the points (all below b) stay left
    keyed += [
        (sum(w[f] >= b[f] for w in witnesses), (hi[f] - b[f]) / width[f], int(f), float(b[f]))
        for f in np.flatnonzero(b < hi)
    ]
    return [Split(feature=f, threshold=t) for _, _, f, t in sorted(keyed, reverse=True)]


def _cluster(points: np.ndarray, domain_width: np.ndarray) -> np.ndarray | None:
    """The points within a radius (per feature, a share of the domain's width: `CLUSTER_RADII` in
    turn, until some centre has two points and not all) of the centre that has the most of them;
    None when no radius makes one. Wide radii first: nested carves narrow down where the noised
    points stay noised."""
    scale = np.where(domain_width > 0, domain_width, 1.0)
    z = points / scale
    rng = np.random.default_rng(0)
    seeds = z if len(z) <= CLUSTER_SEEDS else z[rng.choice(len(z), CLUSTER_SEEDS, replace=False)]
    for radius in CLUSTER_RADII:
        best, best_count = None, 1
        for start in range(0, len(seeds), 16):  # [16, |P|, d] at a time
            near = (np.abs(seeds[start : start + 16, None, :] - z[None, :, :]) <= radius).all(axis=2)
            counts = near.sum(axis=1)
            k = int(np.argmax(counts))
            if best_count < counts[k] < len(z):
                best, best_count = near[k], int(counts[k])
        if best is not None:
            return points[best]
    return None


def _middle_cut(values: np.ndarray, lo: float, hi: float) -> float | None:
    """A threshold strictly inside (lo, hi) between the two middle distinct values (None if all equal)."""
    v = np.unique(values)
    if len(v) < 2:
        return None
    m = len(v) // 2
    t = float(v[m - 1] + (v[m] - v[m - 1]) / 2)
    return t if lo < t < hi else None


def box_targets(
    classes_of: np.ndarray, confidences: np.ndarray, classes: list[int], known_lower: np.ndarray
) -> dict[int, float]:
    """Per class, the level a box's verification needs to reach: just below the `TARGET_QUANTILE`
    of its noised public points' confidences (those above a leak already known in the box, which
    no bound can release). Proving a class below a level is far cheaper than its exact bound (the
    same reason as --gap), and releases those points."""
    out = {}
    for c in classes:
        conf = confidences[(classes_of == c) & (confidences > known_lower[c])]
        if len(conf):
            level = float(np.quantile(conf, TARGET_QUANTILE))
            out[c] = level - TARGET_MARGIN * abs(level)
    return out


TARGET_QUANTILE = 0.0  # the lowest: every noised public point above a known leak is released if the level is proved
TARGET_MARGIN = 0.01  # room between the level and the points it is meant to release


def _splittable(tree: RegionTree, node: int) -> bool:
    lo, hi = tree.box(node)
    return bool(np.any(hi - lo > 0))


def share(left: float, total: float, waiting: int) -> float:
    """A box's equal share of the `left` seconds among `waiting` (itself included), but at least
    `MIN_BOX_SHARE` of the run and `MIN_BOX_SECONDS` (`box_time`)."""
    return min(left, max(MIN_BOX_SHARE * total, MIN_BOX_SECONDS, left / max(1, waiting)))


def box_time(left: float, total: float, node: int, waiting: int, to_come: int) -> float:
    """Seconds for the next box's branch-and-bound. The root gets `ROOT_SHARE` of the run (what it
    leaves unused flows on). Every later box gets an equal share of what is left among the
    `waiting` boxes (this one included) and the `to_come` that splits may still make, but at least
    `MIN_BOX_SHARE` of the run and `MIN_BOX_SECONDS`: a box cut short keeps its parent's bound, so
    a box verified to its level is worth more than several barely started, while a small carved
    box usually ends well before its share."""
    if node == 0:
        return left * ROOT_SHARE
    return share(left, total, waiting + to_come)


ROOT_SHARE = 1 / 3  # of the run, for the domain's own bound (a smaller box is far cheaper to bound)
MIN_BOX_SHARE = 1 / 64
MIN_BOX_SECONDS = 5.0  # whatever the run's length: a box's screen and first analyses take seconds


DEEPEN_AT_ONCE = 64  # a screened box with at most this many networks above its level is deepened at once


def screen_first(tree: RegionTree, classes: list[int], settings: VerifySettings) -> bool:
    """Whether new boxes get their screen first. Not when the root's branch-and-bound finished
    every class within its share: a box is smaller than the domain, so its exact bound is cheaper
    still, and an exact bound per box before it is split leaves fewer points for the splits to
    chase than the screen's looser one (breast cancer: regions_findings.md)."""
    return settings.screen != "none" and not bool(tree.complete[0][classes].all())


def cheap_to_deepen(
    tree: RegionTree,
    node: int,
    screened: dict[int, np.ndarray],
    classes_of: np.ndarray,
    confidences: np.ndarray,
    residual: int = 0,
) -> bool:
    """Whether the branch-and-bound of a just screened box should come now rather than after the
    splits: some of its public points (`classes_of`, `confidences`: those noised before the
    screen) are still noised, and at most `DEEPEN_AT_ONCE` networks are screened above the level
    that would release them. Each of those needs the refined screen or a MILP: a few take
    seconds, while splitting on the screen's looser bound would carve boxes around points that
    the box's own exact bound releases. With residual sets of `residual` networks, those are
    checked at query time and need no proof."""
    still = is_noised(confidences, tree.release_bounds()[node][classes_of])
    levels = box_targets(classes_of[still], confidences[still], sorted(screened), tree.bound_lower[node])
    if not levels:
        return False
    return sum(max(0, int((screened[c] > level).sum()) - residual) for c, level in levels.items()) <= DEEPEN_AT_ONCE


def box_owner(tree: RegionTree, leaf: int) -> int:
    """The node whose box `leaf` is verified over: the leaf, or for the rest of a carve (which keeps
    its parent's box) the nearest ancestor that is not such a rest."""
    while tree.inherits_box(leaf):
        leaf = tree.parent[leaf]
    return leaf


def box_to_continue(
    tree: RegionTree, leaf_of: np.ndarray, noised: np.ndarray, sample_class: np.ndarray, unfinished: dict[int, set[int]]
) -> tuple[int, list[int], int] | None:
    """Once no split is left to make and no box with noised public points waits for its first
    branch-and-bound: (the box whose cut-short branch-and-bound, continued, could release the most
    noised public points, its classes to continue, how many boxes could be continued), or None.
    A leaf's points count for the box it is verified over (`box_owner`): the root, for the rests of
    carves cut from the domain, which a small K leaves with most of the points. `unfinished`: per
    box, the classes a time limit cut short (whose branch-and-bound state is kept)."""
    weight: dict[int, int] = {}
    classes: dict[int, set[int]] = {}
    owners = {leaf: box_owner(tree, leaf) for leaf in np.unique(leaf_of[noised]).tolist()}
    for leaf, c in zip(leaf_of[noised].tolist(), sample_class[noised].tolist(), strict=True):
        box = owners[leaf]
        if c in unfinished.get(box, ()):
            weight[box] = weight.get(box, 0) + 1
            classes.setdefault(box, set()).add(c)
    if not weight:
        return None
    box = max(weight, key=lambda b: (weight[b], -b))
    return box, sorted(classes[box]), len(weight)
