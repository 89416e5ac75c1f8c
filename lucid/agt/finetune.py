"""Concrete float32 training of T's fine-tuning variant: only some layers are trained.

The same algorithm as T (batch order, masked rows, SGD with weight decay, float32) except that
the optimiser is given only the layers in `trainable`; the others keep their initial values
(e.g. a model pre-trained on public data). With every layer trainable this is T itself, run by
the trainer's own kernels. `abstract_train(..., trainable=...)` bounds exactly this algorithm;
the benchmark and the tests use this to check containment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lucid.training.vectorized import _sgd_update, dense_gradients, sample_weights


@torch.no_grad()
def train_partial(
    init: dict[str, torch.Tensor], spec: dict, X: torch.Tensor, y: torch.Tensor, removed: torch.Tensor,
    orders: torch.Tensor, *, lr: float, weight_decay: float, batch_size: int, num_classes: int,
    trainable: set[int] | None = None,
) -> dict[str, torch.Tensor]:
    """len(removed) networks (removed[k] = row left out, -1 = none), stacked; MLPs only."""
    n_layers = len(spec["hidden"]) + 1
    trainable = set(range(n_layers)) if trainable is None else set(trainable)
    k = len(removed)
    params = {name: p.unsqueeze(0).repeat((k,) + (1,) * p.ndim).contiguous() for name, p in init.items()}
    weights = [params[f"layers.{i}.weight"] for i in range(n_layers)]
    biases = [params[f"layers.{i}.bias"] for i in range(n_layers)]
    onehot_all = F.one_hot(y, num_classes).to(torch.float32)
    n = X.shape[0]
    for epoch in range(orders.shape[0]):
        for start in range(0, n, batch_size):
            rows = orders[epoch][start : start + batch_size]
            grads = dense_gradients(weights, biases, X[rows], onehot_all[rows], sample_weights(removed, rows))
            chosen = [i for i in range(n_layers) if i in trainable]
            _sgd_update([t for i in chosen for t in (weights[i], biases[i])],
                        [g for i in chosen for g in (grads[2 * i], grads[2 * i + 1])], lr, weight_decay)
    return params
