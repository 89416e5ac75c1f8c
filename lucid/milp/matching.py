"""Matching dependencies: z + dl <= z# <= z + du, linking each hyper neuron to N's neuron."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.milp.builder import ModelBuilder


@dataclass(frozen=True, eq=False)
class ReluColumns:
    """One hidden layer's columns in both networks (eq=False: index arrays): the pre-activations
    zhat of N and zhat# of N#, and the post-activations z and z#, one column per neuron each."""

    zhat: np.ndarray
    zhat_hyper: np.ndarray
    z: np.ndarray
    z_hyper: np.ndarray


def add_matching(
    b: ModelBuilder,
    z: np.ndarray,
    z_hyper: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    name: str,
    implied: np.ndarray | None = None,
) -> int:
    """Rows lower <= z#_j - z_j <= upper for every neuron with a finite, non-trivial interval.

    `implied` marks neurons whose row other rows already imply (`implied_post_rows`): the row
    is left out, which leaves the model's LP relaxation, and so every bound, unchanged."""
    same = z == z_hyper  # both fixed to the same column (cannot happen today, but harmless)
    useful = ~same & (np.isfinite(lower) | np.isfinite(upper))
    if implied is not None:
        useful &= ~implied
    if not useful.any():
        return 0
    b.add_rows(np.stack([z_hyper[useful], z[useful]], 1), [1.0, -1.0], lower[useful], upper[useful], name)
    return int(useful.sum())


def add_relu_coupling(
    b: ModelBuilder, cols: ReluColumns, lower: np.ndarray, upper: np.ndarray, name: str
) -> tuple[int, np.ndarray]:
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
    Returns the rows added and the mask of neurons that got them.
    """
    zhat, zhat_hyper, z, z_hyper = cols.zhat, cols.zhat_hyper, cols.z, cols.z_hyper
    a, bb = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    trivial = (z == zhat) & (z_hyper == zhat_hyper)  # both neurons stably active: d = dhat already
    usable = np.isfinite(a) & np.isfinite(bb) & ~trivial & (bb >= a)
    rows = 0
    coupled = np.zeros(len(a), dtype=bool)

    def cols4(m: np.ndarray) -> np.ndarray:
        return np.stack([z_hyper[m], z[m], zhat_hyper[m], zhat[m]], 1)

    # d - dhat <= 0 (a >= 0) / >= 0 (b <= 0), plus the sign of d
    for mask, lo, hi, sign_lo, sign_hi in (
        (usable & (a >= 0), -np.inf, 0.0, 0.0, np.inf),
        (usable & (bb <= 0) & ~(a >= 0), 0.0, np.inf, -np.inf, 0.0),
    ):
        if mask.any():
            b.add_rows(cols4(mask), [1.0, -1.0, -1.0, 1.0], lo, hi, f"{name}.lip")
            b.add_rows(np.stack([z_hyper[mask], z[mask]], 1), [1.0, -1.0], sign_lo, sign_hi, f"{name}.sign")
            rows += 2 * int(mask.sum())
            coupled |= mask
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
        coupled |= mixed
    return rows, coupled


def implied_post_rows(
    pre_lower: np.ndarray,
    pre_upper: np.ndarray,
    post_lower: np.ndarray,
    post_upper: np.ndarray,
    coupled: np.ndarray,
    both_off: np.ndarray,
) -> np.ndarray:
    """Neurons whose post-activation matching row [post_lower, post_upper] adds nothing.

    With the pre-activation difference dhat in [a, b] (its matching row, or layer 0's affine
    rows) the coupling rows alone confine d = z# - z to [min(a, 0), max(b, 0)]: 0 <= d <= dhat
    when a >= 0, dhat <= d <= 0 when b <= 0, and the hull's two lines stay within [a, b] for
    dhat in [a, b] otherwise. A post interval that contains that range is therefore implied, in
    the LP relaxation too; a neuron off in both networks has d = 0 by its column bounds. On a
    singleton nearly every post row is implied, and leaving them out matters because HiGHS runs
    without presolve, so nothing else removes them.
    """
    covers = (post_lower <= np.minimum(pre_lower, 0.0)) & (post_upper >= np.maximum(pre_upper, 0.0))
    return (coupled & covers) | both_off
