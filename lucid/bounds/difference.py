"""Difference intervals z# - z between a hyper-network N# and N, and the hyper-network's bounds.

The paper's propagation, for affine layer k with N's weights W and hyper weights W + I_W:

    I_zhat = I_b + W . I_zprev + I_W . (z_prev + I_zprev)        (z_prev + I_zprev = z#_prev)
    ReLU:    I_z = [-max(0, -dl), max(0, du)]                      (ReLU is monotone, 1-Lipschitz)

with every product evaluated in interval arithmetic (any signs, so a domain with negative lower
bounds is handled at layer 0 without a shift), intersected with [l# - u, u# - l] and, after the
ReLU, with [relu(l#) - relu(u), relu(u#) - relu(l)]. The hyper bounds are l# = l + dl,
u# = u + du intersected with direct interval propagation of N#. All arrays may carry a leading
batch axis (one hyper-network per entry), which `screen` uses for every singleton at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lucid.bounds.interval import (
    LayerBounds,
    affine_interval,
    interval_matvec,
    matvec,
    point_matvec,
    rounding_pad,
    widen,
)
from lucid.hyper import HyperNetwork


@dataclass
class DifferenceBounds:
    pre: LayerBounds  # bounds on zhat# - zhat, every layer (the last is the scores)
    post: LayerBounds  # bounds on z# - z, hidden layers only
    hyper: LayerBounds  # pre-activation bounds of N# itself


@dataclass(frozen=True, eq=False)
class WeightIntervals:
    """The parameters of N# as intervals, [w_lo, w_hi] and [b_lo, b_hi] per layer (eq=False: arrays).

    Every array may carry a leading batch axis (one hyper-network per entry). A point (one network
    per entry, `points`) holds the same list as its lower and upper end: `difference_bounds` then
    takes its exact weight difference instead of an interval product."""

    w_lo: Sequence[np.ndarray]  # [..., out, in] per layer
    w_hi: Sequence[np.ndarray]
    b_lo: Sequence[np.ndarray]  # [..., out]
    b_hi: Sequence[np.ndarray]

    @classmethod
    def points(cls, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]) -> WeightIntervals:
        """Single networks: each interval is the point itself."""
        return cls(weights, weights, biases, biases)

    @classmethod
    def of(cls, hyper: HyperNetwork) -> WeightIntervals:
        """A `lucid.hyper.HyperNetwork`'s intervals."""
        return cls(hyper.w_lo, hyper.w_hi, hyper.b_lo, hyper.b_hi)


