"""Interval arithmetic over affine/ReLU networks, rounded outward.

Float64 arithmetic can round a bound inward by a few ulps of the magnitudes summed; every
computed interval is therefore widened by FP_REL times the sum of absolute values of the terms
(plus a tiny absolute amount). A dot product of n terms errs by at most about n * 2^-53 times
that sum (Higham, Thm 3.1), so FP_REL = 1e-11 covers layers of up to ~10^4 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FP_REL = 1e-11
FP_ABS = 1e-300


@dataclass
class LayerBounds:
    """Pre-activation bounds per affine layer (the last layer's are the output scores)."""

    lower: list[np.ndarray]  # each [..., out]
    upper: list[np.ndarray]

    def post(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Bounds after the ReLU of a hidden layer."""
        return np.maximum(self.lower[layer], 0.0), np.maximum(self.upper[layer], 0.0)

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        out = {}
        for i, (lo, hi) in enumerate(zip(self.lower, self.upper, strict=True)):
            out[f"{prefix}lower.{i}"] = lo
            out[f"{prefix}upper.{i}"] = hi
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, num_layers: int, prefix: str = "") -> LayerBounds:
        return cls(
            [np.asarray(arrays[f"{prefix}lower.{i}"]) for i in range(num_layers)],
            [np.asarray(arrays[f"{prefix}upper.{i}"]) for i in range(num_layers)],
        )

    def intersect(self, other: LayerBounds) -> LayerBounds:
        return LayerBounds(
            [np.maximum(a, b) for a, b in zip(self.lower, other.lower, strict=True)],
            [np.minimum(a, b) for a, b in zip(self.upper, other.upper, strict=True)],
        )


def rounding_pad(magnitude: np.ndarray) -> np.ndarray:
    """The float error bound of sums of terms of this magnitude (module docstring)."""
    return FP_REL * magnitude + FP_ABS


def widen(lo: np.ndarray, hi: np.ndarray, magnitude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round an interval outward by the float error bound of sums of terms of this magnitude."""
    pad = rounding_pad(magnitude)
    return lo - pad, hi + pad


def interval_matvec(
    w_lo: np.ndarray, w_hi: np.ndarray, z_lo: np.ndarray, z_hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum_j [w_lo, w_hi]_ij * [z_lo, z_hi]_j for intervals of any sign.

    w: [..., out, in]; z: [..., in]. Returns (lo, hi, magnitude) with magnitude = sum |terms|.
    """
    zl, zh = z_lo[..., None, :], z_hi[..., None, :]
    if np.array_equal(w_lo, w_hi):
        w = w_lo
        lo = np.where(w >= 0, w * zl, w * zh).sum(-1)
        hi = np.where(w >= 0, w * zh, w * zl).sum(-1)
        mag = (np.abs(w) * np.maximum(np.abs(zl), np.abs(zh))).sum(-1)
        return lo, hi, mag
    corners = np.stack([w_lo * zl, w_lo * zh, w_hi * zl, w_hi * zh])
    lo = corners.min(axis=0).sum(-1)
    hi = corners.max(axis=0).sum(-1)
    mag = np.abs(corners).max(axis=0).sum(-1)
    return lo, hi, mag


def point_matvec(w: np.ndarray, z_lo: np.ndarray, z_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`interval_matvec` for point weights w ([..., out, in], or one [out, in] for every row of z),
    by midpoint and radius: w z over the box is exactly w m +- |w| r, two matrix products instead
    of elementwise corner products (the screens of thousands of networks spend their time here).

    Rounding: m and r are rounded, so r is taken one ulp above max(z_hi - m, m - z_lo), which
    keeps [m - r, m + r] around [z_lo, z_hi]; the products' own rounding is covered by the
    caller's widening with the returned magnitude sum |w| (|m| + r) >= sum |terms| (`widen`)."""
    if not (np.isfinite(z_lo).all() and np.isfinite(z_hi).all()):
        return interval_matvec(w, w, z_lo, z_hi)
    m = (z_lo + z_hi) / 2
    r = np.nextafter(np.maximum(z_hi - m, m - z_lo), np.inf)
    aw = np.abs(w)
    centre, spread = matvec(w, m), matvec(aw, r)
    return centre - spread, centre + spread, matvec(aw, np.abs(m) + r)


def matvec(w: np.ndarray, z: np.ndarray) -> np.ndarray:
    """w [..., out, in] times z [..., in] -> [..., out]; one shared w [out, in] as a single product."""
    if w.ndim == 2:
        return z @ w.T
    return np.matmul(w, z[..., None])[..., 0]


def affine_interval(
    w_lo: np.ndarray,
    w_hi: np.ndarray,
    b_lo: np.ndarray,
    b_hi: np.ndarray,
    z_lo: np.ndarray,
    z_hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Sound bounds of W z + b for W, b, z in intervals (outward rounded)."""
    lo, hi, mag = point_matvec(w_lo, z_lo, z_hi) if w_lo is w_hi else interval_matvec(w_lo, w_hi, z_lo, z_hi)
    return widen(lo + b_lo, hi + b_hi, mag + np.maximum(np.abs(b_lo), np.abs(b_hi)))


def interval_bounds(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    lower: np.ndarray,
    upper: np.ndarray,
    weights_hi: list[np.ndarray] | None = None,
    biases_hi: list[np.ndarray] | None = None,
) -> LayerBounds:
    """Pre-activation bounds of every layer by interval propagation over the box [lower, upper].

    Works for one network (w [out, in]), a batch (w [K, out, in]) or a hyper-network (pass the
    interval ends as weights/biases and weights_hi/biases_hi).
    """
    weights_hi = weights if weights_hi is None else weights_hi
    biases_hi = biases if biases_hi is None else biases_hi
    lead = weights[0].shape[:-2]
    z_lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), lead + (weights[0].shape[-1],))
    z_hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), z_lo.shape)
    los, his = [], []
    for i in range(len(weights)):
        lo, hi = affine_interval(weights[i], weights_hi[i], biases[i], biases_hi[i], z_lo, z_hi)
        los.append(lo)
        his.append(hi)
        z_lo, z_hi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
    return LayerBounds(los, his)


def interval_margin_upper(bounds: LayerBounds) -> np.ndarray:
    """[C, C] sound upper bounds on max_x s_c - s_t from the output layer's intervals (0 on the diagonal)."""
    out_lo, out_hi = bounds.lower[-1], bounds.upper[-1]
    margin = out_hi[:, None] - out_lo[None, :]
    margin = margin + FP_REL * (np.abs(out_hi[:, None]) + np.abs(out_lo[None, :]))
    np.fill_diagonal(margin, 0.0)
    return margin
