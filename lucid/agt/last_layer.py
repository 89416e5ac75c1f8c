"""Fine-tuning the last layer: one step of T bounded over the box, and the corner update.

`LastLayerStep` holds what every bound on a last-layer step needs (the batch's features, the
box of the augmented layer [W | b], box-wide enclosures of T's softmax and gradient rows); the
corner update below and the zonotope of `lucid.agt.zonotope` both use it.

The corner update keeps SGD's contraction per coordinate. The interval update
(`lucid.agt.train`) bounds theta' = decay theta - lr g with the top of a
coordinate and, independently, the smallest gradient anywhere in the box. Those two are never
reached together: the loss is convex in the last layer, so the gradient of a coordinate grows
with the coordinate, and true SGD contracts a box of starting points by about (1 - lr H) per
step. When only the last layer trains (the features h below it are fixed, h >= 0 after a ReLU),
that contraction can be kept soundly. Write coordinate (c, j) of the augmented last layer
[W | b] (feature j, or the constant 1 for the bias) and, for a removal set R of the batch,

    phi_R(theta) = decay theta_cj - lr mean_{b in R} (p_c(theta; h_b) - y_bc) h_bj.

- Every *other* coordinate moves p_c the same way in every row: up with W_c. and b_c, down with
  W_t. and b_t (t != c), because h >= 0. So phi_R is largest, for every R at once, at the corner
  that makes p_c smallest: class c's row at its lower end, every rival row at its upper end.
- Along theta_cj itself, d phi_R / d theta_cj = decay - lr mean_R p_c (1 - p_c) h_bj^2, and
  mean_R p_c (1 - p_c) h_bj^2 <= S_cj = (1/r) sum_{b in batch} s_b h_bj^2 with r = max(m - k, 1)
  and s_b >= p_c (1 - p_c) anywhere in the box. So phi_R(theta) <= phi_R(theta*) +
  width_cj max(0, lr S_cj - decay), where theta* is that corner with theta_cj at its upper end.

Hence decay theta_cj - lr g_cj <= decay U_cj - lr min_R mean_R g_b(theta*) + width_cj max(0, lr S_cj - decay):
the gradient rows at one point per coordinate (a shift of one logit, cheap for every j at
once), then the sort-and-drop of `removal_mean_bounds`. The lower end is symmetric. Where
lr S_cj <= decay, as in the fine-tuning settings we run, the correction is zero and the width
evolves like decay*width - lr*(H*width) + lr*(removal + rounding) instead of decay*width + lr*width(g).
Both this bound and the interval one hold, so the box keeps the tighter end (docs/agt.md).

Floating point. T computes float32 features h^ in [h_lo, h_hi] (the interval forward pass),
float32 logits within eps = gamma_{J+2} (|W| h^ + |b|) of the exact ones (eps bounded over the
box), its float32 softmax within the margin of `softmax_bounds`, then the products and the
weighted batch sum. The argument above is made for p-_c(theta), the exact softmax with every
rival logit raised by its eps and z_c lowered by its eps: it has the same monotonicity and
derivative bound (it lies in the box's softmax interval), and T's p^_c >= p-_c - margin
everywhere in the box. So T's row value is >= (p-_c - margin - y) h^_j - (product rounding),
and T's batch gradient is >= the removal mean of those rows - (mean rounding, as in
`removal_mean_bounds`); the upper end uses p+_c symmetrically. This module's own float64
evaluation (the log-sum-exp, the shift, the sigmoid) is covered by a relative allowance on the
exponent and a doubled softmax margin. The caller adds the rounding of T's update itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lucid.agt.gradients import RowBounds, affine_nonneg, product_nonneg, removal_mean_bounds, softmax_bounds
from lucid.agt.rounding import ETA, SOFTMAX_ULPS, U, gamma


@dataclass
class LastLayerStep:
    """One batch of a last-layer step, bounded over the box. Augmented layout: the bias is the
    weight of a constant feature 1, so parameters are [C, J + 1] and features [m, J + 1]."""

    hl: torch.Tensor  # [m, J + 1] features, lower (>= 0)
    hh: torch.Tensor  # [m, J + 1] features, upper
    lo: torch.Tensor  # [C, J + 1] the box of [W | b]
    hi: torch.Tensor
    onehot: torch.Tensor  # [m, C]
    p_lo: torch.Tensor  # [m, C] T's softmax anywhere in the box (and the exact one)
    p_hi: torch.Tensor
    eps: torch.Tensor  # [m, C] T's float32 logit error anywhere in the box
    rows_lo: torch.Tensor  # [m, C, J + 1] T's gradient rows (p^ - y) h^ anywhere in the box
    rows_hi: torch.Tensor
    g_mag: torch.Tensor  # [m, C, J + 1] a bound on |row| in the box

    @property
    def curvature_bound(self) -> torch.Tensor:
        """[m, C]: s_b >= p_c (1 - p_c) anywhere in the box."""
        p_lo, p_hi = self.p_lo, self.p_hi
        return torch.where(
            (p_lo <= 0.5) & (p_hi >= 0.5),
            torch.full_like(p_lo, 0.25),
            torch.maximum(p_lo * (1 - p_lo), p_hi * (1 - p_hi)),
        )


def last_layer_step(
    w_lo: torch.Tensor,
    w_hi: torch.Tensor,
    b_lo: torch.Tensor,
    b_hi: torch.Tensor,
    h_lo: torch.Tensor,
    h_hi: torch.Tensor,
    onehot: torch.Tensor,
) -> LastLayerStep:
    """The box-wide enclosures of a step: weights [C, J], biases [C], features [m, J] (>= 0)."""
    ones = torch.ones(h_lo.shape[0], 1, dtype=h_lo.dtype, device=h_lo.device)
    hl = torch.cat([h_lo.clamp(min=0.0), ones], dim=1)
    hh = torch.cat([h_hi, ones], dim=1)
    return enclose(hl, hh, torch.cat([w_lo, b_lo[:, None]], dim=1), torch.cat([w_hi, b_hi[:, None]], dim=1), onehot)


def enclose(
    hl: torch.Tensor, hh: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, onehot: torch.Tensor
) -> LastLayerStep:
    """`LastLayerStep` for augmented features [m, J + 1] and the box [lo, hi] ([C, J + 1]) of [W | b]."""
    n_features = hl.shape[1] - 1
    zero = torch.zeros(lo.shape[0], dtype=lo.dtype, device=lo.device)
    zl, zu, mag = affine_nonneg(hl, hh, lo, hi, zero, zero)
    eps = gamma(n_features + 2) * mag + (n_features + 2) * ETA
    p_lo, p_hi = softmax_bounds(zl, zu)
    d_lo, d_hi = p_lo - onehot, p_hi - onehot
    rows_lo, rows_hi = product_nonneg(d_lo[:, :, None], d_hi[:, :, None], hl[:, None, :], hh[:, None, :])
    g_mag = torch.maximum(d_lo.abs(), d_hi.abs())[:, :, None] * hh[:, None, :]
    rows_lo, rows_hi = rows_lo - gamma(1) * g_mag - ETA, rows_hi + gamma(1) * g_mag + ETA  # T's product
    return LastLayerStep(hl, hh, lo, hi, onehot, p_lo, p_hi, eps, rows_lo, rows_hi, g_mag)


def _log_rival_sum(diff: torch.Tensor) -> torch.Tensor:
    """log sum_{t != c} exp(diff[b, c, t]) ([B, C]); the diagonal t = c is left out."""
    c = diff.shape[1]
    diag = torch.eye(c, dtype=torch.bool, device=diff.device)
    return torch.logsumexp(diff.masked_fill(diag, -float("inf")), dim=2)


def corner_update_bounds(step: LastLayerStep, *, k: int, lr: float, decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds [C, J + 1] on decay*theta - lr*g over the box and every removal of up to k rows.

    g is T's float32 batch-mean gradient; the rounding of T's update itself is the caller's.
    """
    hl, hh, lo, hi, onehot = step.hl, step.hh, step.lo, step.hi, step.onehot
    m, classes = hl.shape[0], lo.shape[0]
    zero = torch.zeros(classes, dtype=lo.dtype, device=lo.device)
    width = hi - lo  # within one float64 rounding; the allowances below are relative to it

    # The least logits at the all-lower corner and the largest at the all-upper corner (over
    # h^ in its interval), moved by T's eps.
    low_lo = affine_nonneg(hl, hh, lo, lo, zero, zero)[0] - step.eps
    up_hi = affine_nonneg(hl, hh, hi, hi, zero, zero)[1] + step.eps

    margin = 2 * (2 * classes + SOFTMAX_ULPS) * U  # T's float32 softmax and this float64 evaluation
    shift_lo = width[None, :, :] * hl[:, None, :]  # [B, C, J + 1]: the coordinate's own move, times h^_j >= h_lo
    allowance = gamma(classes + 6)

    # theta' upper end: p_c smallest at theta* (class c low, rivals high, coordinate j at its top).
    log_up = _log_rival_sum(up_hi[:, None, :] - low_lo[:, :, None])  # [B, c]: log sum_t exp(z_t - z_c), upper
    expo = log_up[:, :, None] - shift_lo
    expo = expo + allowance * (log_up.abs()[:, :, None] + shift_lo + 1.0)
    q = torch.sigmoid(-expo) - margin - onehot[:, :, None]
    row_lo = torch.where(q >= 0, q * hl[:, None, :], q * hh[:, None, :])

    # theta' lower end: p_c largest at theta_* (class c high, rivals low, coordinate j at its bottom).
    log_dn = _log_rival_sum(low_lo[:, None, :] - up_hi[:, :, None])
    expo = log_dn[:, :, None] + shift_lo
    expo = expo - allowance * (log_dn.abs()[:, :, None] + shift_lo + 1.0)
    q = torch.sigmoid(-expo) + margin - onehot[:, :, None]
    row_hi = torch.where(q >= 0, q * hh[:, None, :], q * hl[:, None, :])

    # T's product (p^ - y) h^ and this product: relative rounding of each.
    slack = gamma(2) * (step.g_mag + torch.maximum(row_lo.abs(), row_hi.abs())) + ETA
    g_lo, g_hi = removal_mean_bounds(RowBounds(row_lo - slack, row_hi + slack, step.g_mag), k)

    # where the coordinate's map is not monotone, the most it can rise against its endpoint
    r = max(m - k, 1)
    curvature = (step.curvature_bound.T @ (hh * hh)) / r * (1 + gamma(m + 4))  # [C, J + 1], rounded up
    rise = (lr * curvature - decay).clamp(min=0.0) * width * (1 + 2 * U)
    return decay * lo - lr * g_hi - rise, decay * hi - lr * g_lo + rise
