"""Solver-free searches for leaking inputs: true lower bounds on beta_c once replayed.

`search_class_witness` (once per class at the start, and aimed at a small node's networks when its
MILP ended without a witness) and `search_node_witness` (from points on N's decision boundary, per
node) only propose points; `lucid.witness.replay` decides what counts.

Every leaking input x (some network N' of S strictly disagrees with class c at x while N's
confidence there is C_N^c(x)) proves beta_c >= C_N^c(x). MILP witnesses come late (a large
hyper-network's MILP often ends at its time limit without an incumbent), so the engine also runs
this search once per class at the start: evaluate every network at many candidate inputs (the
training points and seeded uniform samples of the domain) at once, keep the leaking points where N
is most confident, and climb from each with lucid.witness.replay.repair — an LP over the linear regions of
N and the disagreeing N' at the point — across neighbouring regions (lucid.witness.replay.climb). Both
searches end with gradient ascent on the joint system of N and a disagreeing network from many starts
at once (`lucid.witness.gradient`), which crosses many regions per step. Every result is checked by
lucid.witness.replay.replay (float64, strict disagreement), exactly like a MILP witness, so it is a true
lower bound; nothing here can make an upper bound smaller.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lucid.deadline import paced, past
from lucid.network import NetworkStack, confidence
from lucid.witness.gradient import CLIMB_STEPS, POLISH, gradient_search
from lucid.witness.replay import LeakQuery, LeakWitness, climb, replay

GRADIENT_STARTS = 64  # starts of the class search's gradient ascent (`lucid.witness.gradient`)
SMALL_NODE = 8  # networks


@dataclass(frozen=True)
class SearchEffort:
    """How hard a search tries: `samples` random inputs of the domain, LP walks (`climb`) of up to
    `steps` regions from its `starts` most promising points, the random `seed`, and whether
    gradient ascent (`lucid.witness.gradient`) follows the walks."""

    samples: int
    starts: int
    steps: int
    seed: int = 0
    gradient: bool = True


CLASS_SEARCH = SearchEffort(samples=512, starts=6, steps=6)  # `search_class_witness`'s, once per class
TARGETED_SEARCH = SearchEffort(samples=1024, starts=8, steps=10)  # the same, aimed at a small node's networks
NODE_SEARCH = SearchEffort(samples=4096, starts=8, steps=20)  # `search_node_witness`'s


def _min_confidence(
    stack, positions: np.ndarray, x: np.ndarray, cls: int, chunk: int = 512, deadline: float | None = None
) -> np.ndarray:
    """For each input: the smallest confidence in `cls` over the networks at `positions` (over
    those reached by `deadline`, a time.monotonic() value).

    Only ranks candidate points (float32); every point used is replayed in float64 afterwards."""
    best = np.full(len(x), np.inf)
    for part in paced(len(positions), chunk, deadline):
        scores = stack.select(positions[part]).forward(x, float32=True)
        best = np.minimum(best, confidence(scores, cls).min(axis=0))
    return best


def search_class_witness(
    problem,
    cls: int,
    positions: np.ndarray,
    *,
    points: np.ndarray | None = None,
    effort: SearchEffort = CLASS_SEARCH,
    deadline: float | None = None,
) -> LeakWitness | None:
    """The best replayed leaking input found for class `cls` and the networks at `positions`, from
    random samples and the training `points` (`effort.gradient=False`: without the gradient ascent,
    for benchmarks/hard_singletons.py). At `deadline` (time.monotonic()) it returns the best found
    so far: the run's time limit bounds it too."""
    stack, lo, hi = problem.stack, problem.lower, problem.upper
    positions = np.asarray(positions, dtype=np.int64)
    query = LeakQuery(stack, positions, cls, lo, hi)
    samples, starts, seed = effort.samples, effort.starts, effort.seed
    rng = np.random.default_rng(seed)
    cands = [lo + (hi - lo) * rng.random((samples, len(lo)))]
    if points is not None and len(points):
        points = np.asarray(points, dtype=np.float64)
        if len(points) > samples:
            points = points[rng.choice(len(points), samples, replace=False)]
        cands.append(np.clip(points, lo, hi))
    x = np.concatenate(cands)
    conf_n = confidence(stack.select([0]).forward(x)[0], cls)
    worst = _min_confidence(stack, positions, x, cls, deadline=deadline)
    scale = 1.0 + np.abs(conf_n)
    leaking = worst < -1e-5 * scale  # float32 ranking: a clear disagreement, confirmed by replay
    order = np.argsort(-np.where(leaking, conf_n, -np.inf))
    # Start from the most confident leaking points; if none leaks, from N's most confident points
    # (the repair LP may still find a disagreeing network next to them).
    chosen = [i for i in order[:starts] if leaking[i]] or list(np.argsort(-conf_n)[:starts])
    best: LeakWitness | None = None
    for i in chosen:
        if past(deadline):
            return best
        w = replay(stack, positions, x[i], cls, lo, hi)
        climbed = climb(query, x[i], effort.steps, deadline=deadline)
        if w is None or (climbed is not None and climbed.confidence > w.confidence):
            w = climbed
        if w is not None and (best is None or w.confidence > best.confidence):
            best = w
    # gradient ascent from the best-ranked points (leaking or not): it crosses many linear regions
    # per step, where the LP walk above crosses one
    if not effort.gradient or past(deadline):
        return best
    top = order[:GRADIENT_STARTS] if leaking.any() else np.argsort(-conf_n)[:GRADIENT_STARTS]
    return _better(best, gradient_search(query, x[top], seed=seed, deadline=deadline))


