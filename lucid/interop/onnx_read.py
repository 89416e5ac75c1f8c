"""Dense ReLU networks read from ONNX with the `onnx` library (`lucid import`; the writer is `onnx_write`).

Read: a chain of Gemm, MatMul (optionally followed by the Add of its bias), Relu, and
Flatten / Reshape that keep the [batch, features] layout (a Reshape's shape may be built from the
running tensor's Shape, as torch's legacy exporter writes `x.view(x.size(0), -1)`); constants come
from initializers or Constant nodes. On an image input [batch, C, H, W], 2-D `Conv` layers (one group, no dilation,
the same stride on both axes and the same zero padding on every side) come first, each lowered
exactly to the dense layer it is (`lucid.convolution`, on the C-H-W flattened image), then a
Flatten. Anything else (another op, a branch, a ReLU after the last layer, two layers without a
ReLU between them) is refused in one line naming the op and the file: LUCID verifies exactly
this kind of network, so it must not guess what another op means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import onnx
from onnx import helper, numpy_helper

from lucid.errors import LucidError
from lucid.interop.dense import ConvLayer, DenseNet, checked_net, lowered_conv

SUPPORTED = "Gemm, MatMul (+ Add), Conv, Relu, Flatten and Reshape"


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _dims(value_info) -> list[int | None]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]


class _Chain:
    """The walk along the graph: the running tensor's name, rank and width, and the layers so far."""

    def __init__(self, path: Path, name: str, dims: list[int | None]) -> None:
        self.path = path
        self.current = name
        self.rank = len(dims)
        self.batch = dims[0] if dims else None  # the input's batch size when the graph fixes it
        sizes = [d for d in dims[1:] if d is not None]
        known = len(sizes) == len(dims[1:])
        self.width: int | None = int(np.prod(sizes, dtype=np.int64)) if known and self.rank >= 2 else None
        # (C, H, W) of an image tensor [batch, C, H, W] of known size, which a Conv reads
        self.image: tuple[int, int, int] | None = (
            (int(sizes[0]), int(sizes[1]), int(sizes[2])) if self.rank == 4 and known else None
        )
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray | None] = []
        self.relu: list[bool] = []
        self.kinds: list[str] = []
        self.convs: list[ConvLayer] = []
        self.open_matmul = False  # the last layer was a MatMul whose Add may follow
        # shape tensors computed from the running tensor's Shape (`_shape_arithmetic`): a list of
        # entries or one entry, each a size, "batch" (the input's own batch size) or None (unknown)
        self.shapes: dict[str, Any] = {}  # symbolic: ints, "batch", None, or lists of them

    def dims(self) -> list:
        """The running tensor's shape as `shapes` holds it."""
        rest = (
            list(self.image) if self.image is not None else [self.width] if self.rank == 2 else [None] * (self.rank - 1)
        )
        return ["batch" if self.batch is None else self.batch, *rest]

    def fail(self, node, why: str) -> NoReturn:
        raise LucidError(f"{self.path}: {node.op_type} node '{node.name or node.output[0]}' {why}")

    def dense(self, node, w: np.ndarray, b: np.ndarray | None) -> None:
        if self.rank != 2:
            self.fail(node, f"acts on a rank-{self.rank} tensor; LUCID reads [batch, features] (Flatten it first)")
        if self.weights and not self.relu[-1]:
            self.fail(
                node,
                "follows a dense layer without a Relu between them; LUCID reads Relu after every layer but the last",
            )
        if self.width is not None and w.shape[1] != self.width:
            self.fail(node, f"takes {w.shape[1]} inputs but its input has {self.width} features")
        self.weights.append(w)
        self.biases.append(b)
        self.relu.append(False)
        self.kinds.append("dense")
        self.width = int(w.shape[0])


