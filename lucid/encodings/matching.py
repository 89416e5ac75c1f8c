"""Matching dependencies: z + dl <= z# <= z + du, linking each hyper neuron to N's neuron."""

from __future__ import annotations

import numpy as np

from lucid.encodings.builder import ModelBuilder


def add_matching(b: ModelBuilder, z: np.ndarray, z_hyper: np.ndarray, lower: np.ndarray, upper: np.ndarray, name: str) -> int:
    """Rows lower <= z#_j - z_j <= upper for every neuron with a finite, non-trivial interval."""
    same = z == z_hyper  # both fixed to the same column (cannot happen today, but harmless)
    useful = ~same & (np.isfinite(lower) | np.isfinite(upper))
    if not useful.any():
        return 0
    b.add_rows(np.stack([z_hyper[useful], z[useful]], 1), [1.0, -1.0], lower[useful], upper[useful], name)
    return int(useful.sum())


def add_relu_coupling(
    b: ModelBuilder,
    zhat: np.ndarray,
    zhat_hyper: np.ndarray,
    z: np.ndarray,
    z_hyper: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    name: str,
) -> int:
    """Relational matching dependency: the post-activation difference follows the pre-activation one.

    ReLU is monotone and 1-Lipschitz, so for every real pair of pre-activations
    d = ReLU(zhat#) - ReLU(zhat) lies between min(0, dhat) and max(0, dhat), dhat = zhat# - zhat.
    With dhat in [a, b] (`lower`, `upper`, the pre-activation difference interval) that is
    0 <= d <= dhat if a >= 0, dhat <= d <= 0 if b <= 0, and otherwise the convex hull
        d <= b (dhat - a) / (b - a),   d >= a (b - dhat) / (b - a).
    Constant matching dependencies only bound d by [dl, du] independently of dhat; tying d to
    dhat keeps the LP relaxation from choosing N's and N#'s relaxed activations independently,
    which is what makes singleton nodes (where dhat is tiny) hard for the MIP solver.
    Valid for every real execution of every network in S, so the optimum never drops.
    """
    a, bb = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    trivial = (z == zhat) & (z_hyper == zhat_hyper)  # both neurons stably active: d = dhat already
    usable = np.isfinite(a) & np.isfinite(bb) & ~trivial & (bb >= a)
    rows = 0
    cols4 = lambda m: np.stack([z_hyper[m], z[m], zhat_hyper[m], zhat[m]], 1)  # noqa: E731
    # d - dhat <= 0 (a >= 0) / >= 0 (b <= 0), plus the sign of d
    for mask, lo, hi, sign_lo, sign_hi in (
        (usable & (a >= 0), -np.inf, 0.0, 0.0, np.inf),
        (usable & (bb <= 0) & ~(a >= 0), 0.0, np.inf, -np.inf, 0.0),
    ):
        if mask.any():
            b.add_rows(cols4(mask), [1.0, -1.0, -1.0, 1.0], lo, hi, f"{name}.lip")
            b.add_rows(np.stack([z_hyper[mask], z[mask]], 1), [1.0, -1.0], sign_lo, sign_hi, f"{name}.sign")
            rows += 2 * int(mask.sum())
    mixed = usable & (a < 0) & (bb > 0) & ((bb - a) > 1e-12)
    if mixed.any():
        am, bm = a[mixed], bb[mixed]
        su = bm / (bm - am)  # d - su dhat <= -a su
        sl = am / (bm - am)  # d + sl dhat >= b sl   (sl < 0)
        c = cols4(mixed)
        ones = np.ones(len(am))
        b.add_rows(c, np.stack([ones, -ones, -su, su], 1), -np.inf, -am * su, f"{name}.hull_up")
        b.add_rows(c, np.stack([ones, -ones, sl, -sl], 1), bm * sl, np.inf, f"{name}.hull_lo")
        rows += 2 * int(mixed.sum())
    return rows
