"""Prediction stability over AGT boxes: which test predictions no k-removal network can change.

A prediction of N at x is *certified stable at distance k* when interval propagation of x through
the k-removal box (every parameter in [lower, upper]) leaves one class whose lower score beats every
other class's upper score: every network training can reach from D without up to k rows then gives
that class at x. The propagation is `affine_nonneg`, which widens every sum outward by its float64
rounding bound, so the certificate is sound in floating point. (MLP boxes only.)
"""

from __future__ import annotations

import numpy as np
import torch

from lucid.agt.gradients import affine_nonneg
from lucid.agt.train import AgtBox
from lucid.errors import LucidError


def _layers(box: AgtBox) -> int:
    n = 0
    while f"layers.{n}.weight" in box.lower:
        n += 1
    if n == 0 or any(name.startswith("conv.") for name in box.lower):
        raise LucidError("prediction stability is implemented for MLP boxes only")
    return n


def certified_classes(box: AgtBox, X: np.ndarray | torch.Tensor) -> np.ndarray:
    """[rows]: the class every network in the box predicts at each input, or -1 where none is certain."""
    x = torch.as_tensor(np.asarray(X, dtype=np.float64))
    lo = hi = x
    n = _layers(box)
    for i in range(n):
        w, b = f"layers.{i}.weight", f"layers.{i}.bias"
        zl, zu, _ = affine_nonneg(lo, hi, box.lower[w], box.upper[w], box.lower[b], box.upper[b])
        lo, hi = (zl.clamp(min=0), zu.clamp(min=0)) if i < n - 1 else (zl, zu)
    out = np.full(len(x), -1, dtype=np.int64)
    for c in range(lo.shape[1]):
        rivals = torch.cat([hi[:, :c], hi[:, c + 1 :]], dim=1).amax(dim=1)
        out[(lo[:, c] > rivals).numpy()] = c
    return out


def stable_distances(boxes: dict[int, AgtBox], X: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """[rows]: the largest k among the boxes at which the given prediction is certified stable (0: none).

    Box k contains every network reachable with *up to* k removals, so one certified k covers all
    smaller ones; no nesting of the stored boxes is assumed."""
    predictions = np.asarray(predictions)
    best = np.zeros(len(predictions), dtype=np.int64)
    for k in sorted(boxes):
        certified = certified_classes(boxes[k], X) == predictions
        best[certified] = np.maximum(best[certified], k)
    return best
