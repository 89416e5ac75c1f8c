"""Gradient ascent on the joint system of N and one leave-one-out network N': a leak search.

A leak for class c is an input x in the domain with N's confidence C_N^c(x) high while N' does not
pick c (C_{N'}^c(x) < 0). The LP walk of `lucid.witness.replay.climb` moves one linear region at a
time, so from a start far from the best region it stops after its step budget, well below the
network's true beta*_{c,{i}}. Here every start moves at once, in float32 on torch, by projected
Adam on the Lagrangian

    -C_N^c(x) + lambda * max(0, C_{N'}^c(x) + margin)

with one multiplier per start raised by dual ascent while its point violates "N' does not pick c".
Non-smooth (max over rivals, ReLUs), but a subgradient step crosses many regions at once. The best
points found (feasible in float32, highest C_N) are then polished by `climb` and replayed in
float64 (`lucid.witness.replay`), so, as for every other search, nothing here is claimed unless
replay confirms it: the result is a true lower bound, and no upper bound ever depends on it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from lucid.adam import Adam
from lucid.deadline import past
from lucid.network import NetworkStack, confidence
from lucid.witness.replay import LeakQuery, LeakWitness, climb, replay

MARGIN = 1e-4  # asked of N' in float32 (relative to the score scale), well above float32 rounding
# The best gradient points are polished by the LP walk (`climb`) and replayed. The walk is what
# reaches the region's optimum, and the gradient's best point in float32 is often not the one whose
# walk ends highest: on Crypto 2x100's hardest networks 16 walks of 20 steps reached 0.95-1.0 of the
# long exact solve's leak where 4 of 6 reached 0.82-0.93 (benchmarks/results/hard_singletons.md).
POLISH = 16
CLIMB_STEPS = 20


def _scores(weights: list[torch.Tensor], biases: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Per-start networks: weights [n, out, in], x [n, d] -> scores [n, C]."""
    h = x
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = torch.bmm(w, h[:, :, None])[:, :, 0] + b
        if i < last:
            h = torch.relu(h)
    return h


def _confidence(scores: torch.Tensor, cls: int) -> torch.Tensor:
    others = torch.cat([scores[:, :cls], scores[:, cls + 1 :]], dim=1)
    return scores[:, cls] - others.amax(dim=1)  # amax: `max(dim)` also builds indices, many times slower here


def _rivals(stack: NetworkStack, positions: np.ndarray, starts: np.ndarray, cls: int) -> np.ndarray:
    """For each start, the network of S least confident in `cls` there (the likeliest to disagree)."""
    conf = confidence(stack.select(positions).forward(starts, float32=True), cls)  # [|S|, n]
    return positions[np.argmin(conf, axis=0)]


def gradient_points(
    query: LeakQuery, starts: np.ndarray, *, steps: int = 150, seed: int = 0, deadline: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points, their rival network's position, N's float32 confidence there; -inf where the rival
    still picks c), one per start, after `steps` projected Adam steps (fewer once `deadline` has
    passed). Only proposals: replay decides."""
    stack, cls, lower, upper = query.stack, query.cls, query.lower, query.upper
    positions = np.asarray(query.positions, dtype=np.int64)
    starts = np.clip(np.asarray(starts, dtype=np.float64), lower, upper)
    rivals = _rivals(stack, positions, starts, cls)
    n = len(starts)
    f32 = torch.float32
    n_w = [torch.as_tensor(np.array(w[0]), dtype=f32).expand(n, -1, -1) for w in stack.weights]
    n_b = [torch.as_tensor(np.array(b[0]), dtype=f32).expand(n, -1) for b in stack.biases]
    p_w = [torch.as_tensor(np.array(w[rivals]), dtype=f32) for w in stack.weights]
    p_b = [torch.as_tensor(np.array(b[rivals]), dtype=f32) for b in stack.biases]
    lo = torch.as_tensor(lower, dtype=f32)
    hi = torch.as_tensor(upper, dtype=f32)
    width = float(np.mean(np.asarray(upper) - np.asarray(lower))) or 1.0
    gen = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(starts, dtype=f32) + 1e-4 * width * torch.randn(starts.shape, generator=gen)
    x = torch.minimum(torch.maximum(x, lo), hi).requires_grad_(True)
    opt = Adam([x], lr=0.02 * width)
    lam = torch.ones(n)
    best_x = x.detach().clone()
    best_c = torch.full((n,), -torch.inf)
    for step in range(steps + 1):
        s_n, s_p = _scores(n_w, n_b, x), _scores(p_w, p_b, x)
        c_n, c_p = _confidence(s_n, cls), _confidence(s_p, cls)
        scale = 1.0 + s_n.detach().abs().amax(dim=1)
        violation = torch.relu(c_p + MARGIN * scale)
        with torch.no_grad():
            ok = violation == 0
            better = ok & (c_n > best_c)
            best_c = torch.where(better, c_n, best_c)
            best_x[better] = x[better]
            lam = lam * torch.where(ok, 1.0, 1.3)  # dual ascent: a violating start weighs its constraint more
        if step == steps or past(deadline):
            break
        loss = (-c_n + lam * violation).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            x.copy_(torch.minimum(torch.maximum(x, lo), hi))
    return best_x.numpy().astype(np.float64), rivals, best_c.numpy().astype(np.float64)


def gradient_search(
    query: LeakQuery,
    starts: np.ndarray,
    *,
    steps: int = 150,
    polish: int = POLISH,
    climb_steps: int = CLIMB_STEPS,
    seed: int = 0,
    deadline: float | None = None,
) -> LeakWitness | None:
    """The best replayed leak from gradient ascent at `starts` ([n, d]), polished by the LP walk;
    at `deadline` (time.monotonic()) the best found so far."""
    if len(starts) == 0 or len(query.positions) == 0:
        return None
    with torch.enable_grad():
        points, rivals, conf = gradient_points(query, starts, steps=steps, seed=seed, deadline=deadline)
    stack, cls, lower, upper = query.stack, query.cls, query.lower, query.upper
    best: LeakWitness | None = None
    for i in np.argsort(-conf)[:polish]:
        if not np.isfinite(conf[i]) or past(deadline):
            break
        own = np.array([rivals[i]])
        for found in (
            replay(stack, own, points[i], cls, lower, upper),
            climb(replace(query, positions=own), points[i], climb_steps, deadline=deadline),
        ):
            if found is not None and (best is None or found.confidence > best.confidence):
                best = found
    return best
