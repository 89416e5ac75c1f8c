"""Single torch modules for the run architectures, reused from the training harness.

`lucid.training.architecture.ReferenceNet` is the plain one-network module that defines the
run's architecture (its state-dict names are the `networks.safetensors` names), so a baseline
trains exactly the architecture of the LUCID run it is compared with. This module only
accepts a run.json `architecture` object as well as an arch string.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lucid.errors import LucidError
from lucid.training.architecture import CNN_SPEC, ReferenceNet, check_arch_fits, parse_arch


def parse_architecture(arch: str | dict) -> dict:
    """'2x50' / 'cnn' / a run.json `architecture` object (also a 2-D CNN's) -> a normalised architecture dict."""
    if not isinstance(arch, dict):
        return parse_arch(str(arch))
    kind = arch.get("type", "mlp")
    spec: dict[str, Any]
    try:
        if kind == "mlp":
            spec = {"type": "mlp", "hidden": [int(h) for h in arch.get("hidden", [])]}
        elif kind == "cnn2d":  # re-parsed from its spec: the same checks as `lucid train`
            return parse_arch(str(arch["spec"]), arch["input_shape"])
        elif kind == "cnn":
            spec = {
                "type": "cnn",
                "conv_channels": [int(c) for c in arch.get("conv_channels", CNN_SPEC["conv_channels"])],
                "kernel_size": int(arch.get("kernel_size", CNN_SPEC["kernel_size"])),
                "hidden": [int(h) for h in arch.get("hidden", CNN_SPEC["hidden"])],
            }
        else:
            raise LucidError(f"unknown architecture type {kind!r} (expected 'mlp', 'cnn' or 'cnn2d')")
    except (KeyError, TypeError, ValueError):
        raise LucidError(f"malformed architecture {arch!r}") from None
    if not spec["hidden"] or min(spec["hidden"]) < 1:
        raise LucidError(f"architecture {arch!r} needs at least one hidden layer of width >= 1")
    return spec


def build_model(arch: str | dict, input_dim: int, num_classes: int) -> nn.Module:
    """A freshly initialised (float32, torch default init) module of the given architecture."""
    spec = parse_architecture(arch)
    check_arch_fits(spec, input_dim)
    return ReferenceNet(spec, input_dim, num_classes)
