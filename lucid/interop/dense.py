"""One plain dense ReLU network as read from, or written to, a file outside LUCID.

`DenseNet` is the common form of every reader and writer of this package: float32 weights
[out, in] and biases [out] of the affine layers, a ReLU after every layer but the last (the
stacked layout of networks.safetensors, docs/formats.md). LUCID stores float32, so a parameter
is accepted in another float type only when float32 holds it exactly: otherwise the bounds would
be about rounded networks, not the ones supplied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.convolution import conv2d_output_hw, conv2d_to_dense, format_layer_spec
from lucid.errors import LucidError


@dataclass(frozen=True)
class ConvLayer:
    """A 2-D convolution as its file gives it, kept beside the dense layer it is lowered to, so that
    an imported CNN is stored as one (a `cnn2d` run) and a CNN run's export holds its kernels."""

    weight: np.ndarray  # float32 [out, in, kh, kw]
    bias: np.ndarray  # float32 [out]
    stride: int
    pad: int
    image: tuple[int, int, int]  # its input [C, H, W]


@dataclass
class DenseNet:
    weights: list[np.ndarray]  # float32 [out, in]
    biases: list[np.ndarray]  # float32 [out]
    # what each layer is in the source file: "dense", or a convolution with its image, kernel,
    # stride and padding (lowered to the dense layer it is): networks of one run must agree on it
    kinds: tuple[str, ...] = ()
    convs: tuple[ConvLayer, ...] = ()  # the first len(convs) layers, as convolutions

    def cnn2d(self) -> dict | None:
        """A `cnn2d` run.json architecture for these layers (docs/formats.md), or None when they
        are not one: no convolution, a kernel that is not square, or no dense layer after them."""
        if (
            not self.convs
            or len(self.weights) == len(self.convs)
            or any(c.weight.shape[2] != c.weight.shape[3] for c in self.convs)
        ):
            return None
        convs = [
            {"channels": int(c.weight.shape[0]), "kernel": int(c.weight.shape[2]), "stride": c.stride, "pad": c.pad}
            for c in self.convs
        ]
        hidden = [int(w.shape[0]) for w in self.weights[len(self.convs) : -1]]
        return {
            "type": "cnn2d",
            "spec": format_layer_spec(convs, hidden),
            "input_shape": list(self.convs[0].image),
            "conv": convs,
            "hidden": hidden,
        }

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return self.kinds or ("dense",) * len(self.weights)

    @property
    def layer_sizes(self) -> list[int]:
        """[input, hidden..., output] widths."""
        return [int(self.weights[0].shape[1])] + [int(w.shape[0]) for w in self.weights]


def exact_float32(value: np.ndarray, what: str) -> np.ndarray:
    """`value` as float32, refusing a type or a value that float32 does not hold exactly."""
    a = np.asarray(value)
    if a.dtype == np.float32:
        return a
    if a.dtype.name == "bfloat16":  # ml_dtypes' type, as onnx and safetensors read it (numpy has none)
        return a.astype(np.float32)  # exact: bfloat16 is float32 with the last 16 mantissa bits zero
    if a.dtype.kind != "f":
        raise LucidError(f"{what} has dtype {a.dtype}; LUCID reads floating-point parameters only")
    cast = a.astype(np.float32)
    if not np.array_equal(cast.astype(a.dtype), a, equal_nan=True):
        raise LucidError(
            f"{what} is {a.dtype} with values float32 cannot hold exactly; LUCID stores float32 "
            "networks, so convert them to float32 before importing (the bounds are about the stored ones)"
        )
    return cast


def checked_net(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    source: str,
    kinds: tuple[str, ...] = (),
    convs: tuple[ConvLayer, ...] = (),
) -> DenseNet:
    """A `DenseNet` whose layers chain (out of layer k = in of layer k+1) and whose biases fit;
    `convs`: the convolutions the first layers are lowered from."""
    if not weights:
        raise LucidError(f"{source}: no dense layer found")
    ws = [exact_float32(w, f"{source}: layer {k}'s weight") for k, w in enumerate(weights)]
    bs = [exact_float32(b, f"{source}: layer {k}'s bias") for k, b in enumerate(biases)]
    for k, (w, b) in enumerate(zip(ws, bs, strict=True)):
        if w.ndim != 2 or b.shape != (w.shape[0],):
            raise LucidError(
                f"{source}: layer {k} has weight {tuple(w.shape)} and bias {tuple(b.shape)}; "
                "expected [out, in] and [out]"
            )
        if k and w.shape[1] != ws[k - 1].shape[0]:
            raise LucidError(
                f"{source}: layer {k} takes {w.shape[1]} inputs but layer {k - 1} gives {ws[k - 1].shape[0]}"
            )
    kept = tuple(
        ConvLayer(
            exact_float32(c.weight, f"{source}: layer {k}'s kernel"),
            exact_float32(c.bias, f"{source}: layer {k}'s bias"),
            c.stride,
            c.pad,
            c.image,
        )
        for k, c in enumerate(convs)
    )
    return DenseNet(ws, bs, tuple(kinds), kept)


def non_finite_layer(net: DenseNet) -> int | None:
    """The first layer holding a NaN or infinite parameter, or None."""
    for k, (w, b) in enumerate(zip(net.weights, net.biases, strict=True)):
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            return k
    return None


def lowered_conv(
    weight: np.ndarray, bias: np.ndarray, image: tuple[int, int, int], stride: int, pad: int
) -> tuple[np.ndarray, np.ndarray, str, tuple[int, int, int], ConvLayer]:
    """A 2-D convolution (kernel [out, in, kh, kw], bias [out], zero padding `pad` on every side) of
    the C-H-W image `image`, as the dense layer it is on the flattened image (exact:
    `lucid.convolution.conv2d_to_dense`), in the kernel's own type; with the layer's kind (what
    networks of one run must agree on), its output image and the convolution itself. The one lowering
    of every reader."""
    c_out, c_in, kh, kw = (int(v) for v in weight.shape)
    if c_in != image[0]:
        raise LucidError(f"reads {c_in} channels but its input has {image[0]}")
    # conv2d_to_dense checks the stride and padding before any size is computed from them
    dense_w, dense_b = conv2d_to_dense(weight[None], bias[None], image, stride, pad)
    oh, ow = conv2d_output_hw(image[1], image[2], (kh, kw), stride, pad)
    # back in the file's own types (the entries are copies, so exactly), for checked_net's dtype rules
    kind = f"conv {kh}x{kw} stride {stride} pad {pad} on image {image}"
    return (
        dense_w[0].astype(weight.dtype),
        dense_b[0].astype(bias.dtype),
        kind,
        (c_out, oh, ow),
        ConvLayer(weight, bias, stride, pad, image),
    )