def search_node_witness(
    query: LeakQuery, effort: SearchEffort = NODE_SEARCH, deadline: float | None = None
) -> LeakWitness | None:
    """A solver-free primal heuristic for a leaking input (a true lower bound once replayed); at
    `deadline` (time.monotonic()) the best found so far.

    Leaks live where N and a network of S disagree, i.e. near N's decision boundary: random
    pairs of points that N labels c and not-c are bisected onto the boundary, the networks of S
    are evaluated there all at once, and the most promising starts are improved by the
    pattern-fixed LP of `repair`, re-linearised at each new point (a walk across linear
    regions). Every returned witness has passed `replay`.
    """
    query = replace(query, positions=np.asarray(query.positions, dtype=np.int64))
    stack, positions, cls = query.stack, query.positions, query.cls
    starts, seed = effort.starts, effort.seed
    a = boundary_points(stack, cls, query.lower, query.upper, 32 * starts, samples=effort.samples, seed=seed)
    if len(a) == 0 or past(deadline):
        return None
    # the networks' float64 confidences at once, or under a deadline a chunk at a time
    least = np.full(len(a), np.inf)
    for part in paced(len(positions), len(positions) if deadline is None else 512, deadline):
        least = np.minimum(least, confidence(stack.select(positions[part]).forward(a), cls).min(axis=0))
    order = np.argsort(least)[:starts]
    best: LeakWitness | None = None
    for i in order:
        if past(deadline):
            return best
        found = climb(query, a[i], effort.steps, deadline=deadline)
        if found is not None and (best is None or found.confidence > best.confidence):
            best = found
    # a small node (a retried singleton) gets the full polish; a large one, whose search only has to
    # beat the class's best leak somewhere, a light one
    if not effort.gradient or past(deadline):
        return best
    polish, climb_steps = (POLISH, CLIMB_STEPS) if len(positions) <= SMALL_NODE else (4, 6)
    return _better(
        best, gradient_search(query, a, polish=polish, climb_steps=climb_steps, seed=seed, deadline=deadline)
    )


def boundary_points(
    stack: NetworkStack,
    cls: int,
    lower: np.ndarray,
    upper: np.ndarray,
    count: int,
    *,
    samples: int = 4096,
    seed: int = 0,
) -> np.ndarray:
    """Up to `count` points on N's decision boundary for `cls` (its side of it): uniform samples
    that N labels c and not-c, paired and bisected onto C_N = 0, vectorised over all pairs. Leaks
    of a network close to N lie near this boundary. Empty when N labels every sample alike."""
    rng = np.random.default_rng(seed)
    x = lower + (upper - lower) * rng.random((samples, len(lower)))
    zero = np.array([0])
    conf_n = confidence(stack.select(zero).forward(x)[0], cls)
    inside, outside = x[conf_n > 0], x[conf_n <= 0]
    m = min(len(inside), len(outside), count)
    a, b = inside[:m].copy(), outside[:m].copy()
    for _ in range(30):
        mid = (a + b) / 2
        pos = confidence(stack.select(zero).forward(mid)[0], cls) > 0
        a[pos], b[~pos] = mid[pos], mid[~pos]
    return a


def _better(a: LeakWitness | None, b: LeakWitness | None) -> LeakWitness | None:
    if a is None or (b is not None and b.confidence > a.confidence):
        return b
    return a
