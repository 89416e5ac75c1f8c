"""Dense ReLU networks written as ONNX with the `onnx` library (`lucid export`; the reader is `onnx_read`).

Written: a chain Gemm (transB=1, so the weight is stored [out, in] exactly as in
networks.safetensors), Relu, Gemm, ..., with one input "x" [batch, input_dim] in the networks'
input space (after the run's scaler) and float32 initializers bit-identical to the run's. A
singleton iDP query is one graph of N and N_-i side by side (`joint_model`), for VNN-LIB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from lucid.atomic import write_atomic
from lucid.interop.dense import DenseNet

INPUT_NAME = "x"
OPSET = 13  # Gemm with an optional C, Flatten, Reshape, Relu and Concat as VNN-COMP tools read them
IR_VERSION = 8  # the IR of opset 13: older verifiers' onnx readers refuse newer IRs


def _layers(net: DenseNet, prefix: str, source: str, nodes: list, inits: list) -> str:
    """Append `net`'s Gemm/Relu chain acting on `source` (a 2-D CNN's convolutions first: a Reshape
    of the flat input to its image, Conv/Relu layers, a Flatten); returns the name of its scores."""
    h = source
    last = len(net.weights) - 1
    if net.convs:
        shape = np.array([-1, *net.convs[0].image], dtype=np.int64)
        inits.append(numpy_helper.from_array(shape, f"{prefix}image_shape"))
        nodes.append(
            helper.make_node("Reshape", [h, f"{prefix}image_shape"], [f"{prefix}image"], name=f"{prefix}image")
        )
        h = f"{prefix}image"
    for k, (w, b) in enumerate(zip(net.weights, net.biases, strict=True)):
        if k < len(net.convs):
            c = net.convs[k]
            wn, bn, out = f"{prefix}conv.{k}.weight", f"{prefix}conv.{k}.bias", f"{prefix}conv{k}"
            inits += [
                numpy_helper.from_array(np.ascontiguousarray(c.weight, dtype=np.float32), wn),
                numpy_helper.from_array(np.ascontiguousarray(c.bias, dtype=np.float32), bn),
            ]
            nodes.append(
                helper.make_node(
                    "Conv",
                    [h, wn, bn],
                    [out],
                    name=out,
                    kernel_shape=list(c.weight.shape[2:]),
                    strides=[c.stride] * 2,
                    pads=[c.pad] * 4,
                )
            )
            h = out
            if k < last:
                nodes.append(helper.make_node("Relu", [h], [f"{prefix}relu{k}"], name=f"{prefix}relu{k}"))
                h = f"{prefix}relu{k}"
            continue
        if k and k == len(net.convs):
            nodes.append(helper.make_node("Flatten", [h], [f"{prefix}flat"], name=f"{prefix}flat", axis=1))
            h = f"{prefix}flat"
        i = k - len(net.convs)  # the dense layers' names are networks.safetensors' (layers.{i} after conv.{j})
        wn, bn, out = f"{prefix}layers.{i}.weight", f"{prefix}layers.{i}.bias", f"{prefix}gemm{k}"
        inits += [
            numpy_helper.from_array(np.ascontiguousarray(w, dtype=np.float32), wn),
            numpy_helper.from_array(np.ascontiguousarray(b, dtype=np.float32), bn),
        ]
        nodes.append(helper.make_node("Gemm", [h, wn, bn], [out], name=out, transB=1))
        h = out
        if k < last:
            nodes.append(helper.make_node("Relu", [h], [f"{prefix}relu{k}"], name=f"{prefix}relu{k}"))
            h = f"{prefix}relu{k}"
    return h


def _model(nodes: list, inits: list, input_dim: int, output: str, width: int, doc: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "lucid",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", input_dim])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", width])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lucid", doc_string=doc
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def network_model(net: DenseNet, doc: str = "") -> onnx.ModelProto:
    """One network: input "x" [batch, d], output "scores" [batch, C]."""
    nodes: list = []
    inits: list = []
    scores = _layers(net, "", INPUT_NAME, nodes, inits)
    nodes.append(helper.make_node("Identity", [scores], ["scores"], name="scores"))
    return _model(nodes, inits, net.layer_sizes[0], "scores", net.layer_sizes[-1], doc)


def margin_matrix(num_classes: int, cls: int) -> np.ndarray:
    """[C-1, C]: row j is e_cls - e_u for the j-th class u != cls (ascending), so that
    margins = scores @ M.T holds s_cls - s_u: the terms of the confidence in cls."""
    others = [u for u in range(num_classes) if u != cls]
    m = np.zeros((len(others), num_classes), dtype=np.float32)
    m[:, cls] = 1.0
    m[np.arange(len(others)), others] = -1.0
    return m


def joint_model(n: DenseNet, other: DenseNet, cls: int, doc: str = "") -> onnx.ModelProto:
    """N ⊕ N_-i for class `cls`: one input "x" [batch, d], output "margins" [batch, 2(C-1)]:
    s_N[cls] - s_N[u] for u != cls, then s_i[cls] - s_i[t] for t != cls (ascending u, t)."""
    num_classes = n.layer_sizes[-1]
    nodes: list = []
    inits = [numpy_helper.from_array(margin_matrix(num_classes, cls), "margin")]
    parts = []
    for prefix, net in (("N.", n), ("i.", other)):
        scores = _layers(net, prefix, INPUT_NAME, nodes, inits)
        nodes.append(
            helper.make_node("Gemm", [scores, "margin"], [f"{prefix}margins"], name=f"{prefix}margins", transB=1)
        )
        parts.append(f"{prefix}margins")
    nodes.append(helper.make_node("Concat", parts, ["margins"], name="margins", axis=1))
    return _model(nodes, inits, n.layer_sizes[0], "margins", 2 * (num_classes - 1), doc)


def save_model(model: onnx.ModelProto, path: str | Path) -> None:
    write_atomic(path, lambda tmp: onnx.save_model(model, tmp))
