"""Torch modules for the run architectures ("2x50"-style MLPs and the paper's 1-D CNN).

Written here because the training harness trains its networks vectorised (many networks at
once) and offers no single-network module; DP-SGD needs a plain `nn.Module` that Opacus can
wrap. Layer shapes match the run contract (`lucid.network`), so a baseline model has exactly
the architecture of the LUCID run it is compared with.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from lucid.errors import LucidError

_MLP = re.compile(r"^(\d+)x(\d+)$")


def parse_architecture(arch: str | dict) -> dict:
    """'2x50' / 'cnn' / a run.json `architecture` object -> a normalised architecture dict."""
    if isinstance(arch, dict):
        kind = arch.get("type", "mlp")
        if kind == "mlp":
            return {"type": "mlp", "hidden": [int(h) for h in arch.get("hidden", [])]}
        if kind == "cnn":
            return {
                "type": "cnn",
                "conv_channels": [int(c) for c in arch.get("conv_channels", [6, 6])],
                "kernel_size": int(arch.get("kernel_size", 3)),
                "hidden": [int(h) for h in arch.get("hidden", [2])],
            }
        raise LucidError(f"unknown architecture type {kind!r} (expected 'mlp' or 'cnn')")
    text = str(arch).strip().lower()
    if text == "cnn":
        return {"type": "cnn", "conv_channels": [6, 6], "kernel_size": 3, "hidden": [2]}
    match = _MLP.match(text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise LucidError(f"unknown architecture {arch!r} (expected e.g. '2x50' or 'cnn')")
    return {"type": "mlp", "hidden": [int(match.group(2))] * int(match.group(1))}


class Conv1dNet(nn.Module):
    """1 input channel of length d -> valid ReLU convolutions -> channel-major flatten -> MLP."""

    def __init__(self, input_dim: int, num_classes: int, channels: list[int], kernel: int, hidden: list[int]):
        super().__init__()
        convs, c_in, length = [], 1, input_dim
        for c_out in channels:
            convs.append(nn.Conv1d(c_in, c_out, kernel))
            c_in, length = c_out, length - kernel + 1
            if length < 1:
                raise LucidError(f"the CNN needs inputs of length >= {len(channels) * (kernel - 1) + 1}, got {input_dim}")
        self.conv = nn.ModuleList(convs)
        self.layers = nn.ModuleList(_dense_layers(c_in * length, hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)
        for conv in self.conv:
            h = torch.relu(conv(h))
        h = h.flatten(1)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


class MLP(nn.Module):
    def __init__(self, input_dim: int, num_classes: int, hidden: list[int]):
        super().__init__()
        self.layers = nn.ModuleList(_dense_layers(input_dim, hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


def _dense_layers(width: int, hidden: list[int], num_classes: int) -> list[nn.Linear]:
    sizes = [width] + list(hidden) + [num_classes]
    return [nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]


def build_model(arch: str | dict, input_dim: int, num_classes: int) -> nn.Module:
    """A freshly initialised (float32) module of the given architecture."""
    spec = parse_architecture(arch)
    if spec["type"] == "mlp":
        return MLP(input_dim, num_classes, spec["hidden"])
    return Conv1dNet(input_dim, num_classes, spec["conv_channels"], spec["kernel_size"], spec["hidden"])
