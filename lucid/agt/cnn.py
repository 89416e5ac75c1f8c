"""Per-row gradient bounds of LUCID's 1-D CNN over a parameter box.

The CNN is run, as the trainer does, through its dense (Toeplitz) lowering: a valid
convolution with kernel K is the matrix D(K) whose entries are kernel entries or exact zeros.
Lowering the lower and the upper kernel gives an interval matrix that contains D(K) for every K
in the box (each kernel entry is repeated, and interval propagation treats the copies
independently: sound, and looser than exact). The per-row dense gradients are folded back onto
the kernels exactly as the trainer folds them, dL/dK[o, c, j] = sum_p dL/dD[(o, p), (c, p + j)],
dL/db[o] = sum_p dL/db_D[(o, p)], as interval sums with their rounding allowance.
"""

from __future__ import annotations

import torch

from lucid.agt.gradients import DenseBox, RowBounds, row_gradient_bounds
from lucid.agt.rounding import widen_sum


def conv_names(spec: dict) -> list[str]:
    return [f"conv.{j}.{t}" for j in range(len(spec["conv_channels"])) for t in ("weight", "bias")]


def lower_conv(kernel: torch.Tensor, bias: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense [c_out * L', c_in * length] matrix and [c_out * L'] bias of a valid 1-D convolution."""
    c_out, c_in, ksize = kernel.shape
    out_len = length - ksize + 1
    dense = torch.zeros(c_out, out_len, c_in, length, dtype=kernel.dtype)
    for p in range(out_len):
        dense[:, p, :, p : p + ksize] = kernel
    return dense.reshape(c_out * out_len, c_in * length), bias[:, None].expand(c_out, out_len).reshape(-1)


def _fold(rb: RowBounds, c_out: int, c_in: int, ksize: int, length: int) -> RowBounds:
    out_len = length - ksize + 1
    b = rb.lo.shape[0]
    parts = []
    for t in (rb.lo, rb.hi, rb.mag):
        d = t.reshape(b, c_out, out_len, c_in, length)
        parts.append(torch.stack([sum(d[:, :, p, :, p + j] for p in range(out_len)) for j in range(ksize)], dim=3))
    lo, hi = widen_sum(parts[0], parts[1], parts[2], out_len)
    return RowBounds(lo, hi, parts[2])


def _fold_bias(rb: RowBounds, c_out: int, out_len: int) -> RowBounds:
    b = rb.lo.shape[0]
    lo, hi, mag = (t.reshape(b, c_out, out_len).sum(2) for t in (rb.lo, rb.hi, rb.mag))
    lo, hi = widen_sum(lo, hi, mag, out_len)
    return RowBounds(lo, hi, mag)


def cnn_row_gradient_bounds(
    lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor], spec: dict, x: torch.Tensor, onehot: torch.Tensor
) -> list[tuple[RowBounds, int]]:
    """(per-row bounds, extra summed terms in T's float32 batch gradient) for conv.* then layers.*."""
    n_conv = len(spec["conv_channels"])
    n_dense = len(spec["hidden"]) + 1
    wl, wu, bl, bu, shapes = [], [], [], [], []
    length = x.shape[1]
    for j in range(n_conv):
        lo_k, hi_k = lower[f"conv.{j}.weight"], upper[f"conv.{j}.weight"]
        dl, dbl = lower_conv(lo_k, lower[f"conv.{j}.bias"], length)
        du, dbu = lower_conv(hi_k, upper[f"conv.{j}.bias"], length)
        wl.append(dl)
        wu.append(du)
        bl.append(dbl)
        bu.append(dbu)
        shapes.append((lo_k.shape[0], lo_k.shape[1], lo_k.shape[2], length))
        length = length - lo_k.shape[2] + 1
    for i in range(n_dense):
        wl.append(lower[f"layers.{i}.weight"])
        wu.append(upper[f"layers.{i}.weight"])
        bl.append(lower[f"layers.{i}.bias"])
        bu.append(upper[f"layers.{i}.bias"])
    grads = row_gradient_bounds(DenseBox(wl, wu, bl, bu), x, onehot)
    out: list[tuple[RowBounds, int]] = []
    for j, (c_out, c_in, ksize, length) in enumerate(shapes):
        out_len = length - ksize + 1
        # T folds after the batch sum: its float32 error is gamma over m + L' terms (see removal_mean_bounds)
        out.append((_fold(grads[2 * j], c_out, c_in, ksize, length), out_len))
        out.append((_fold_bias(grads[2 * j + 1], c_out, out_len), out_len))
    out += [(rb, 0) for rb in grads[2 * n_conv :]]
    return out
