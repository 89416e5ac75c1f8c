"""Where `lucid verify --regions K` refines (lucid/bab/regions.py runs the refinement): which leaf
box to cut next, where to cut it, the level each class of a new box must reach and how much of the
run a box gets. These choices only steer the time; every box's bound is proved whatever they
pick, so the guarantee never depends on them (lucid/regions.py).
"""

from __future__ import annotations

import numpy as np

from lucid.regions import MAX_DEPTH, RegionTree


def noised_mask(tree: RegionTree, sample: np.ndarray, sample_class: np.ndarray,
                sample_conf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(leaf of each sample point, whether the point is noised under its leaf's bound)."""
    leaf = tree.locate(sample)
    bounds = np.array(tree.bound_upper)[leaf, sample_class]
    return leaf, ~(sample_conf > np.maximum(bounds, 0.0))


def choose_leaf(tree: RegionTree, leaf_of: np.ndarray, noised: np.ndarray, max_leaves: int) -> int | None:
    """The leaf with the most noised sample points (`noised_mask`'s output; None: K leaves already,
    or nothing to gain)."""
    if len(tree.leaves()) >= max_leaves:
        return None
    counts = np.bincount(leaf_of[noised], minlength=len(tree))
    candidates = [i for i in tree.leaves() if counts[i] > 1 and tree.depth_of(i) < MAX_DEPTH
                  and _splittable(tree, i)]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (counts[i], -i))


def choose_cuts(tree: RegionTree, node: int, points: np.ndarray, node_leaks: dict[int, dict],
                room: int) -> tuple[list[tuple[int, float]], np.ndarray]:
    """Where to cut `node`'s box, from its noised sample points P (`points`) and its known leaks:
    (feature, threshold) cuts to make in turn, each on the piece that holds the returned points
    (P, or the cluster of P a carve keeps).

    A *trim* cuts just outside P's range (widened by `TRIM_MARGIN` of the box's width) on one
    feature: one piece holds all of P in a narrower box, the other holds no noised public mass and
    keeps the parent's bound (it is verified only when time is left over). Only inputs near the
    noised points gain from a lower bound (the others are released under the parent's bound
    already, in whichever piece), so the box hugs P, not all the sample points in it. Leaks with
    high confidence usually sit far from the data, and in many dimensions most of a box is far
    from the data, so the box is trimmed on *every* feature where that removes at least `MIN_TRIM`
    of its width (up to `room` cuts, those moving the most leaks away from P and removing the most
    width first): it is then verified once, not once per feature.

    When P spans the box, a *carve* trims the same way around a cluster of P instead (`_cluster`):
    a small box around data is cheap to verify (the screen alone bounds most networks far below
    the whole domain's bound), while halving a wide box barely lowers its bound. The pieces cut
    off hold the rest of P; they keep the parent's bound and are carved in turn when chosen. A box
    with no cluster to carve is cut between the two middle points of P on the feature that leaves
    most of P on a side without a leak (or, without leaks, cuts P most evenly)."""
    lo, hi = tree.box(node)
    witnesses = [np.asarray(w["x"], dtype=np.float64) for w in node_leaks.values()]
    room = max(1, min(room, MAX_DEPTH - tree.depth_of(node)))
    trims = _trims(lo, hi, points, witnesses)
    kept = points
    if not trims:
        cluster = _cluster(points, tree.upper - tree.lower)
        if cluster is not None:
            trims, kept = _trims(lo, hi, cluster, witnesses), cluster
    if trims:
        return [(f, t) for _, _, f, t in sorted(trims, reverse=True)[:room]], kept
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
    return [best], points


MIN_TRIM = 0.1  # a trim must cut off at least this share of the box's width on its feature
TRIM_MARGIN = 0.02  # a trim leaves this share of the width beside P: unseen inputs near P stay in its box
CLUSTER_RADIUS = 0.1  # a carved cluster: the points within this share of the domain's width (L-inf) of its centre
CLUSTER_SEEDS = 256  # centres tried (a seeded subset of P)


def _trims(lo: np.ndarray, hi: np.ndarray, points: np.ndarray, witnesses: list[np.ndarray]) -> list[tuple]:
    """(leaks moved away, share of the width removed, feature, threshold) of each worthwhile trim."""
    trims = []
    for f in np.flatnonzero(hi - lo > 0):
        width = hi[f] - lo[f]
        a = float(points[:, f].min()) - TRIM_MARGIN * width
        b = float(np.nextafter(points[:, f].max() + TRIM_MARGIN * width, np.inf))
        if lo[f] < a and (a - lo[f]) / width >= MIN_TRIM:  # x >= a goes right: the points stay right
            trims.append((sum(w[f] < a for w in witnesses), (a - lo[f]) / width, int(f), a))
        if b < hi[f] and (hi[f] - b) / width >= MIN_TRIM:  # x < b goes left: the points stay left
            trims.append((sum(w[f] >= b for w in witnesses), (hi[f] - b) / width, int(f), b))
    return trims


def _cluster(points: np.ndarray, domain_width: np.ndarray) -> np.ndarray | None:
    """The points within `CLUSTER_RADIUS` (per feature, as a share of the domain's width) of the
    centre that has the most of them; None when no centre has two."""
    scale = np.where(domain_width > 0, domain_width, 1.0)
    z = points / scale
    rng = np.random.default_rng(0)
    seeds = z if len(z) <= CLUSTER_SEEDS else z[rng.choice(len(z), CLUSTER_SEEDS, replace=False)]
    best, best_count = None, 1
    for start in range(0, len(seeds), 16):  # [16, |P|, d] at a time
        near = (np.abs(seeds[start:start + 16, None, :] - z[None, :, :]) <= CLUSTER_RADIUS).all(axis=2)
        counts = near.sum(axis=1)
        k = int(np.argmax(counts))
        if counts[k] > best_count:
            best, best_count = near[k], int(counts[k])
    return None if best is None else points[best]


def _middle_cut(values: np.ndarray, lo: float, hi: float) -> float | None:
    """A threshold strictly inside (lo, hi) between the two middle distinct values (None if all equal)."""
    v = np.unique(values)
    if len(v) < 2:
        return None
    m = len(v) // 2
    t = float(v[m - 1] + (v[m] - v[m - 1]) / 2)
    return t if lo < t < hi else None


def box_targets(classes_of: np.ndarray, confidences: np.ndarray, classes: list[int],
                known_lower: np.ndarray) -> dict[int, float]:
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


def box_time(left: float, total: float, tree: RegionTree, max_leaves: int, node: int) -> float:
    """Seconds for the next box. The root gets half the run (what it leaves unused flows on).
    Every later box gets an equal share of what is left among the boxes with noised mass that may
    still come (a split makes one such box; a trim's other half has none), but at least
    `MIN_BOX_SHARE` of the run: a box cut short keeps its parent's bound, so a few boxes verified
    to the end are worth more than many barely started (a larger K then refines further only
    when the earlier boxes finish early)."""
    if node == 0:
        return left / 2
    waiting = sum(1 for i in tree.leaves() if not tree.verified[i])
    to_come = max(0, max_leaves - len(tree.leaves()))
    return min(left, max(MIN_BOX_SHARE * total, left / max(1, waiting + to_come)))


MIN_BOX_SHARE = 1 / 32
