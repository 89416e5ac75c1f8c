"""Adam for the bound optimisations and the leak search, without `torch.optim`.

Constructing any `torch.optim` optimiser imports `torch._dynamo` (about 1.7 s and 300 MB of
modules), and every verification worker process would pay that on its first bound. This class does
the update of `torch.optim.Adam`'s default CPU path (single tensor, no weight decay, no amsgrad) op
for op, so its iterates are bit-identical to it (`tests/training/test_adam.py` compares the two).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class Adam:
    """`torch.optim.Adam(params, lr, betas, eps)`'s update; `params` is a list of tensors or of
    parameter groups (`{"params": [...], "lr": ...}`), as for torch's."""

    def __init__(
        self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        self.groups: list[dict[str, Any]] = [
            {"params": list(g["params"]), "lr": float(g.get("lr", lr))} for g in params
        ]
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.state: dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}

    def zero_grad(self) -> None:
        for group in self.groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.beta1, self.beta2
        for group in self.groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                m, v, count = self.state.setdefault(
                    id(p),
                    (
                        torch.zeros_like(p, memory_format=torch.preserve_format),
                        torch.zeros_like(p, memory_format=torch.preserve_format),
                        [0],
                    ),
                )
                count[0] += 1
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                step = float(count[0])  # torch keeps the count as a float tensor
                denom = (v.sqrt() / (1 - b2**step) ** 0.5).add_(self.eps)
                p.addcdiv_(m, denom, value=-(group["lr"] / (1 - b1**step)))