def difference_bounds(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    intervals: WeightIntervals,
    n_bounds: LayerBounds,
    lower: np.ndarray,
    upper: np.ndarray,
) -> DifferenceBounds:
    """Sound intervals for z# - z (N's weights [out, in]; `intervals`: N#'s parameters)."""
    w_lo, w_hi, b_lo, b_hi = intervals.w_lo, intervals.w_hi, intervals.b_lo, intervals.b_hi
    L = len(weights)
    pre_lo, pre_hi, post_lo, post_hi, hyp_lo, hyp_hi = [], [], [], [], [], []
    lead = w_lo[0].shape[:-2]
    d_lo = np.zeros(lead + (len(lower),))  # the inputs are shared: no difference
    d_hi = np.zeros_like(d_lo)
    h_lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), d_lo.shape)  # bounds of z#_prev
    h_hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), d_lo.shape)
    for k in range(L):
        W, b = weights[k], biases[k]
        ib_lo, ib_hi = widen(b_lo[k] - b, b_hi[k] - b, np.abs(b))
        t1_lo, t1_hi, m1 = point_matvec(W, d_lo, d_hi)
        if w_lo[k] is w_hi[k]:  # one network per row: its weight difference is a point, up to rounding
            pad = rounding_pad(np.abs(W))  # `widen`'s, of w - W
            t2_lo, t2_hi, m2 = point_matvec(w_lo[k] - W, h_lo, h_hi)
            slack = matvec(pad, np.maximum(np.abs(h_lo), np.abs(h_hi)))  # [-pad, pad] times the box
            t2_lo, t2_hi, m2 = t2_lo - slack, t2_hi + slack, m2 + slack
        else:
            iw_lo, iw_hi = widen(w_lo[k] - W, w_hi[k] - W, np.abs(W))
            t2_lo, t2_hi, m2 = interval_matvec(iw_lo, iw_hi, h_lo, h_hi)
        dl, du = widen(ib_lo + t1_lo + t2_lo, ib_hi + t1_hi + t2_hi, m1 + m2 + np.maximum(np.abs(ib_lo), np.abs(ib_hi)))
        l, u = n_bounds.lower[k], n_bounds.upper[k]
        # N#'s own bounds: via the difference, and directly
        direct_lo, direct_hi = affine_interval(w_lo[k], w_hi[k], b_lo[k], b_hi[k], h_lo, h_hi)
        hl = np.maximum(l + dl - np.abs(l + dl) * 1e-15, direct_lo)
        hu = np.minimum(u + du + np.abs(u + du) * 1e-15, direct_hi)
        dl = np.maximum(dl, hl - u - np.abs(hl - u) * 1e-15)
        du = np.minimum(du, hu - l + np.abs(hu - l) * 1e-15)
        pre_lo.append(dl)
        pre_hi.append(du)
        hyp_lo.append(hl)
        hyp_hi.append(hu)
        if k == L - 1:
            break
        # ReLU: monotone and 1-Lipschitz, and bounded by the ranges of both post-activations
        zl, zu = np.maximum(l, 0), np.maximum(u, 0)
        hzl, hzu = np.maximum(hl, 0), np.maximum(hu, 0)
        pl = np.maximum(np.minimum(dl, 0), hzl - zu - np.abs(hzl - zu) * 1e-15)
        pu = np.minimum(np.maximum(du, 0), hzu - zl + np.abs(hzu - zl) * 1e-15)
        both_off = (u <= 0) & (hu <= 0)
        pl = np.where(both_off, 0.0, pl)
        pu = np.where(both_off, 0.0, pu)
        post_lo.append(pl)
        post_hi.append(pu)
        d_lo, d_hi = pl, pu
        h_lo, h_hi = hzl, hzu
    return DifferenceBounds(LayerBounds(pre_lo, pre_hi), LayerBounds(post_lo, post_hi), LayerBounds(hyp_lo, hyp_hi))


def intersect_differences(diff: DifferenceBounds, pre: LayerBounds, hyper: LayerBounds) -> DifferenceBounds:
    """`diff` tightened by other sound intervals of the same quantities (e.g. the symbolic ones of
    `lucid.bounds.symbolic.difference_intervals`, hulled over a node's networks).

    z# - z = relu(zhat#) - relu(zhat) lies between min(0, zhat# - zhat) and max(0, zhat# - zhat)
    (ReLU is monotone and 1-Lipschitz), so the post-activation intervals follow from the tightened
    pre-activation ones. Only max / min of sound bounds: no rounding."""
    pre_lo = [np.maximum(a, b) for a, b in zip(diff.pre.lower, pre.lower, strict=True)]
    pre_hi = [np.minimum(a, b) for a, b in zip(diff.pre.upper, pre.upper, strict=True)]
    hyp_lo = [np.maximum(a, b) for a, b in zip(diff.hyper.lower, hyper.lower, strict=True)]
    hyp_hi = [np.minimum(a, b) for a, b in zip(diff.hyper.upper, hyper.upper, strict=True)]
    post_lo = [np.maximum(p, np.minimum(lo, 0.0)) for p, lo in zip(diff.post.lower, pre_lo, strict=False)]
    post_hi = [np.minimum(p, np.maximum(hi, 0.0)) for p, hi in zip(diff.post.upper, pre_hi, strict=False)]
    return DifferenceBounds(LayerBounds(pre_lo, pre_hi), LayerBounds(post_lo, post_hi), LayerBounds(hyp_lo, hyp_hi))
