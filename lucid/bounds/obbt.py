"""Node-specific bound tightening (OBBT) over the LP relaxation of the node's own Eq. 3 model.

Every neuron bound of N, of N# and of their difference is re-optimised over the triangle
relaxation of the whole node problem: the output constraints (N confident by beta, N# not
predicting c) and, when known, beta >= a replayed lower bound. Points outside that region cannot
be optimal solutions, so bounds valid on it are valid for the MILP, and the optimum is unchanged
(Gleixner et al. 2017, OBBT). Each LP value is the rigorous dual bound of `lucid.bounds.lp`.
The bounds are specific to this node, class and target set, never cached or shared.
"""

from __future__ import annotations

import time

import numpy as np

from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.interval import FP_REL, LayerBounds
from lucid.bounds.lp import LpBoundSolver


def _copy(b: LayerBounds) -> LayerBounds:
    return LayerBounds([x.copy() for x in b.lower], [x.copy() for x in b.upper])


def tighten_node_bounds(
    encode,
    n_bounds: LayerBounds,
    diff: DifferenceBounds,
    rounds: int = 1,
    diff_lp: bool = True,
    deadline: float | None = None,
    hyper_lp: bool = True,
):
    """Tighten layer by layer; `encode(n_bounds, diff, relax_all=True)` builds the relaxation.

    Each layer tightens N's unstable neurons, the pre-activation differences and (with
    `hyper_lp`) N#'s unstable neurons; N#'s bounds are then also intersected with
    N's + the difference's (zhat# = zhat + dhat). For a singleton that sum is in practice as tight
    as N#'s own LPs, at half the tightening time, so callers pass hyper_lp=False there.
    Returns new (n_bounds, diff) or None when the relaxation is infeasible (the node is empty).
    Stops early at `deadline` (time.perf_counter()); bounds tightened so far stay valid.
    Layer 0's differences are skipped: they are affine in x there, so intervals are already tight.
    """
    n_b, pre, post, hyp = _copy(n_bounds), _copy(diff.pre), _copy(diff.post), _copy(diff.hyper)
    L = len(n_b.lower)
    for _ in range(rounds):
        for k in range(L):
            if deadline is not None and time.perf_counter() > deadline:
                return n_b, DifferenceBounds(pre, post, hyp)
            model = encode(n_b, DifferenceBounds(pre, post, hyp))
            if model is None:
                return None
            cols = model.meta["_columns"]
            solver = LpBoundSolver(model)
            nc, hc = cols["n_pre"][k], cols["h_pre"][k]
            for j in range(len(nc)):
                if deadline is not None and time.perf_counter() > deadline:
                    return n_b, DifferenceBounds(pre, post, hyp)
                targets = [(pre.lower[k], pre.upper[k], [hc[j], nc[j]], [1.0, -1.0])] if diff_lp and k > 0 else []
                # a stable neuron has no binary: tightening it only shrinks a constant
                if n_b.lower[k][j] < 0 < n_b.upper[k][j] or k == L - 1:
                    targets.append((n_b.lower[k], n_b.upper[k], [nc[j]], [1.0]))
                if hyper_lp and (hyp.lower[k][j] < 0 < hyp.upper[k][j] or k == L - 1):
                    targets.append((hyp.lower[k], hyp.upper[k], [hc[j]], [1.0]))
                for lo, hi, idx, sign in targets:
                    c = np.zeros(model.num_cols)
                    c[idx] = sign
                    left = None if deadline is None else deadline - time.perf_counter()
                    up = solver.maximise(c, time_limit=left)
                    if up == np.inf:
                        continue
                    left = None if deadline is None else deadline - time.perf_counter()
                    down = -solver.maximise(-c, time_limit=left)
                    if down > up:  # empty relaxation: the node has no feasible point
                        return None
                    if k == L - 1:  # the encoder may have divided the scores by a power of two
                        up, down = up * model.objective_scale, down * model.objective_scale
                    hi[j] = min(hi[j], up)
                    lo[j] = max(lo[j], down)
            _hyper_from_difference(n_b, pre, hyp, k)
            if k < L - 1:
                # post-activation differences follow from the tightened pre-activation ones
                l, u, hl, hu = n_b.lower[k], n_b.upper[k], hyp.lower[k], hyp.upper[k]
                dl, du = pre.lower[k], pre.upper[k]
                zl, zu, hzl, hzu = np.maximum(l, 0), np.maximum(u, 0), np.maximum(hl, 0), np.maximum(hu, 0)
                pl = np.maximum(np.minimum(dl, 0), hzl - zu - np.abs(hzl - zu) * 1e-15)
                pu = np.minimum(np.maximum(du, 0), hzu - zl + np.abs(hzu - zl) * 1e-15)
                post.lower[k] = np.maximum(post.lower[k], np.where((u <= 0) & (hu <= 0), 0.0, pl))
                post.upper[k] = np.minimum(post.upper[k], np.where((u <= 0) & (hu <= 0), 0.0, pu))
    return n_b, DifferenceBounds(pre, post, hyp)


def _hyper_from_difference(n_b: LayerBounds, pre: LayerBounds, hyp: LayerBounds, k: int) -> None:
    """zhat# = zhat + dhat, so [l + dl, u + du] (rounded outward) also bounds N#'s layer k."""
    lo = n_b.lower[k] + pre.lower[k]
    hi = n_b.upper[k] + pre.upper[k]
    pad = (
        4 * FP_REL * (np.abs(n_b.lower[k]) + np.abs(n_b.upper[k]) + np.abs(pre.lower[k]) + np.abs(pre.upper[k]))
        + 1e-300
    )
    ok = np.isfinite(lo) & np.isfinite(hi)
    hyp.lower[k] = np.where(ok, np.maximum(hyp.lower[k], lo - pad), hyp.lower[k])
    hyp.upper[k] = np.where(ok, np.minimum(hyp.upper[k], hi + pad), hyp.upper[k])
