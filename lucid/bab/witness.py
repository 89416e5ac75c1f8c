"""A primal heuristic for the anytime lower bound: search for leaking inputs without a MILP.

Every leaking input x (some network N' of S strictly disagrees with class c at x while N's
confidence there is C_N^c(x)) proves beta_c >= C_N^c(x). MILP witnesses come late (a large
hyper-network's MILP often ends at its time limit without an incumbent), so the engine also runs
this search once per class at the start: evaluate every network at many candidate inputs (the
training points and seeded uniform samples of the domain) at once, keep the leaking points where N
is most confident, and climb from each with lucid.replay.repair — an LP over the linear regions of
N and the disagreeing N' at the point — across neighbouring regions (lucid.replay.climb). Every result is checked by
lucid.replay.replay (float64, strict disagreement), exactly like a MILP witness, so it is a true
lower bound; nothing here can make an upper bound smaller.
"""

from __future__ import annotations

import numpy as np

from lucid.network import confidence
from lucid.replay import LeakWitness, climb, replay


def _min_confidence(stack, positions: np.ndarray, x: np.ndarray, cls: int, chunk: int = 512) -> np.ndarray:
    """For each input: the smallest confidence in `cls` over the networks at `positions`.

    Only ranks candidate points (float32, torch batched matmul: numpy's stacked matmul is ~20x
    slower here); every point used is replayed in float64 afterwards."""
    import torch

    xt = torch.as_tensor(x, dtype=torch.float32)
    best = torch.full((len(x),), float("inf"))
    last = len(stack.weights) - 1
    with torch.no_grad():
        for start in range(0, len(positions), chunk):
            pos = positions[start : start + chunk]
            h = xt.expand(len(pos), *xt.shape)
            for i, (w, b) in enumerate(zip(stack.weights, stack.biases)):
                wt = torch.as_tensor(w[pos], dtype=torch.float32)
                bt = torch.as_tensor(b[pos], dtype=torch.float32)
                h = torch.baddbmm(bt[:, None, :], h, wt.transpose(1, 2))
                if i < last:
                    h = torch.relu(h)
            own = h[..., cls]
            others = h.clone()
            others[..., cls] = -float("inf")
            conf = own - others.max(dim=-1).values  # [k, B]
            best = torch.minimum(best, conf.min(dim=0).values)
    return best.numpy().astype(np.float64)


def search_class_witness(
    problem,
    cls: int,
    positions: np.ndarray,
    *,
    points: np.ndarray | None = None,
    samples: int = 512,
    starts: int = 6,
    steps: int = 6,
    seed: int = 0,
) -> LeakWitness | None:
    """The best replayed leaking input found for class `cls` and the networks at `positions`."""
    stack, lo, hi = problem.stack, problem.lower, problem.upper
    positions = np.asarray(positions, dtype=np.int64)
    rng = np.random.default_rng(seed)
    cands = [lo + (hi - lo) * rng.random((samples, len(lo)))]
    if points is not None and len(points):
        points = np.asarray(points, dtype=np.float64)
        if len(points) > samples:
            points = points[rng.choice(len(points), samples, replace=False)]
        cands.append(np.clip(points, lo, hi))
    x = np.concatenate(cands)
    conf_n = confidence(stack.select([0]).forward(x)[0], cls)
    worst = _min_confidence(stack, positions, x, cls)
    scale = 1.0 + np.abs(conf_n)
    leaking = worst < -1e-5 * scale  # float32 ranking: a clear disagreement, confirmed by replay
    order = np.argsort(-np.where(leaking, conf_n, -np.inf))
    # Start from the most confident leaking points; if none leaks, from N's most confident points
    # (the repair LP may still find a disagreeing network next to them).
    chosen = [i for i in order[:starts] if leaking[i]] or list(np.argsort(-conf_n)[:starts])
    best: LeakWitness | None = None
    for i in chosen:
        w = replay(stack, positions, x[i], cls, lo, hi)
        climbed = climb(stack, positions, x[i], cls, lo, hi, steps)
        if w is None or (climbed is not None and climbed.confidence > w.confidence):
            w = climbed
        if w is not None and (best is None or w.confidence > best.confidence):
            best = w
    return best
