"""Convolutions lowered to dense layers, exactly.

A valid 1-D convolution is a linear map, so it becomes a dense (Toeplitz) matrix acting on the
channel-major flattened signal, exactly as torch's `flatten(1)` of a [batch, channels, length]
tensor orders it. A 2-D convolution with stride and zero padding is lowered the same way, on the
C-H-W flattened image (`flatten(1)` of [batch, channels, height, width]); the zero padding only
drops the kernel entries that would meet it. Every entry of a lowered matrix is a kernel entry or
an exact zero, so the lowered network computes what the convolution computes, up to the
summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lucid.errors import LucidError


def conv1d_to_dense(weight: np.ndarray, bias: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower a valid, stride-1 1-D convolution to a dense layer.

    weight [K, c_out, c_in, k], bias [K, c_out]; the input is channel-major flattened
    [c_in * length]; the output is channel-major flattened [c_out * (length - k + 1)].
    """
    n_k, c_out, c_in, ksize = weight.shape
    out_len = length - ksize + 1
    if out_len < 1:
        raise LucidError(f"convolution with kernel {ksize} needs inputs of length >= {ksize}, got {length}")
    dense = np.zeros((n_k, c_out, out_len, c_in, length), dtype=np.float64)
    for p in range(out_len):
        dense[:, :, p, :, p : p + ksize] = weight
    dense_bias = np.repeat(bias.astype(np.float64)[:, :, None], out_len, axis=2)
    return dense.reshape(n_k, c_out * out_len, c_in * length), dense_bias.reshape(n_k, c_out * out_len)


def conv2d_output_hw(height: int, width: int, kernel: tuple[int, int], stride: int, pad: int) -> tuple[int, int]:
    """(height, width) of a 2-D convolution's output, as torch's conv2d computes it (floor division)."""
    kh, kw = kernel
    if height + 2 * pad < kh or width + 2 * pad < kw:
        raise LucidError(f"a {kh}x{kw} kernel is larger than the padded {height + 2 * pad}x{width + 2 * pad} input")
    return (height + 2 * pad - kh) // stride + 1, (width + 2 * pad - kw) // stride + 1


def conv2d_to_dense(
    weight: np.ndarray, bias: np.ndarray, input_shape: Sequence[int], stride: int = 1, pad: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Lower a 2-D convolution with stride and zero padding to a dense layer, exactly.

    weight [K, c_out, c_in, kh, kw], bias [K, c_out]; the input is the C-H-W flattened
    [c_in * h * w] image of `input_shape` (c_in, h, w); the output is the C-H-W flattened
    [c_out * oh * ow]. Every entry of the result is a kernel entry (converted to float64, which
    is exact for float32 weights) or an exact zero: no arithmetic on the weights, so the lowered
    network computes what the convolution computes, up to the summation order.
    """
    n_k, c_out, c_in, kh, kw = weight.shape
    channels, height, width = (int(v) for v in input_shape)
    if c_in != channels:
        raise LucidError(f"a convolution over {c_in} channels cannot read a {channels}-channel input")
    if stride < 1 or pad < 0:
        raise LucidError(f"a convolution needs stride >= 1 and pad >= 0, got stride {stride}, pad {pad}")
    oh, ow = conv2d_output_hw(height, width, (kh, kw), stride, pad)
    kernel = np.asarray(weight, dtype=np.float64)
    dense = np.zeros((n_k, c_out, oh, ow, c_in, height, width), dtype=np.float64)
    for p in range(oh):
        top = p * stride - pad  # input row under kernel row 0; rows outside the image are padding
        r0, r1 = max(top, 0), min(top + kh, height)
        for q in range(ow):
            left = q * stride - pad
            s0, s1 = max(left, 0), min(left + kw, width)
            if r1 > r0 and s1 > s0:  # a window wholly in the padding reads only zeros
                dense[:, :, p, q, :, r0:r1, s0:s1] = kernel[:, :, :, r0 - top : r1 - top, s0 - left : s1 - left]
    dense_bias = np.repeat(np.asarray(bias, dtype=np.float64)[:, :, None], oh * ow, axis=2)
    return dense.reshape(n_k, c_out * oh * ow, c_in * height * width), dense_bias.reshape(n_k, c_out * oh * ow)


def lower_conv1d(tensors: dict[str, np.ndarray], input_dim: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The dense layers of the 1-D CNN's convolutions (none for an MLP)."""
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    length, channels = input_dim, 1
    j = 0
    while f"conv.{j}.weight" in tensors:
        w = tensors[f"conv.{j}.weight"]
        if w.ndim != 4 or w.shape[2] != channels:
            raise LucidError(f"conv.{j}.weight has shape {tuple(w.shape)}, expected [K, out, {channels}, kernel]")
        dw, db = conv1d_to_dense(w, tensors[f"conv.{j}.bias"], length)
        weights.append(dw)
        biases.append(db)
        channels, length = w.shape[1], length - w.shape[3] + 1
        j += 1
    return weights, biases


def format_layer_spec(convs: list[dict], hidden: list[int]) -> str:
    """The normalised spec string a `cnn2d` run.json records (every argument written out)."""
    parts = [f"conv({c['channels']},{c['kernel']},stride={c['stride']},pad={c['pad']})" for c in convs]
    return ",".join(parts + [f"fc({w})" for w in hidden])


def conv2d_layers(architecture: dict) -> tuple[tuple[int, int, int], list[dict]]:
    """(input shape, conv layers) of a `cnn2d` architecture, checked to be well-formed."""
    try:
        shape = tuple(int(v) for v in architecture["input_shape"])
        layers = [
            {key: int(layer[key]) for key in ("channels", "kernel", "stride", "pad")} for layer in architecture["conv"]
        ]
    except (KeyError, TypeError, ValueError):
        raise LucidError(
            "run.json: a cnn2d architecture needs 'input_shape' [C, H, W] and 'conv' layers with "
            "channels, kernel, stride and pad"
        ) from None
    if len(shape) != 3 or min(shape) < 1:
        raise LucidError(f"run.json: the cnn2d input_shape must be three positive sizes [C, H, W], got {list(shape)}")
    return shape, layers


def lower_conv2d(
    tensors: dict[str, np.ndarray], architecture: dict, input_dim: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The dense layers of a 2-D CNN's convolutions, on the C-H-W flattened image."""
    shape, layers = conv2d_layers(architecture)
    if int(np.prod(shape)) != input_dim:
        raise LucidError(f"run.json: the cnn2d input_shape {list(shape)} does not have input_dim = {input_dim} values")
    if f"conv.{len(layers)}.weight" in tensors:
        raise LucidError(f"the networks have more conv tensors than run.json's {len(layers)} conv layers")
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    for j, layer in enumerate(layers):
        if f"conv.{j}.weight" not in tensors:
            raise LucidError(f"the networks have no 'conv.{j}.weight' tensor (run.json has {len(layers)} conv layers)")
        w = tensors[f"conv.{j}.weight"]
        expected = (layer["channels"], shape[0], layer["kernel"], layer["kernel"])
        if w.ndim != 5 or tuple(w.shape[1:]) != expected:
            raise LucidError(
                f"conv.{j}.weight has shape {tuple(w.shape)}, expected [K, {', '.join(map(str, expected))}]"
            )
        dw, db = conv2d_to_dense(w, tensors[f"conv.{j}.bias"], shape, layer["stride"], layer["pad"])
        weights.append(dw)
        biases.append(db)
        oh, ow = conv2d_output_hw(shape[1], shape[2], (layer["kernel"], layer["kernel"]), layer["stride"], layer["pad"])
        shape = (layer["channels"], oh, ow)
    return weights, biases
