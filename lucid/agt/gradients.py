"""Sound per-row bounds on the cross-entropy gradient of an MLP over a box of parameters.

For every row b of a batch and every parameter vector theta in the box [theta_L, theta_U],
`row_gradient_bounds` returns intervals that contain d CE(f_theta(x_b), y_b) / d theta as
algorithm T computes it in float32 (see `lucid.agt.rounding`): an interval forward pass
(interval bound propagation with parameter intervals), exact interval bounds on the softmax,
and an interval backward pass (ReLU derivative as an interval {0, 1}).

Layout: activations are [B, features]; parameter gradients carry a leading batch axis,
[B, out, in] for weights and [B, out] for biases. Inputs must be non-negative (LUCID's
domain is [0, 1]^d), which lets every forward product use the exact sign-split formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lucid.agt.rounding import SOFTMAX_ULPS, U, gamma, outward, widen_sum


@dataclass
class RowBounds:
    """lo/hi: interval per row and coordinate; mag: a bound on |value| used for rounding allowances."""

    lo: torch.Tensor
    hi: torch.Tensor
    mag: torch.Tensor


def affine_nonneg(al, au, wl, wu, bl, bu):
    """Interval of W a + b for a in [al, au] >= 0 ([B, n]), W in [wl, wu] ([o, n]), b in [bl, bu]."""
    wlp, wln = wl.clamp(min=0), wl.clamp(max=0)
    wup, wun = wu.clamp(min=0), wu.clamp(max=0)
    lo = al @ wlp.T + au @ wln.T + bl
    hi = au @ wup.T + al @ wun.T + bu
    wabs = torch.maximum(wl.abs(), wu.abs())
    mag = au @ wabs.T + torch.maximum(bl.abs(), bu.abs())
    lo, hi = widen_sum(lo, hi, mag, wl.shape[1] + 1)
    return lo, hi, mag


def interval_product(al, au, bl, bu):
    """Exact elementwise interval product [a] * [b] (broadcasting)."""
    c1, c2, c3, c4 = al * bl, al * bu, au * bl, au * bu
    lo = torch.minimum(torch.minimum(c1, c2), torch.minimum(c3, c4))
    hi = torch.maximum(torch.maximum(c1, c2), torch.maximum(c3, c4))
    return lo, hi


def product_nonneg(dl, du, al, au):
    """Exact elementwise interval product [d] * [a] with a >= 0 (broadcasting)."""
    lo = torch.where(dl >= 0, dl * al, dl * au)
    hi = torch.where(du >= 0, du * au, du * al)
    return lo, hi


def softmax_bounds(zl: torch.Tensor, zu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on softmax(z) for z in [zl, zu] ([B, C]), enclosing T's float32 softmax.

    p_i = 1 / (1 + sum_{j != i} exp(z_j - z_i)): each term is monotone in z_j and z_i separately,
    so the bounds below are exact in real arithmetic; the margin covers the float32 softmax
    (exp, the max shift, the sum and the division; absolute error <= (2C + SOFTMAX_ULPS) u32)
    and this float64 evaluation.
    """
    c = zl.shape[1]
    diag = torch.eye(c, dtype=torch.bool, device=zl.device)
    up = torch.exp(zu[:, None, :] - zl[:, :, None]).masked_fill(diag, 0.0)  # [B, i, j]: exp(zu_j - zl_i), j != i
    dn = torch.exp(zl[:, None, :] - zu[:, :, None]).masked_fill(diag, 0.0)
    p_lo = 1.0 / (1.0 + up.sum(2))
    p_hi = 1.0 / (1.0 + dn.sum(2))
    margin = (2 * c + SOFTMAX_ULPS) * U
    return (p_lo - margin).clamp(min=0.0), (p_hi + margin).clamp(max=1.0)


@dataclass(frozen=True, eq=False)  # tensors: compared by identity
class DenseBox:
    """A box of dense ReLU layers' parameters: W_i in [wl[i], wu[i]] ([out, in]), b_i in [bl[i], bu[i]].

    The four lists go together to every interval pass over the layers (forward and backward)."""

    wl: list[torch.Tensor]
    wu: list[torch.Tensor]
    bl: list[torch.Tensor]
    bu: list[torch.Tensor]

    @classmethod
    def of_layers(cls, lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor], n_layers: int) -> DenseBox:
        """The box of `layers.0` .. `layers.{n_layers - 1}` of [lower, upper] (by safetensors name)."""
        w, b = [f"layers.{i}.weight" for i in range(n_layers)], [f"layers.{i}.bias" for i in range(n_layers)]
        return cls([lower[n] for n in w], [upper[n] for n in w], [lower[n] for n in b], [upper[n] for n in b])

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's (w_lo, w_hi, b_lo, b_hi), the argument order of `affine_nonneg` and `last_layer_step`."""
        return self.wl[i], self.wu[i], self.bl[i], self.bu[i]


