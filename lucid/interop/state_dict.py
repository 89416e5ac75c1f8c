"""Dense ReLU networks from PyTorch state dicts: `.pt` / `.pth` (read with
`torch.load(..., weights_only=True)`, which never runs pickled code) or `.safetensors`, one network
per file or every network in one stacked `.safetensors` file (`StackedStateDicts`).

A state dict holds parameters, not the forward pass, so LUCID reads it as a stack of
`torch.nn.Linear` layers with a ReLU between every two (`nn.Sequential(Linear, ReLU, ...,
Linear)`): every entry must be a `NAME.weight` [out, in] or `NAME.bias` [out], and the layers are
taken in the natural order of their NAMEs (0 < 2 < 10, fc1 < fc2), checked to chain.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open

from lucid.errors import LucidError
from lucid.interop.dense import DenseNet, checked_net, lowered_conv


def read_torch(path: str | Path, conv: ConvSpec | None = None) -> DenseNet:
    """A `.pt` / `.pth` file holding a state dict (`torch.save(model.state_dict(), path)`)."""
    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch's own warnings would add lines to the one error line
            warnings.simplefilter("ignore")
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise LucidError(f"{path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 (unpickling refused, damaged file, ...)
        text = str(exc).strip()
        if "TorchScript" in text:
            raise LucidError(
                f"{path} is a TorchScript archive (torch.jit.save); LUCID reads a state dict "
                "(torch.save(model.state_dict(), path)) or ONNX (torch.onnx.export)"
            ) from None
        # the first sentence only: torch goes on to advise weights_only=False, which runs pickled code
        first = re.split(r"(?<=[.!?])\s", text.splitlines()[0])[0] if text else type(exc).__name__
        raise LucidError(
            f"cannot read {path} with torch.load(weights_only=True) (save model.state_dict(), not the model): {first}"
        ) from None
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise LucidError(f"{path} does not hold a state dict of tensors (save model.state_dict())")
    # numpy has no bfloat16; float32 holds every bfloat16 exactly.
    arrays = {str(k): (v.float() if v.dtype == torch.bfloat16 else v).detach().cpu().numpy() for k, v in obj.items()}
    return from_state_dict(arrays, str(path), conv)


def _safetensors_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with safe_open(str(path), framework="numpy") as fh:
            return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (a safetensors file, not a dict)
    except FileNotFoundError:
        raise LucidError(f"{path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types for damaged files)
        raise LucidError(f"cannot read {path} as safetensors: {exc}") from None


def read_safetensors(path: str | Path, conv: ConvSpec | None = None) -> DenseNet:
    path = Path(path)
    arrays = _safetensors_arrays(path)
    if REMOVED in arrays:
        raise LucidError(
            f"{path} holds a '{REMOVED}' tensor, so it is a stacked file of every network: list it in the "
            'manifest as {"file": ..., "stacked": true}'
        )
    return from_state_dict(arrays, str(path), conv)


REMOVED = "removed"  # a stacked file's [K] vector of left-out rows, -1 for N (as networks.safetensors)


class StackedStateDicts:
    """K networks in one `.safetensors` file: every parameter of the state dict with a leading
    network axis (`NAME.weight` [K, out, in], `NAME.bias` [K, out]), and `removed` [K], the
    training row each network was trained without (-1 for N): what `torch.func.stack_module_state`
    gives for networks trained together with `torch.func.vmap`. The file is read once (it is below
    the import's size cap); each network is taken from it in turn (`network`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        arrays = _safetensors_arrays(self.path)
        removed = arrays.pop(REMOVED, None)
        if removed is None:
            raise LucidError(
                f"{self.path}: a stacked file needs a '{REMOVED}' tensor [networks] of int64 (the training "
                "row each network was trained without, -1 for N); without one, list the file as one "
                'network: {"file": ..., "removed": ROW or null}'
            )
        if removed.ndim != 1 or removed.dtype.kind not in "iu" or len(removed) < 1:
            raise LucidError(
                f"{self.path}: '{REMOVED}' must be a 1-D integer tensor with one row per network "
                f"(-1 for N), got {removed.dtype} {tuple(removed.shape)}"
            )
        if (removed < -1).any():
            raise LucidError(
                f"{self.path}: '{REMOVED}' holds {int(removed.min())}; each entry is a training row (>= 0) or -1 for N"
            )
        for name, value in arrays.items():
            if value.ndim < 1 or value.shape[0] != len(removed):
                raise LucidError(
                    f"{self.path}: '{name}' has shape {tuple(value.shape)}, but '{REMOVED}' lists "
                    f"{len(removed)} networks; every tensor of a stacked file has one entry per network "
                    "along its first axis"
                )
        self.removed = removed.astype(np.int64)
        self._arrays = arrays

    def __len__(self) -> int:
        return len(self.removed)

    def network(self, position: int, conv: ConvSpec | None = None) -> DenseNet:
        """The network at `position` of the file's leading axis."""
        return from_state_dict(
            {name: value[position] for name, value in self._arrays.items()}, f"{self.path} (network {position})", conv
        )


def _natural(name: str) -> list:
    # re.split with a group alternates text and digits, so ints and strings never meet in a comparison
    return [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", name))]


@dataclass(frozen=True)
class ConvSpec:
    """What a state dict of a 2-D CNN cannot say and the manifest's "conv" does: the input image
    [C, H, W] and each convolution's stride and zero padding (the same on every side and axis)."""

    input_shape: tuple[int, int, int]
    strides: tuple[int, ...]
    pads: tuple[int, ...]


CONV_FORM = '"conv": {"input_shape": [C, H, W], "layers": [{"stride": S, "pad": P}, ...]}'


def from_state_dict(arrays: dict[str, np.ndarray], source: str, conv: ConvSpec | None = None) -> DenseNet:
    """The network of a state dict (see the module docstring): Conv2d layers ([out, in, kh, kw]
    weights, lowered as the ONNX reader lowers them, with `conv`'s image, strides and padding),
    flattened C-H-W, then Linear layers, a ReLU after every layer but the last."""
    weights: dict[str, np.ndarray] = {}
    biases: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        prefix, _, kind = name.rpartition(".")
        if kind == "weight" and prefix:
            weights[prefix] = value
        elif kind == "bias" and prefix:
            biases[prefix] = value
        else:
            raise LucidError(
                f"{source}: entry '{name}' {tuple(value.shape)} is not a layer's weight or bias; "
                "LUCID imports Conv2d/Linear/ReLU stacks only (fold a batch norm into the layer "
                "before it, or export the model to ONNX)"
            )
    stray = sorted(set(biases) - set(weights))
    if stray:
        raise LucidError(f"{source}: '{stray[0]}.bias' has no weight beside it")
    for prefix, w in weights.items():
        if w.ndim not in (2, 4):
            raise LucidError(
                f"{source}: '{prefix}.weight' has shape {tuple(w.shape)}; LUCID imports Linear "
                "([out, in]) and Conv2d ([out, in, kh, kw]) layers only"
            )
    # the convolutions come first whatever their names (LUCID's CNNs are Conv2d layers, a flatten,
    # then Linear layers), each group in the natural order of its names
    convs = sorted((p for p in weights if weights[p].ndim == 4), key=_natural)
    order = convs + sorted((p for p in weights if weights[p].ndim == 2), key=_natural)
    bs = [biases[p] if p in biases else np.zeros(weights[p].shape[0], dtype=weights[p].dtype) for p in order]
    where = f"{source} (layers in the order {', '.join(order)})"
    if conv is not None and not convs:
        raise LucidError(f'{where}: the manifest gives "conv" but this state dict has no convolution')
    if not convs:
        return checked_net([weights[p] for p in order], bs, where)
    if conv is None:
        raise LucidError(
            f"{source}: '{convs[0]}.weight' {tuple(weights[convs[0]].shape)} is a convolution's kernel, "
            "and a state dict does not say the image size, strides or padding: give them in the "
            f"manifest ({CONV_FORM}), or export the model to ONNX (torch.onnx.export)"
        )
    if len(convs) != len(conv.strides):
        raise LucidError(
            f'{where}: {len(convs)} convolutions, but the manifest\'s "conv" describes {len(conv.strides)}'
        )
    ws, kinds, layers, image = [], [], [], conv.input_shape
    for j, prefix in enumerate(convs):
        try:
            w, b, kind, image, layer = lowered_conv(weights[prefix], bs[j], image, conv.strides[j], conv.pads[j])
        except LucidError as exc:
            raise LucidError(f"{where}: convolution '{prefix}' {exc}") from None
        ws.append(w)
        bs[j] = b
        kinds.append(kind)
        layers.append(layer)
    ws += [weights[p] for p in order[len(convs) :]]
    kinds += ["dense"] * (len(order) - len(convs))
    return checked_net(ws, bs, where, tuple(kinds), tuple(layers))
