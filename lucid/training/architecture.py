"""Architectures `lucid train` supports, and their torch-default initialisation.

`ReferenceNet` is the plain single-network torch module that defines the architecture and the
initial parameters (torch's default init, drawn under `seed`); its state-dict names are exactly
the tensor names of `networks.safetensors` (`conv.{j}.*`, `layers.{i}.*`). Three kinds: the MLP,
the paper's 1-D CNN (`cnn`) and 2-D CNNs given as a layer list (`cnn2d`, `lucid.training.layer_spec`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from lucid.convolution import conv2d_output_hw
from lucid.errors import LucidError
from lucid.training.layer_spec import is_layer_spec, parse_input_shape, parse_layer_spec

CNN_SPEC: dict[str, Any] = {"type": "cnn", "conv_channels": [6, 6], "kernel_size": 3, "hidden": [2]}


def parse_arch(arch: str, input_shape: str | Sequence[int] | None = None) -> dict:
    """'2x50' / '3x4' (depth x width), '50,20' (widths), '50', 'cnn', or a layer list such as
    'conv(8,3,pad=1),fc(32)' with `input_shape` C,H,W -> run.json architecture."""
    shape = parse_input_shape(input_shape)
    if is_layer_spec(arch):
        return parse_layer_spec(arch, shape)
    if shape is not None:
        raise LucidError(f"--input-shape is for conv(...) layer lists; --arch '{arch}' does not take one")
    text = arch.strip().lower()
    if text == "cnn":
        return dict(CNN_SPEC, conv_channels=list(CNN_SPEC["conv_channels"]), hidden=list(CNN_SPEC["hidden"]))
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m:
        depth, width = int(m.group(1)), int(m.group(2))
        hidden = [width] * depth
    elif re.fullmatch(r"\d+(,\d+)*", text):
        hidden = [int(w) for w in text.split(",")]
    else:
        raise LucidError(
            f"unknown architecture '{arch}' (use e.g. 2x50, 3x4, 50,20, cnn, or conv(8,3),fc(32) with --input-shape)"
        )
    if not hidden or min(hidden) < 1:
        raise LucidError(f"architecture '{arch}' needs at least one hidden layer of width >= 1")
    return {"type": "mlp", "hidden": hidden}


def check_arch_fits(spec: dict, input_dim: int) -> None:
    if spec["type"] == "cnn":
        shrink = len(spec["conv_channels"]) * (spec["kernel_size"] - 1)
        if input_dim - shrink < 1:
            raise LucidError(f"the cnn architecture needs at least {shrink + 1} features, the data has {input_dim}")
    if spec["type"] == "cnn2d":
        shape = spec["input_shape"]
        if math.prod(shape) != input_dim:
            raise LucidError(
                f"--input-shape {','.join(map(str, shape))} has {math.prod(shape)} values, but the data "
                f"has {input_dim} features (an image's C-H-W flattening)"
            )


class ReferenceNet(nn.Module):
    """One network of the given architecture: [B, d] -> [B, C] scores."""

    def __init__(self, spec: dict, input_dim: int, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.ModuleList()
        self.image: tuple[int, int, int] | None = None  # a 2-D CNN's input shape (C, H, W)
        width = input_dim
        if spec["type"] == "cnn2d":
            self.image = tuple(spec["input_shape"])
            channels, height, breadth = self.image
            for layer in spec["conv"]:
                conv = nn.Conv2d(
                    channels, layer["channels"], layer["kernel"], stride=layer["stride"], padding=layer["pad"]
                )
                self.conv.append(conv)
                channels = layer["channels"]
                height, breadth = conv2d_output_hw(
                    height, breadth, (layer["kernel"],) * 2, layer["stride"], layer["pad"]
                )
            width = channels * height * breadth
        elif spec["type"] == "cnn":
            k = spec["kernel_size"]
            channels = 1
            for c in spec["conv_channels"]:
                self.conv.append(nn.Conv1d(channels, c, k))
                channels, width = c, width - k + 1
            width *= channels
        sizes = [width] + list(spec["hidden"]) + [num_classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.conv):
            x = x.unflatten(1, self.image) if self.image is not None else x.unsqueeze(1)
            for conv in self.conv:
                x = torch.relu(conv(x))
            x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def reference_net(spec: dict, input_dim: int, num_classes: int, seed: int) -> ReferenceNet:
    """The initial network of algorithm T: torch default init under torch.manual_seed(seed).

    The global RNG is restored afterwards so callers' randomness is unaffected.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ReferenceNet(spec, input_dim, num_classes)


def initial_parameters(spec: dict, input_dim: int, num_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """Float32 initial parameters by safetensors name, in layer order."""
    net = reference_net(spec, input_dim, num_classes, seed)
    return {name: p.detach().clone().float() for name, p in net.state_dict().items()}