def forward_bounds(
    box: DenseBox,
    x: torch.Tensor,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Interval forward pass over the box: post-activation intervals a_0 = x, ..., a_{L-1} (each
    containing T's float32 activation) and pre-activation intervals z_1..z_L."""
    acts = [(x, x)]
    pre = []
    for i in range(len(box.wl)):
        al, au = acts[-1]
        zl, zu, _ = affine_nonneg(al, au, *box.layer(i))
        pre.append((zl, zu))
        if i < len(box.wl) - 1:
            acts.append((zl.clamp(min=0), zu.clamp(min=0)))
    return acts, pre


def row_gradient_bounds(
    box: DenseBox,
    x: torch.Tensor,
    onehot: torch.Tensor,
    *,
    first_layer: int = 0,
    forward: tuple[list, list] | None = None,
) -> list[RowBounds | None]:
    """Per-row gradient intervals [dW0, db0, dW1, db1, ...] (float64) over the parameter box.

    `first_layer`: the backward pass stops there (layers below it get None: not trained).
    `forward`: the caller's `forward_bounds(box, x)`, when it has it already.
    """
    wl, wu = box.wl, box.wu
    n_layers = len(wl)
    acts, pre = forward_bounds(box, x) if forward is None else forward
    p_lo, p_hi = softmax_bounds(*pre[-1])
    # d CE / d logits = softmax - onehot (the sample weight is applied to the batch mean)
    dl, du = p_lo - onehot, p_hi - onehot
    grads: list[RowBounds | None] = [None] * (2 * n_layers)
    for i in range(n_layers - 1, -1, -1):
        al, au = acts[i]
        # dW_i[b] = delta_b a_b^T with a >= 0: one product per entry
        gl, gh = product_nonneg(dl[:, :, None], du[:, :, None], al[:, None, :], au[:, None, :])
        dmag = torch.maximum(dl.abs(), du.abs())
        gmag = dmag[:, :, None] * au[:, None, :]
        gl, gh = widen_sum(gl, gh, gmag, 1)
        grads[2 * i] = RowBounds(gl, gh, gmag)
        grads[2 * i + 1] = RowBounds(dl, du, dmag)
        if i <= first_layer:
            break
        # g = W_i^T delta: sum over the layer's outputs of interval products
        pl, ph = interval_product(wl[i][None, :, :], wu[i][None, :, :], dl[:, :, None], du[:, :, None])
        wabs = torch.maximum(wl[i].abs(), wu[i].abs())
        mag = dmag @ wabs  # [B, in]
        sl, sh = widen_sum(pl.sum(1), ph.sum(1), mag, wl[i].shape[0])
        # ReLU derivative of the previous layer: 1 if z > 0 (torch's threshold_backward), else 0
        zl, zu = pre[i - 1]
        on, off = zl > 0, zu <= 0
        dl = torch.where(on, sl, torch.where(off, torch.zeros_like(sl), sl.clamp(max=0)))
        du = torch.where(on, sh, torch.where(off, torch.zeros_like(sh), sh.clamp(min=0)))
    return grads


def removal_mean_bounds(rb: RowBounds, k: int, extra_terms: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on the batch-mean gradient with any j <= k of the batch's m rows removed.

    Removing j rows leaves a mean over m - j rows; its upper bound is the mean of the m - j
    largest per-row upper bounds (drop the j smallest). The mean of the r largest values does
    not increase with r, so the maximum over j = 0..min(k, m - 1) is the mean of the
    r = max(m - k, 1) largest; symmetrically for the lower bound. If k >= m the whole batch may
    be removed: T then uses a zero loss gradient, so 0 joins the interval. Rows removed in
    other batches do not change this batch. The float32 weighted sum of T (weights 1/(m - j),
    rounded) errs by at most gamma_{m+3} * max_b |row b|; that and this float64 sum are added.
    `extra_terms`: further float32 summation T does on the batch sum (the CNN's kernel fold).
    """
    m = rb.lo.shape[0]
    r = max(m - k, 1)
    if r == 1:  # the mean of the single largest value
        hi, lo = rb.hi.amax(0), rb.lo.amin(0)
        own = torch.maximum(hi.abs(), lo.abs())
    else:  # sum of the r largest = sum of all - sum of the m - r smallest (cheap for small k)
        drop = m - r
        hi_sum, lo_sum = rb.hi.sum(0), rb.lo.sum(0)
        if drop:
            hi_sum = hi_sum - torch.topk(rb.hi, drop, dim=0, largest=False).values.sum(0)
            lo_sum = lo_sum - torch.topk(rb.lo, drop, dim=0).values.sum(0)
        hi, lo = hi_sum / r, lo_sum / r
        # this float64 evaluation: gamma_{m+drop+2} * (sum of all |terms|) / r
        own = (m / r) * torch.maximum(rb.hi.abs(), rb.lo.abs()).amax(0)
    if k >= m:
        hi = hi.clamp(min=0.0)
        lo = lo.clamp(max=0.0)
    radius = gamma(m + extra_terms + 3) * rb.mag.amax(0) + gamma(2 * m + 2) * own
    return outward(lo, hi, radius + 1e-30)