def read_onnx(path: str | Path) -> DenseNet:
    """The dense ReLU network of an ONNX file (see the module docstring for what is read)."""
    path = Path(path)
    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise LucidError(f"{path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 (protobuf's DecodeError and friends: a damaged or non-ONNX file)
        raise LucidError(f"cannot read {path} as ONNX: {_first_line(exc)}") from None
    graph = model.graph
    if not graph.node and not graph.input and not graph.output:
        raise LucidError(f"{path} holds no ONNX graph (an empty or non-ONNX file)")
    ml = sorted({node.op_type for node in graph.node if node.domain == "ai.onnx.ml"})
    if ml:  # before the input/output count: skl2onnx's graphs have two outputs, a label and probabilities
        raise LucidError(
            f"{path}: an ONNX-ML graph (ops {', '.join(ml)}), as skl2onnx writes for scikit-learn; "
            "LUCID verifies a ReLU network's scores, so write an MLPClassifier's coefs_ and intercepts_ "
            "as a state dict instead (docs/interop.md, scikit-learn)"
        )
    consts = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise LucidError(
            f"{path}: the graph has {len(inputs)} inputs and {len(graph.output)} outputs; "
            "LUCID reads one input and one output"
        )
    dims = _dims(inputs[0])
    if len(dims) < 2:
        raise LucidError(f"{path}: the input '{inputs[0].name}' has shape {dims}; LUCID needs a batch axis first")
    chain = _Chain(path, inputs[0].name, dims)
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            chain.fail(node, f"is from the op set '{node.domain}'; LUCID imports {SUPPORTED} only")
        if node.op_type == "Constant":
            consts[node.output[0]] = _constant(node, path)
            continue
        if node.op_type == "Identity" and node.input and node.input[0] in consts:  # a constant's copy
            consts[node.output[0]] = consts[node.input[0]]
            continue
        if _shape_arithmetic(chain, node, consts):
            continue
        data = [name for name in node.input if name and name not in consts and name not in chain.shapes]
        if data != [chain.current]:
            _unsupported_consumer(chain, graph.node, consts)
            chain.fail(node, "does not act on the previous layer's output alone; LUCID imports a plain chain of layers")
        _step(chain, node, consts)
        chain.current = node.output[0]
    if chain.current != graph.output[0].name:
        raise LucidError(f"{path}: the graph's output '{graph.output[0].name}' is not the end of its chain of layers")
    if not chain.weights:
        raise LucidError(f"{path}: no dense layer (Gemm or MatMul) found")
    if chain.relu[-1]:
        raise LucidError(f"{path}: a Relu follows the last layer; LUCID reads the scores before any activation")
    biases = [
        np.zeros(w.shape[0], dtype=w.dtype) if b is None else b
        for w, b in zip(chain.weights, chain.biases, strict=True)
    ]
    return checked_net(chain.weights, biases, str(path), tuple(chain.kinds), tuple(chain.convs))


READ_OPS = {"Gemm", "MatMul", "Add", "Conv", "Relu", "Flatten", "Reshape", "Identity", "Constant", "Shape"}


def _shape_arithmetic(chain: _Chain, node, consts: dict[str, np.ndarray]) -> bool:
    """Follow the shape tensor that a Reshape to [batch, -1] is built from, when the batch is not
    fixed: torch's legacy exporter writes `x.view(x.size(0), -1)` (and `x.reshape(x.shape[0], -1)`)
    as Shape(x) -> Gather(0) -> Unsqueeze -> Concat with [-1] -> Reshape. Only these ops, on the
    running tensor's shape and constants, are followed (`chain.shapes`); True if `node` was one."""
    op, attrs = node.op_type, _attrs(node)
    names = [name for name in node.input if name]
    if op == "Shape" and names == [chain.current]:
        start, end = int(attrs.get("start", 0)), attrs.get("end")
        chain.shapes[node.output[0]] = chain.dims()[start : None if end is None else int(end)]
        return True
    if not names or names[0] not in chain.shapes or not all(n in chain.shapes or n in consts for n in names):
        return False
    value = chain.shapes[names[0]]
    if (
        op == "Gather"
        and len(names) == 2
        and names[1] in consts
        and attrs.get("axis", 0) == 0
        and isinstance(value, list)
    ):
        index = np.asarray(consts[names[1]])
        picked = [value[int(i)] if -len(value) <= int(i) < len(value) else None for i in index.ravel()]
        result: object = picked[0] if index.ndim == 0 else picked
    elif op == "Unsqueeze" and not isinstance(value, list):
        axes = consts[names[1]] if len(names) > 1 and names[1] in consts else attrs.get("axes")
        if axes is None or [int(a) for a in np.ravel(axes)] not in ([0], [-1]):
            return False
        result = [value]
    elif op == "Concat" and attrs.get("axis") in (0, -1):
        parts = [chain.shapes[n] if n in chain.shapes else np.ravel(consts[n]).tolist() for n in names]
        if not all(isinstance(part, list) for part in parts):
            return False
        result = [entry for part in parts for entry in part]
    elif op == "Cast" and len(names) == 1:  # a shape's integer type changes nothing read here
        result = value
    else:
        return False
    chain.shapes[node.output[0]] = result
    return True


HINTS = {
    "BatchNormalization": " (fold it into the layer before: torch.onnx.export's default exporter does so "
    "for a model in eval mode)",
    "Pad": " (a padding mode other than zeros, or padding the Conv cannot express)",
}


def _unsupported_consumer(chain: _Chain, nodes, consts: dict[str, np.ndarray]) -> None:
    """A node that does not act on the chain alone often computes a constant for an op LUCID cannot
    read (torch's reflect padding builds its pads from ConstantOfShape, Concat, Slice, ...): name the
    op that consumes the running tensor instead, if it is one LUCID does not read."""
    for other in nodes:
        if chain.current in other.input and other.op_type not in READ_OPS:
            _unsupported(chain, other)


def _unsupported(chain: _Chain, node) -> None:
    mode = _attrs(node).get("mode")
    detail = f" (mode {mode.decode() if isinstance(mode, bytes) else mode})" if mode is not None else ""
    chain.fail(node, f"is not supported{detail}; LUCID imports {SUPPORTED} only{HINTS.get(node.op_type, '')}")


def _step(chain: _Chain, node, consts: dict[str, np.ndarray]) -> None:
    op, attrs = node.op_type, _attrs(node)
    after_matmul, chain.open_matmul = chain.open_matmul, False
    if op == "Gemm":
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            chain.fail(node, "has transA, alpha or beta other than the defaults; LUCID imports y = x W^T + b only")
        w = _const(chain, node, consts, 1, ndim=2)
        w = w if attrs.get("transB", 0) else w.T
        b = _const(chain, node, consts, 2, ndim=None) if len(node.input) > 2 and node.input[2] else None
        chain.dense(node, w, None if b is None else _bias(chain, node, b, w.shape[0]))
    elif op == "MatMul":
        if node.input[1] not in consts:
            chain.fail(node, "multiplies by a tensor that is not a constant")
        w = _const(chain, node, consts, 1, ndim=2)
        chain.dense(node, w.T, None)
        chain.open_matmul = True
    elif op == "Add":
        if not after_matmul:
            chain.fail(node, "does not add the bias of a MatMul; LUCID imports Add only right after MatMul")
        other = [name for name in node.input if name != chain.current]
        if len(other) != 1:
            chain.fail(node, "does not add a constant bias")
        chain.biases[-1] = _bias(chain, node, consts[other[0]], chain.weights[-1].shape[0])
    elif op == "Relu":
        if not chain.weights or chain.relu[-1]:
            chain.fail(node, "does not follow a dense layer; LUCID reads one Relu after each layer but the last")
        chain.relu[-1] = True
    elif op == "Conv":
        _conv(chain, node, consts, attrs)
    elif op == "Flatten":
        if attrs.get("axis", 1) != 1:
            chain.fail(node, "flattens at an axis other than 1, which would mix the batch with the features")
        chain.rank, chain.image = 2, None
    elif op == "Reshape":
        _reshape(chain, node, consts, attrs)
    elif op == "Identity":
        chain.open_matmul = after_matmul
    else:
        _unsupported(chain, node)


def _conv(chain: _Chain, node, consts: dict[str, np.ndarray], attrs: dict) -> None:
    """A 2-D convolution of the running image, as the dense layer it is on the C-H-W flattened
    image (exact: every entry a kernel entry or zero, `lucid.convolution.conv2d_to_dense`)."""
    if chain.image is None:
        chain.fail(node, "acts on a tensor that is not an image [batch, channels, height, width] of known size")
    if chain.weights and not chain.relu[-1]:
        chain.fail(node, "follows a layer without a Relu between them; LUCID reads Relu after every layer but the last")
    w = _const(chain, node, consts, 1, ndim=None)
    if w.ndim != 4:
        chain.fail(node, f"has a kernel of shape {tuple(w.shape)}; LUCID imports 2-D convolutions [out, in, kh, kw]")
    c_out, _c_in, kh, kw = (int(v) for v in w.shape)
    if attrs.get("group", 1) != 1:  # before the channels: a grouped kernel reads channels / groups each
        chain.fail(node, f"has group={attrs['group']}; LUCID imports convolutions with one group")
    strides = [int(v) for v in attrs.get("strides", [1, 1])]
    pads = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
    refused = {
        "group": attrs.get("group", 1) != 1,
        "dilations": any(int(v) != 1 for v in attrs.get("dilations", [1, 1])),
        "auto_pad": attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"),
        "kernel_shape": [int(v) for v in attrs.get("kernel_shape", [kh, kw])] != [kh, kw],
        "strides": len(strides) != 2 or strides[0] != strides[1],
        "pads": len(pads) != 4 or len(set(pads)) != 1,
    }
    bad = [name for name, no in refused.items() if no]
    if bad:
        chain.fail(
            node,
            f"has {', '.join(bad)} LUCID does not import; it imports one group, no dilation, explicit "
            "pads equal on every side and the same stride on both axes",
        )
    b = _const(chain, node, consts, 2, ndim=None) if len(node.input) > 2 and node.input[2] else None
    bias = np.zeros(c_out, dtype=w.dtype) if b is None else _bias(chain, node, b, c_out)
    try:
        dense_w, dense_b, kind, image, layer = lowered_conv(w, bias, chain.image, strides[0], pads[0])
    except LucidError as exc:
        chain.fail(node, str(exc))
    chain.weights.append(dense_w)
    chain.biases.append(dense_b)
    chain.relu.append(False)
    chain.kinds.append(kind)
    chain.convs.append(layer)
    chain.image, chain.width = image, int(np.prod(image))


def _reshape(chain: _Chain, node, consts: dict[str, np.ndarray], attrs: dict) -> None:
    """Only a reshape to [batch, features] is read: [0, w] or [0, -1] (0: keep the batch, so not with
    allowzero, where 0 is a literal zero), [-1, w] with w the known width, [B, w] or [B, -1] when the
    graph's input has a fixed batch B, or [batch, w] or [batch, -1] with the batch taken from the
    running tensor's Shape (`_shape_arithmetic`). torch.onnx.export writes nn.Flatten and
    `x.view(x.size(0), -1)` as [-1, w] for a dynamic batch and [1, w] or [1, -1] for the example's
    batch of 1; its legacy exporter writes the latter idiom with a dynamic batch from Shape."""
    if len(node.input) < 2 or (node.input[1] not in consts and node.input[1] not in chain.shapes):
        chain.fail(node, "has a shape that is not a constant")
    if node.input[1] in chain.shapes:
        found = chain.shapes[node.input[1]]
        shape = found if isinstance(found, list) else [found]
    else:
        shape = [int(v) for v in np.asarray(consts[node.input[1]]).ravel()]
    if not all(isinstance(v, int) for v in shape[1:]) or None in shape:
        chain.fail(node, f"reshapes to {shape}, a shape LUCID cannot follow")
    batch_kept = (shape[0] in (-1, "batch", chain.batch) and chain.batch != 0) or (
        shape[0] == 0 and not attrs.get("allowzero", 0)
    )
    if (
        len(shape) == 4
        and chain.rank == 2
        and batch_kept
        and min(shape[1:]) > 0
        and chain.width == int(np.prod(shape[1:]))
    ):
        # the flat rows as the C-H-W images they are (what `lucid export` writes before a CNN's first Conv)
        chain.rank, chain.image = 4, (shape[1], shape[2], shape[3])
        return
    width_known = chain.width is not None and len(shape) == 2 and shape[1] == chain.width
    keeps_batch = len(shape) == 2 and (
        (shape[0] == 0 and not attrs.get("allowzero", 0) and (shape[1] == -1 or shape[1] > 0))
        or (shape[0] == -1 and width_known)
        or (shape[0] in ("batch", chain.batch) and chain.batch != 0 and (shape[1] == -1 or width_known))
    )
    if not keeps_batch:
        zero = " (allowzero=1 makes its 0 a literal zero)" if attrs.get("allowzero", 0) and 0 in shape else ""
        chain.fail(node, f"reshapes to {shape}, which does not keep the [batch, features] layout{zero}")
    if shape[1] > 0:
        if chain.width is not None and shape[1] != chain.width:
            chain.fail(node, f"reshapes {chain.width} features to {shape[1]}")
        chain.width = shape[1]
    chain.rank, chain.image = 2, None


def _const(chain: _Chain, node, consts: dict[str, np.ndarray], i: int, ndim: int | None) -> np.ndarray:
    if len(node.input) <= i or node.input[i] not in consts:
        chain.fail(node, f"has an input {i} that is not a constant")
    value = np.asarray(consts[node.input[i]])
    if ndim is not None and value.ndim != ndim:
        chain.fail(node, f"has a weight of shape {tuple(value.shape)}; expected a matrix")
    return value


def _bias(chain: _Chain, node, b: np.ndarray, width: int) -> np.ndarray:
    """A bias that broadcasts to [width] along the features only (shape (), (1,), (w,) or (1, w))."""
    b = np.asarray(b)
    if b.size not in (1, width) or (b.ndim == 2 and b.shape[0] != 1) or b.ndim > 2:
        chain.fail(node, f"adds a tensor of shape {tuple(b.shape)}, not a bias of {width} values")
    return np.broadcast_to(b.reshape(-1), (width,)).copy()


def _constant(node, path: Path) -> np.ndarray:
    attrs = _attrs(node)
    if "value" not in attrs:
        raise LucidError(f"{path}: Constant node '{node.name or node.output[0]}' holds no tensor value")
    return numpy_helper.to_array(attrs["value"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
