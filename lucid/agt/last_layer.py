"""A relational update for fine-tuning the last layer: the box keeps SGD's contraction.

The interval update (`lucid.agt.train`) bounds theta' = decay theta - lr g with the top of a
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
Both this bound and the interval one hold, so the update keeps the tighter of the two.

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

import torch

from lucid.agt.gradients import RowBounds, affine_nonneg, removal_mean_bounds, softmax_bounds
from lucid.agt.rounding import ETA, SOFTMAX_ULPS, U, gamma


def _log_rival_sum(diff: torch.Tensor) -> torch.Tensor:
    """log sum_{t != c} exp(diff[b, c, t]) ([B, C]); the diagonal t = c is left out."""
    c = diff.shape[1]
    diag = torch.eye(c, dtype=torch.bool, device=diff.device)
    return torch.logsumexp(diff.masked_fill(diag, -float("inf")), dim=2)


def relational_update_bounds(
    w_lo: torch.Tensor, w_hi: torch.Tensor, b_lo: torch.Tensor, b_hi: torch.Tensor,
    h_lo: torch.Tensor, h_hi: torch.Tensor, onehot: torch.Tensor, *, k: int, lr: float, decay: float,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Bounds on decay*theta - lr*g for the last layer's weights [C, J] and biases [C].

    For every theta in the box [w_lo, w_hi] x [b_lo, b_hi] and every removal of up to k of the
    batch's rows; g is T's float32 batch-mean gradient, h in [h_lo, h_hi] ([B, J], >= 0) holds
    T's float32 features of the batch rows. Returns ((lo_w, hi_w), (lo_b, hi_b)), float64, before
    the rounding of T's update (the caller's allowance).
    """
    m, n_features = h_lo.shape
    ones = torch.ones(m, 1, dtype=h_lo.dtype, device=h_lo.device)
    hl = torch.cat([h_lo.clamp(min=0.0), ones], dim=1)  # the bias is the weight of a constant feature 1
    hh = torch.cat([h_hi, ones], dim=1)
    lo = torch.cat([w_lo, b_lo[:, None]], dim=1)  # [C, J + 1]
    hi = torch.cat([w_hi, b_hi[:, None]], dim=1)
    zero = torch.zeros(lo.shape[0], dtype=lo.dtype, device=lo.device)
    width = hi - lo  # within one float64 rounding; the allowances below are relative to it

    # Over the whole box: T's logit error eps and the softmax interval (for s_b and magnitudes).
    zl_box, zu_box, mag = affine_nonneg(hl, hh, lo, hi, zero, zero)
    eps = gamma(n_features + 2) * mag + (n_features + 2) * ETA
    p_lo, p_hi = softmax_bounds(zl_box, zu_box)
    d_mag = torch.maximum((p_lo - onehot).abs(), (p_hi - onehot).abs())  # |p^ - y| in the box, [B, C]
    g_mag = d_mag[:, :, None] * hh[:, None, :]  # [B, C, J + 1]

    # The least logits at the all-lower corner and the largest at the all-upper corner (over
    # h^ in its interval), moved by T's eps.
    low_lo = affine_nonneg(hl, hh, lo, lo, zero, zero)[0] - eps
    up_hi = affine_nonneg(hl, hh, hi, hi, zero, zero)[1] + eps

    margin = 2 * (2 * lo.shape[0] + SOFTMAX_ULPS) * U  # T's float32 softmax and this float64 evaluation
    shift_lo = width[None, :, :] * hl[:, None, :]  # [B, C, J + 1]: the coordinate's own move, times h^_j >= h_lo

    # theta' upper end: p_c smallest at theta* (class c low, rivals high, coordinate j at its top).
    log_up = _log_rival_sum(up_hi[:, None, :] - low_lo[:, :, None])  # [B, c]: log sum_t exp(z_t - z_c), upper
    expo = log_up[:, :, None] - shift_lo
    expo = expo + gamma(lo.shape[0] + 6) * (log_up.abs()[:, :, None] + shift_lo + 1.0)
    q = torch.sigmoid(-expo) - margin - onehot[:, :, None]
    row_lo = torch.where(q >= 0, q * hl[:, None, :], q * hh[:, None, :])

    # theta' lower end: p_c largest at theta_* (class c high, rivals low, coordinate j at its bottom).
    log_dn = _log_rival_sum(low_lo[:, None, :] - up_hi[:, :, None])
    expo = log_dn[:, :, None] + shift_lo
    expo = expo - gamma(lo.shape[0] + 6) * (log_dn.abs()[:, :, None] + shift_lo + 1.0)
    q = torch.sigmoid(-expo) + margin - onehot[:, :, None]
    row_hi = torch.where(q >= 0, q * hh[:, None, :], q * hl[:, None, :])

    # T's product (p^ - y) h^ and this product: relative rounding of each.
    slack = gamma(2) * (g_mag + torch.maximum(row_lo.abs(), row_hi.abs())) + ETA
    rows = RowBounds(row_lo - slack, row_hi + slack, g_mag)
    g_lo, g_hi = removal_mean_bounds(rows, k)

    # where the coordinate's map is not monotone, the most it can rise against its endpoint
    s = torch.where((p_lo <= 0.5) & (p_hi >= 0.5), torch.full_like(p_lo, 0.25),
                    torch.maximum(p_lo * (1 - p_lo), p_hi * (1 - p_hi)))  # max p (1 - p) over [p_lo, p_hi]
    r = max(m - k, 1)
    curvature = (s.T @ (hh * hh)) / r * (1 + gamma(m + 4))  # [C, J + 1], rounded up
    rise = (lr * curvature - decay).clamp(min=0.0) * width * (1 + 2 * U)

    new_hi = decay * hi - lr * g_lo + rise
    new_lo = decay * lo - lr * g_hi - rise
    return (new_lo[:, :n_features], new_hi[:, :n_features]), (new_lo[:, n_features], new_hi[:, n_features])
