"""Exact power-of-two rescaling of hidden neurons, so the verifier never sees extreme magnitudes.

A ReLU commutes with a positive factor: multiplying neuron i of hidden layer k (row i of W_k and
b_k) by a and dividing column i of W_{k+1} by a leaves every network's function unchanged. With
a a power of two the new parameters are exact in float64 (in its normal range, which the entry
guard of `lucid.dynamic_range` keeps them in), and so is every float64 evaluation: each product
and partial sum of a neuron is the old one times the same power of two, so rounding is the same,
and the scores come out bit for bit the same.

Why: the tiers' tolerances are absolute at some point. A solver's feasibility tolerance (~1e-7)
on a big-M row whose constant is 1e12 lets a neuron move by far more than the safety margin
covers, and a LP solver's scaling cannot recover differences of 1e-7 relative between N and its
neighbours at that magnitude: at 1e4 per layer (hidden pre-activations ~1e8) every backend
returned bounds below the exact beta*. Rescaled, the hidden layers have magnitudes of order one,
the problem the tiers are tested on; the output layer keeps the network's scale (one common factor
would change the confidences), which the margins treat relatively.

The factor is common to every network of the stack (so hyper-network intervals, matching
dependencies and the leave-one-out differences scale with it) and taken from the interval hull of
all networks over the domain. While every neuron's magnitude lies inside the band of
`lucid.dynamic_range.outside_band` ([2^-12, 2^12]) every factor is 1, so ordinary networks are
verified exactly as before; once one neuron lies outside it, every neuron is normalised (see
`hidden_scales`).
"""

from __future__ import annotations

import numpy as np

from lucid.bounds.interval import interval_matvec
from lucid.dynamic_range import outside_band
from lucid.hyper import HyperNetwork
from lucid.network import NetworkStack

MAX_SHIFT = 200  # exponents beyond this are left to the entry guard (float32 parameters never need them)


def hidden_scales(hull: HyperNetwork, lower: np.ndarray, upper: np.ndarray) -> list[np.ndarray] | None:
    """Per hidden layer, the power-of-two factor of each neuron (None: every factor is 1), for the
    networks inside `hull` (the interval hull of a stack). Once some neuron lies outside the band,
    every neuron is brought to magnitude [1/2, 1): a model mixing rescaled layers with big-M
    constants of up to 2^12 in others had Gurobi (integrality tolerance 1e-5) certify bounds below
    the exact ones, where the uniformly scaled model is sound with every backend."""
    if not _any_extreme(hull, lower, upper):
        return None
    return _scales(hull, lower, upper, every=True)


def _any_extreme(hull: HyperNetwork, lower: np.ndarray, upper: np.ndarray) -> bool:
    return _scales(hull, lower, upper, every=False) is not None


def _scales(hull: HyperNetwork, lower: np.ndarray, upper: np.ndarray, every: bool) -> list[np.ndarray] | None:
    """The factors: for the neurons outside the band only, or (`every`) for every neuron with a
    non-zero magnitude, each brought to [1/2, 1)."""
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    previous = np.ones_like(lo)
    scales: list[np.ndarray] = []
    for k in range(hull.num_layers - 1):
        w_lo, w_hi = hull.w_lo[k] / previous, hull.w_hi[k] / previous
        b_lo, b_hi = hull.b_lo[k], hull.b_hi[k]
        with np.errstate(all="ignore"):
            z_lo, z_hi, magnitude = interval_matvec(w_lo, w_hi, lo, hi)
            magnitude = magnitude + np.maximum(np.abs(b_lo), np.abs(b_hi))
        factor = np.ones_like(magnitude)
        extreme = np.isfinite(magnitude) & (magnitude > 0)
        if not every:
            extreme &= outside_band(magnitude)
        _, exponent = np.frexp(magnitude[extreme])  # magnitude = m * 2^exponent, m in [0.5, 1)
        factor[extreme] = np.ldexp(1.0, -np.clip(exponent, -MAX_SHIFT, MAX_SHIFT))
        scales.append(factor)
        with np.errstate(all="ignore"):
            lo = np.maximum((z_lo + b_lo) * factor, 0.0)
            hi = np.maximum((z_hi + b_hi) * factor, 0.0)
        previous = factor
    if all(np.all(f == 1.0) for f in scales):
        return None
    return scales


def _layer_factors(scales: list[np.ndarray], k: int, input_dim: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(row factor, column divisor) of affine layer k (no row factor for the output layer)."""
    rows = scales[k] if k < len(scales) else None
    cols = scales[k - 1] if k > 0 else np.ones(input_dim)
    return rows, cols


def rescale_stack(stack: NetworkStack, scales: list[np.ndarray]) -> NetworkStack:
    """The same networks with hidden neuron i of layer k multiplied by scales[k][i] (exact)."""
    weights, biases = [], []
    for k, (w, b) in enumerate(zip(stack.weights, stack.biases, strict=True)):
        rows, cols = _layer_factors(scales, k, stack.input_dim)
        w = np.asarray(w) / cols[None, None, :]
        if rows is not None:
            w, b = w * rows[None, :, None], np.asarray(b) * rows[None, :]
        weights.append(np.ascontiguousarray(w))
        biases.append(np.ascontiguousarray(b))
    return NetworkStack(weights, biases, stack.removed)


def rescale_hyper(hyper: HyperNetwork, scales: list[np.ndarray] | None) -> HyperNetwork:
    """A parameter box in the original units, in the rescaled ones (positive factors keep lo <= hi)."""
    if scales is None:
        return hyper
    w_lo, w_hi, b_lo, b_hi = [], [], [], []
    input_dim = hyper.w_lo[0].shape[1]
    for k in range(hyper.num_layers):
        rows, cols = _layer_factors(scales, k, input_dim)
        r = np.ones(hyper.w_lo[k].shape[0]) if rows is None else rows
        w_lo.append(hyper.w_lo[k] * r[:, None] / cols[None, :])
        w_hi.append(hyper.w_hi[k] * r[:, None] / cols[None, :])
        b_lo.append(hyper.b_lo[k] * r)
        b_hi.append(hyper.b_hi[k] * r)
    return HyperNetwork(w_lo, w_hi, b_lo, b_hi, hyper.positions)
