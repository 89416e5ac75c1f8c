"""`lucid export`: a run's networks as ONNX, and singleton iDP queries as ONNX + VNN-LIB.

Every network is read on its own from the memory-mapped networks.safetensors, so exporting all of
a large run never holds more than one network.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np

from lucid.atomic import read_json, write_json_atomic, write_text_atomic
from lucid.convolution import conv2d_layers, conv2d_output_hw
from lucid.errors import LucidError
from lucid.interop.dense import ConvLayer, DenseNet, exact_float32
from lucid.interop.onnx_write import joint_model, network_model, save_model
from lucid.interop.provenance import NetworksDigest, origin_record
from lucid.interop.vnnlib import query_text
from lucid.network import NetworkFile, diverged_message, non_finite, stack_from_tensors
from lucid.rundir import BOUNDS_FILE, Run

N_FILE = "N.onnx"
MANIFEST_FILE = "manifest.json"


def network_file_name(removed: int) -> str:
    return N_FILE if removed == -1 else f"n{removed}.onnx"


def dense_network(source: NetworkFile, position: int) -> DenseNet:
    """The network at `position` of the stack, float32 exactly as stored. A CNN run's convolutions
    come lowered to dense (Toeplitz) layers: their entries are the stored floats and zeros; a 2-D
    CNN's also come as themselves (`DenseNet.convs`), which its ONNX file is written with."""
    tensors = source.tensors(position, position + 1)
    bad = non_finite(tensors)
    if bad.any():
        raise LucidError(diverged_message(1, None, int(source.removed[position])))
    architecture = source.meta.get("architecture", {})
    convs: tuple[ConvLayer, ...] = ()
    if any(name.startswith("conv.") for name in tensors):
        stack = stack_from_tensors(tensors, architecture, int(source.meta["input_dim"]))
        weights, biases = [w[0] for w in stack.weights], [b[0] for b in stack.biases]
        if architecture.get("type") == "cnn2d":
            convs = _conv_layers(tensors, architecture)
    else:
        count = sum(1 for name in tensors if name.startswith("layers.") and name.endswith(".weight"))
        weights = [tensors[f"layers.{k}.weight"][0] for k in range(count)]
        biases = [tensors[f"layers.{k}.bias"][0] for k in range(count)]
    what = f"network at position {position}"
    return DenseNet([exact_float32(w, what) for w in weights], [exact_float32(b, what) for b in biases], convs=convs)


def _conv_layers(tensors: dict[str, np.ndarray], architecture: dict) -> tuple[ConvLayer, ...]:
    """A `cnn2d` network's convolutions (one network's tensors), each with its input image."""
    image, layers = conv2d_layers(architecture)
    found = []
    for j, layer in enumerate(layers):
        weight = tensors[f"conv.{j}.weight"][0]
        found.append(ConvLayer(weight, tensors[f"conv.{j}.bias"][0], layer["stride"], layer["pad"], image))
        oh, ow = conv2d_output_hw(image[1], image[2], weight.shape[2:], layer["stride"], layer["pad"])
        image = (int(weight.shape[0]), oh, ow)
    return tuple(found)


def _position(source: NetworkFile, row: int | None, position: int | None) -> int:
    """The stack position of N_-row (`removed[position] == row`), or the position given."""
    if (row is None) == (position is None):
        raise LucidError("give the query's network as --network ROW (a training row) or --position P, not both")
    if position is not None:
        if not 1 <= position < len(source):
            raise LucidError(f"--position must be 1..{len(source) - 1} (position 0 is N), got {position}")
        return position
    row = cast(int, row)  # exactly one of row and position is given: here, row
    found = np.flatnonzero(source.removed == row)
    if row < 0 or len(found) == 0:
        raise LucidError(f"no network trained without training row {row} in this run")
    return int(found[0])


def default_beta(run: Run, cls: int) -> float:
    """The class's proved upper bound in bounds.json (the bound the access layer releases above)."""
    path = run.path / BOUNDS_FILE
    content = read_json(
        path,
        missing=f"{path} does not exist: run `lucid verify` first, or give --beta",
        unreadable=f"cannot read {path}",
    )
    entry = (content.get("bounds") or {}).get(str(cls)) if isinstance(content, dict) else None
    upper = entry.get("upper") if isinstance(entry, dict) else None
    if upper is None:
        raise LucidError(f"{path} has no proved upper bound for class {cls}: give --beta")
    if isinstance(upper, bool) or not isinstance(upper, (int, float)) or not math.isfinite(upper):
        raise LucidError(f"{path}: the upper bound of class {cls} is not a finite number")
    return float(upper)


