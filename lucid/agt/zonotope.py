"""A zonotope over the last layer's parameters: AGT without the wrapping effect.

A box forgets how its coordinates move together. When only the last layer trains, every
logit depends on all J + 1 coordinates of its row, so the gradient bound of one coordinate
pays for the width of all the others. The box then grows like lr * s * |h|^2 * width per step,
while the networks it must hold grow only by the removed row's effect. This is the wrapping effect
of interval ODE integration, and the cure is the same: carry the set as a zonotope

    Z = { c + G e : e in [-1, 1]^q }      (c: [P], G: [P, q], P = C (J + 1), layout [W | b] row-major)

and map it through a linearisation of the step with a sound remainder. For theta in Z (and in
the current box, which every reachable theta is in too) and a removal set R of the batch:

    theta' = decay theta - lr g_R(theta) - (T's rounding)
    g_R(theta) = g(c) + J (theta - c) + rho(theta) + Delta_R(theta) + e(theta)

- g = the exact mean gradient over all m rows (with T's float32 features h^), J = its Jacobian
  at c (any matrix works: the remainder is measured against the one used);
- rho = (J~ - J)(theta - c) by the mean-value theorem, J~ inside the interval Jacobian over the
  box widened to hold c (the segments from c), so |rho| <= |J_box - J| |theta - c|: second order
  in the box's width;
- Delta_R = g_R - g = (j / (m - j)) (g - mean_{b in D} g_b) for the j <= k removed rows D, so
  |Delta_R| <= k / (m - k) times the spread of the box's gradient rows around their mean;
- e = T's float32 error in the gradient (logits, softmax, products, the weighted sum), bounded
  over the box.

So theta' in c' + (decay I - lr J) G e + box - lr Delta_R, with c' = decay c - lr g(c) and the
box holding lr (|rho| + e), the width of g(c)'s own enclosure, this float64 arithmetic and the
rounding of T's update; the box becomes P new generators. Order reduction (Girard's: the
generators with the smallest ||g||_1 - ||g||_inf are replaced by their box) keeps at most
`max_generators`.

The removal term is not added every step. S is fixed and every epoch is a permutation, so S's
rows fall into at most k batches of an epoch, j_s rows into batch s with sum_s j_s <= k. Since
j / (m - j) <= (j / k) k / (m - k), the epoch's removal effects, each moved on by the later steps'
linear maps, are a convex combination (weights j_s / k) of the members "removal at step s"
(generated with k / (m_s - k)): they lie in the hull of 0 and the members. `Zonotope.removals`
keeps this epoch's members; `end_epoch` folds their hull's box into the generators.

A batch that may be emptied (k >= m) is not linearised; the caller restarts the zonotope from
the box (which holds everything so far, removal effects included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lucid.agt.gradients import RowBounds, affine_nonneg, product_nonneg, removal_mean_bounds, softmax_bounds
from lucid.agt.last_layer import LastLayerStep, enclose
from lucid.agt.rounding import ETA, SOFTMAX_ULPS, U, gamma, outward, update_radius

FOLD_ELEMENTS = 20_000_000  # fold an epoch's removal effects early beyond this many stored numbers


@dataclass
class Zonotope:
    """c + G e (e in [-1, 1]^q) plus the hull of 0 and this epoch's removal effects
    (offset_s + R_s e_s: what removing rows at step s adds, moved on by every later step)."""

    center: torch.Tensor  # [P]
    generators: torch.Tensor  # [P, q]
    removals: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def from_box(cls, lo: torch.Tensor, hi: torch.Tensor) -> Zonotope:
        """The box [lo, hi] ([C, J + 1]) as a zonotope (rounded outward)."""
        lo, hi = lo.flatten(), hi.flatten()
        mid = (lo + hi) / 2
        rad = torch.maximum(hi - mid, mid - lo) * (1 + 4 * U) + ETA
        return cls(mid, torch.diag(rad))

    def deviation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[P] bounds on theta - c over the set (rounded outward)."""
        rad = self.generators.abs().sum(1) * (1 + gamma(self.generators.shape[1] + 1))
        lo, hi = -rad, rad
        if self.removals:
            r_lo, r_hi = self._removal_hull()
            lo, hi = lo + r_lo, hi + r_hi
        return lo * (1 + 2 * U) - ETA, hi * (1 + 2 * U) + ETA

    def bounds(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """Its box, [lo, hi] in `shape`, rounded outward."""
        d_lo, d_hi = self.deviation()
        lo, hi = outward(self.center + d_lo, self.center + d_hi, gamma(2) * self.center.abs())
        return lo.view(shape), hi.view(shape)

    def end_epoch(self) -> None:
        """The next epoch removes rows again, independently: fold this epoch's hull into the
        generators (as a box)."""
        if not self.removals:
            return
        lo, hi = self._removal_hull()
        self.removals = []
        mid = (lo + hi) / 2
        rad = torch.maximum(hi - mid, mid - lo) + gamma(3) * (lo.abs() + hi.abs()) + ETA
        new_center = self.center + mid
        rad = rad + gamma(2) * new_center.abs()  # this sum's rounding
        self.center = new_center
        self.generators = torch.cat([self.generators, torch.diag(rad)], dim=1)

    def _removal_hull(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Bounds on the hull of 0 and every offset_s + R_s e_s."""
        lo = hi = torch.zeros_like(self.center)
        for offset, gens in self.removals:
            rad = gens.abs().sum(1) * (1 + gamma(gens.shape[1] + 1))
            lo, hi = torch.minimum(lo, offset - rad), torch.maximum(hi, offset + rad)
        return lo, hi


def _jacobian_factors(p: torch.Tensor) -> torch.Tensor:
    """[m, C, C]: d softmax_c / d z_d = p_c (delta_cd - p_d)."""
    return torch.diag_embed(p) - p[:, :, None] * p[:, None, :]


def _interval_jacobian(step: LastLayerStep) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, P] bounds on the Jacobian of the exact mean gradient anywhere in the box.

    Entry ((c, j), (d, l)) = mean_b a_b,cd h_bj h_bl with a_b,cd = d p_c / d z_d in the box:
    p_c (1 - p_c) in [min at the ends, s_b] on the diagonal, -p_c p_d in [-p_c^U p_d^U,
    -p_c^L p_d^L] off it; h_bj h_bl in [hl hl, hh hh] >= 0."""
    m, classes = step.p_lo.shape
    p_lo, p_hi = step.p_lo, step.p_hi
    diag = torch.eye(classes, dtype=torch.bool, device=p_lo.device)
    own_lo = torch.minimum(p_lo * (1 - p_lo), p_hi * (1 - p_hi))
    a_lo = torch.where(diag, torch.diag_embed(own_lo), -p_hi[:, :, None] * p_hi[:, None, :])
    a_hi = torch.where(diag, torch.diag_embed(step.curvature_bound), -p_lo[:, :, None] * p_lo[:, None, :])
    ll = step.hl[:, :, None] * step.hl[:, None, :]  # [m, J+1, J+1]
    hh = step.hh[:, :, None] * step.hh[:, None, :]
    lo = torch.einsum("bcd,bjl->cjdl", a_lo.clamp(min=0), ll) + torch.einsum("bcd,bjl->cjdl", a_lo.clamp(max=0), hh)
    hi = torch.einsum("bcd,bjl->cjdl", a_hi.clamp(min=0), hh) + torch.einsum("bcd,bjl->cjdl", a_hi.clamp(max=0), ll)
    mag = torch.einsum("bcd,bjl->cjdl", torch.maximum(a_lo.abs(), a_hi.abs()), hh)
    size = classes * step.hl.shape[1]
    slack = gamma(m + 4) * mag + m * ETA
    return ((lo - slack) / m).reshape(size, size), ((hi + slack) / m).reshape(size, size)


def _point_gradient(step: LastLayerStep, center: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g(c) enclosed ([P] lo, hi; over h^ in its interval and this evaluation) and J(c) ([P, P])."""
    classes, cols = step.lo.shape
    c = center.view(classes, cols)
    zero = torch.zeros(classes, dtype=c.dtype, device=c.device)
    zl, zu, _ = affine_nonneg(step.hl, step.hh, c, c, zero, zero)
    p_lo, p_hi = softmax_bounds(zl, zu)
    d_lo, d_hi = p_lo - step.onehot, p_hi - step.onehot
    rl, rh = product_nonneg(d_lo[:, :, None], d_hi[:, :, None], step.hl[:, None, :], step.hh[:, None, :])
    mag = torch.maximum(d_lo.abs(), d_hi.abs())[:, :, None] * step.hh[:, None, :]
    g_lo, g_hi = removal_mean_bounds(RowBounds(rl, rh, mag), 0)
    h = (step.hl + step.hh) / 2
    a = _jacobian_factors(torch.softmax(h @ c.T, dim=1))
    jac = torch.einsum("bcd,bj,bl->cjdl", a, h, h) / h.shape[0]
    return g_lo.flatten(), g_hi.flatten(), jac.reshape(classes * cols, classes * cols)


def _removal_effect(step: LastLayerStep, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[P] bounds on Delta_R = g_R - g for every removal of j <= k < m rows, anywhere in the box."""
    m = step.hl.shape[0]
    mean_lo = step.rows_lo.sum(0) / m
    mean_hi = step.rows_hi.sum(0) / m
    mag = step.g_mag.amax(0)
    mean_lo, mean_hi = mean_lo - gamma(m + 2) * mag, mean_hi + gamma(m + 2) * mag
    v_lo = mean_lo - step.rows_hi.amax(0)  # g - g_b, for any row b
    v_hi = mean_hi - step.rows_lo.amin(0)
    t = (k / (m - k)) * (1 + 4 * U)  # j / (m - j) <= k / (m - k); 0 when nothing is removed
    return (t * v_lo.clamp(max=0)).flatten(), (t * v_hi.clamp(min=0)).flatten()


def _float32_gradient_error(step: LastLayerStep) -> torch.Tensor:
    """[P] a bound on |T's float32 batch gradient - the exact one| anywhere in the box: its logits
    (an error of eps in every logit moves p_c by at most eps / 2; eps is allowed in full), the
    softmax, the products and the weighted sum."""
    m, classes = step.p_lo.shape
    p_err = (2 * classes + SOFTMAX_ULPS) * U + step.eps.amax(1, keepdim=True)  # [m, 1]
    row = p_err[:, :, None] * step.hh[:, None, :] + gamma(2) * step.g_mag + ETA
    return (row.amax(0) * (1 + gamma(2)) + gamma(m + 3) * step.g_mag.amax(0) + (m + 3) * ETA).flatten()


def _reduce(generators: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the `keep` generators with the largest ||g||_1 - ||g||_inf, the box radius of the rest)."""
    if generators.shape[1] <= keep:
        return generators, torch.zeros(generators.shape[0], dtype=generators.dtype, device=generators.device)
    a = generators.abs()
    score = a.sum(0) - a.amax(0)
    order = torch.argsort(score, descending=True)
    rest = a[:, order[keep:]].sum(1)
    return generators[:, order[:keep]], rest * (1 + gamma(generators.shape[1]))


def zonotope_update(
    z: Zonotope, step: LastLayerStep, *, k: int, lr: float, weight_decay: float, max_generators: int
) -> Zonotope | None:
    """The zonotope holding theta' for every theta in z and in the step's box, and every removal of
    up to k rows; None where the batch may be emptied (k >= m)."""
    m = step.hl.shape[0]
    if k >= m:
        return None
    decay = 1.0 - lr * weight_decay
    size = z.center.shape[0]
    g_lo, g_hi, jac = _point_gradient(step, z.center)
    # the mean-value remainder needs the Jacobian on every segment from c to a theta in the box:
    # over the box, widened to hold c where the box (an intersection) does not
    c = z.center.view(step.lo.shape)
    segments = (
        step
        if bool(((c >= step.lo) & (c <= step.hi)).all())
        else enclose(step.hl, step.hh, torch.minimum(step.lo, c), torch.maximum(step.hi, c), step.onehot)
    )
    j_lo, j_hi = _interval_jacobian(segments)
    # |theta - c| for theta in Z and in the box
    box_lo, box_hi = step.lo.flatten(), step.hi.flatten()
    dev_lo, dev_hi = z.deviation()
    reach = torch.minimum(
        torch.maximum(-dev_lo, dev_hi), torch.maximum(box_hi - z.center, z.center - box_lo).clamp(min=0)
    )
    rho = torch.maximum((j_hi - jac).abs(), (jac - j_lo).abs()) @ reach * (1 + gamma(size + 1)) + size * ETA
    err = _float32_gradient_error(step)
    # the gradient's enclosure without the removal: mid + [-spread, spread]
    low, high = g_lo - rho - err, g_hi + rho + err
    mid = (low + high) / 2
    spread = torch.maximum(high - mid, mid - low) + gamma(4) * (g_lo.abs() + g_hi.abs() + rho + err)
    center = decay * z.center - lr * mid
    step_matrix = decay * torch.eye(size, dtype=jac.dtype, device=jac.device) - lr * jac
    # this float64 arithmetic: step_matrix (no cancellation beyond decay + lr |J|) and the products
    bound = decay * torch.eye(size, dtype=jac.dtype, device=jac.device) + lr * jac.abs()
    moved = step_matrix @ z.generators
    arithmetic = (
        gamma(size + 3) * (bound @ z.generators.abs()).sum(1)
        + gamma(3) * (center.abs() + decay * z.center.abs() + lr * mid.abs())
        + ETA * (z.generators.shape[1] + 1)
    )
    removals = []
    for offset, gens in z.removals:  # earlier removal effects of this epoch move with the step
        removals.append((step_matrix @ offset, step_matrix @ gens))
        arithmetic = arithmetic + gamma(size + 3) * (bound @ offset.abs() + (bound @ gens.abs()).sum(1))
    # removing rows at this step adds -lr Delta, Delta in [d_lo, d_hi] (0 included)
    d_lo, d_hi = _removal_effect(step, k)
    d_mid = (d_lo + d_hi) / 2
    d_rad = (torch.maximum(d_hi - d_mid, d_mid - d_lo) + gamma(2) * (d_lo.abs() + d_hi.abs())) * lr * (1 + 2 * U)
    removals.append((-lr * d_mid, torch.diag(d_rad)))
    pmax = torch.maximum(box_lo.abs(), box_hi.abs())
    gmax = torch.maximum(step.rows_lo.abs(), step.rows_hi.abs()).amax(0).flatten() + err
    r_lo, r_hi = Zonotope(center, moved, removals)._removal_hull()
    newmax = (center.abs() + moved.abs().sum(1) + lr * spread + torch.maximum(-r_lo, r_hi)) * (
        1 + gamma(moved.shape[1] + 4)
    )
    rounding = update_radius(decay, lr, weight_decay, pmax, gmax, newmax)
    kept, boxed = _reduce(moved, max_generators - size)
    radius = (lr * spread + arithmetic + rounding + boxed) * (1 + 4 * U) + ETA
    out = Zonotope(center, torch.cat([kept, torch.diag(radius)], dim=1), removals)
    if len(removals) * size * size > FOLD_ELEMENTS:
        out.end_epoch()
    return out