def export_network(
    run: Run, position: int, out_dir: str | Path, source: NetworkFile | None = None, net: DenseNet | None = None
) -> Path:
    """Write the network at `position` (`net`, if already read) as N.onnx (position 0) or n{row}.onnx
    into `out_dir`."""
    source = source or NetworkFile(run.path, run.meta)
    removed = int(source.removed[position])
    who = "N (trained on every row)" if removed == -1 else f"N_-{removed} (trained without training row {removed})"
    path = Path(out_dir) / network_file_name(removed)
    save_model(
        network_model(
            net if net is not None else dense_network(source, position),
            f"LUCID run {run.path}: {who}. Input x in the networks' input space (after the run's scaler).",
        ),
        path,
    )
    return path


def export_all(run: Run, out_dir: str | Path, training: dict | None = None) -> Path:
    """Every network as ONNX plus the manifest.json that `lucid import` reads back (with the run's
    domain, labels and scaler). Returns the manifest's path."""
    out_dir = Path(out_dir)
    source = NetworkFile(run.path, run.meta)
    entries = []
    digest = NetworksDigest(source.removed)
    for position in range(len(source)):
        net = dense_network(source, position)
        digest.add(net.weights, net.biases)
        path = export_network(run, position, out_dir, source, net)
        removed = int(source.removed[position])
        entries.append({"file": path.name, "removed": None if removed == -1 else removed})
    t = run.meta.get("training") or {}
    manifest = {
        "training": training
        or {
            "name": str(t.get("algorithm", "unrecorded")),
            "version": "exported",
            "description": f"exported by lucid export from {run.path}",
        },
        "networks": entries,
        "domain": run.meta["domain"],
        "labels": run.meta["labels"],
    }
    if run.meta.get("scaler") is not None:
        manifest["scaler"] = run.meta["scaler"]
    names = (run.meta.get("data") or {}).get("feature_names")
    if names is not None:
        manifest["feature_names"] = names
    if (run.meta.get("architecture") or {}).get("type") in ("mlp", "cnn2d"):  # (a 1-D CNN comes back as dense layers)
        manifest["origin"] = origin_record(run.meta, digest.hexdigest())
    write_json_atomic(out_dir / MANIFEST_FILE, manifest)
    return out_dir / MANIFEST_FILE


def export_query(
    run: Run,
    out_dir: str | Path,
    cls: int,
    *,
    row: int | None = None,
    position: int | None = None,
    beta: float | None = None,
) -> tuple[Path, Path]:
    """query-c{cls}-n{row}.onnx (N ⊕ N_-row) and its .vnnlib property (see lucid.interop.vnnlib)."""
    source = NetworkFile(run.path, run.meta)
    if not 0 <= cls < run.num_classes:
        raise LucidError(f"--class must be 0..{run.num_classes - 1}, got {cls}")
    if run.num_classes < 2:
        raise LucidError("a query needs at least 2 classes")
    position = _position(source, row, position)
    row = int(source.removed[position])
    beta = default_beta(run, cls) if beta is None else float(beta)
    if not math.isfinite(beta):
        raise LucidError(f"--beta must be a finite number, got {beta}")
    out_dir = Path(out_dir)
    stem = f"query-c{cls}-n{row}"
    onnx_path, vnnlib_path = out_dir / f"{stem}.onnx", out_dir / f"{stem}.vnnlib"
    # the query is one dense graph (convolutions lowered), the form VNN-COMP tools read most widely
    n, other = (replace(dense_network(source, p), convs=()) for p in (0, position))
    save_model(
        joint_model(
            n,
            other,
            cls,
            f"LUCID iDP query of run {run.path}: N and N_-{row} (position {position}), "
            f"class {cls}; outputs s_N[c]-s_N[u] (u != c), then s_i[c]-s_i[t] (t != c)",
        ),
        onnx_path,
    )
    lower, upper = run.domain
    header = [
        (
            f"LUCID iDP query: run {run.path}, class {cls}, N_-{row} = the network without training row {row} "
            f"(position {position} of networks.safetensors), beta = {beta!r}."
        ),
        f"Network: {onnx_path.name}; X = the input in the networks' space (after the run's scaler);",
        (
            f"Y_0..Y_{run.num_classes - 2} = s_N[{cls}] - s_N[u] for u != {cls}, "
            f"Y_{run.num_classes - 1}..Y_{2 * run.num_classes - 3} = s_i[{cls}] - s_i[t] for t != {cls}."
        ),
        (
            "This property is the VIOLATION: a satisfying X is a leaking input (N says class "
            f"{cls} with confidence >= beta, N_-{row} does not)."
        ),
        "UNSAT proves no such input exists; it is expected whenever beta is above the proved bound.",
    ]
    write_text_atomic(vnnlib_path, query_text(lower, upper, run.num_classes, cls, beta, header))
    return onnx_path, vnnlib_path
