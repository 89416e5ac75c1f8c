"""`lucid import`: a run directory from networks trained elsewhere (docs/interop.md).

The manifest (`lucid.interop.manifest`) lists one file per network (ONNX, a `.pt` state dict or
`.safetensors`): N (removed null) and one network per training row. Everything that can be
checked from the manifest and the data (`lucid.interop.import_data`) is checked before any
network is read (`check_rows`); then the networks are read one at a time into one preallocated
float32 array per tensor of networks.safetensors (N at position 0, then rows 0..n-1, the layout
`lucid train` writes), so no float64 copy of all networks ever exists. The run is assembled in a
temporary sibling of OUT and renamed to OUT in one step: OUT is either absent or complete,
whatever check fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from lucid.atomic import write_atomic, write_json_atomic
from lucid.dynamic_range import check_network_range, check_tensors_range
from lucid.errors import LucidError
from lucid.interop.dense import DenseNet, non_finite_layer
from lucid.interop.import_data import MAX_FILE_BYTES, ImportData, checked_file, load_data
from lucid.interop.manifest import Manifest, domain_of, feature_names_of, labels_of, read_manifest, scaler_of
from lucid.interop.onnx_read import read_onnx
from lucid.interop.provenance import NOT_KEPT, imported_run_fingerprint, restored_run
from lucid.interop.state_dict import ConvSpec, StackedStateDicts, read_safetensors, read_torch
from lucid.network import NETWORKS_FILE
from lucid.rundir import EXTERNAL_ALGORITHM, RUN_FORMAT

READERS: dict[str, Callable[..., DenseNet]] = {
    ".onnx": read_onnx,
    ".pt": read_torch,
    ".pth": read_torch,
    ".safetensors": read_safetensors,
}


# ------------------------------------------------------------------------------------- networks


def open_stacked(manifest: Manifest, max_bytes: int = MAX_FILE_BYTES) -> dict[Path, StackedStateDicts]:
    """Each stacked file of the manifest, read once, its networks listed in the manifest."""
    stacks: dict[Path, StackedStateDicts] = {}
    for file in manifest.stacked:
        if file in stacks:
            raise LucidError(f"manifest {manifest.path}: the stacked file {file.name} is listed twice")
        stacks[file] = StackedStateDicts(checked_file(file, f"manifest {manifest.path}: network file", max_bytes))
        manifest.add_stacked(file, stacks[file].removed.tolist())
    return stacks


def check_rows(manifest: Manifest, train_size: int, max_bytes: int = MAX_FILE_BYTES) -> list[int]:
    """The manifest's order of the stack: N first, then the network of each training row 0..n-1."""
    where: dict[int, int] = {}
    for j, row in enumerate(manifest.removed):
        if row in where:
            which = "N (removed null)" if row == -1 else f"training row {row}"
            raise LucidError(
                f"manifest {manifest.path}: {which} appears twice "
                f"({manifest.name_of(where[row])} and {manifest.name_of(j)})"
            )
        if row >= train_size:
            raise LucidError(
                f"manifest {manifest.path}: {manifest.name_of(j)} leaves out row {row}, "
                f"but the data has {train_size} training rows (0..{train_size - 1})"
            )
        where[row] = j
    if -1 not in where:
        raise LucidError(f'manifest {manifest.path}: no network is N (one entry needs "removed": null)')
    missing = [row for row in range(train_size) if row not in where]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise LucidError(
            f"manifest {manifest.path}: no network for training row {missing[0]}{more} "
            f"(LUCID needs one per row of the {train_size} training rows)"
        )
    for file in (f for f in dict.fromkeys(manifest.files) if f not in manifest.stacked):  # each file once, in order
        if file.suffix.lower() not in READERS:
            raise LucidError(
                f"{file}: unknown network file type '{file.suffix}' (use .onnx, .pt, .pth or .safetensors)"
            )
        checked_file(file, f"manifest {manifest.path}: network file", max_bytes)
    return [where[row] for row in range(-1, train_size)]


def read_network(path: Path, conv: ConvSpec | None = None) -> DenseNet:
    """The network of a file that holds one; `conv`: a state-dict CNN's image, strides and padding
    (an ONNX graph says its own)."""
    if path.suffix.lower() == ".onnx":
        return two_scores(read_onnx(path))
    return two_scores(READERS[path.suffix.lower()](path, conv))


def _read_entry(manifest: Manifest, j: int, stacks: dict[Path, StackedStateDicts]) -> DenseNet:
    position = manifest.positions[j]
    if position is None:
        return read_network(manifest.files[j], manifest.conv)
    return two_scores(stacks[manifest.files[j]].network(position, manifest.conv))


def two_scores(net: DenseNet) -> DenseNet:
    """A binary head of one logit z (scikit-learn's MLPClassifier, a BCEWithLogits model) as the two
    scores (0, z): the same label (class 1 iff z > 0; a tie goes to class 0, as scikit-learn's 0.5
    threshold does) and the same confidence |z|. Every other network is returned as it is."""
    if net.weights[-1].shape[0] != 1:
        return net
    w, b = net.weights[-1], net.biases[-1]
    weights = [*net.weights[:-1], np.concatenate([np.zeros_like(w), w])]
    biases = [*net.biases[:-1], np.concatenate([np.zeros_like(b), b])]
    return DenseNet(weights, biases, net.kinds, net.convs)


def _check(
    net: DenseNet,
    source: str,
    row: int,
    reference: DenseNet,
    reference_name: str,
    domain: tuple[list[float], list[float]],
) -> None:
    if net.layer_sizes != reference.layer_sizes:
        raise LucidError(
            f"{source}: layer widths {net.layer_sizes} differ from N's {reference.layer_sizes} "
            f"({reference_name}); every network needs the same architecture"
        )
    for k, (mine, theirs) in enumerate(zip(net.layer_kinds, reference.layer_kinds, strict=True)):
        if mine != theirs:
            raise LucidError(
                f"{source}: layer {k} is {mine} but N's is {theirs} ({reference_name}); every "
                "network needs N's architecture, layer kinds included"
            )
    bad = non_finite_layer(net)
    if bad is not None:
        who = "N" if row == -1 else f"the network without row {row}"
        raise LucidError(f"{source} ({who}): layer {bad} has NaN or infinite parameters")
    check_network_range(net.weights, net.biases, *domain, source)  # naming the file; the stack's hull is checked later


def _parameters(net: DenseNet, cnn: bool) -> dict[str, np.ndarray]:
    """One network's tensors under networks.safetensors' names: a `cnn2d` run's convolutions as
    `conv.{j}` kernels and the dense layers after them as `layers.{i}`; else every layer as dense."""
    found: dict[str, np.ndarray] = {}
    convs = net.convs if cnn else ()
    for j, c in enumerate(convs):
        found[f"conv.{j}.weight"], found[f"conv.{j}.bias"] = c.weight, c.bias
    for i, (w, b) in enumerate(zip(net.weights[len(convs) :], net.biases[len(convs) :], strict=True)):
        found[f"layers.{i}.weight"], found[f"layers.{i}.bias"] = w, b
    return found


def _stacked(
    manifest: Manifest,
    order: list[int],
    n: DenseNet,
    stacks: dict[Path, StackedStateDicts],
    domain: tuple[list[float], list[float]],
    cnn: bool,
) -> dict[str, np.ndarray]:
    """networks.safetensors' tensors, filled one network at a time (position p = order[p]); `cnn`:
    stored as a `cnn2d` run (N's `DenseNet.cnn2d`)."""
    k = len(order)
    tensors = {name: np.empty((k, *v.shape), dtype=np.float32) for name, v in _parameters(n, cnn).items()}
    tensors["removed"] = np.array([manifest.removed[j] for j in order], dtype=np.int64)
    reference, n_name = n, manifest.name_of(order[0])
    for position, j in enumerate(order):
        net = n if position == 0 else _read_entry(manifest, j, stacks)
        where = manifest.files[j].parent / manifest.name_of(j)
        _check(net, str(where), manifest.removed[j], reference, n_name, domain)
        for name, value in _parameters(net, cnn).items():
            tensors[name][position] = value
    return tensors


# ------------------------------------------------------------------------------------- the run


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LucidError(f"output {out} exists and is not an empty directory; choose another --out")


@dataclass
class Imported:
    path: Path
    meta: dict  # run.json's content
    networks: int
    domain_from_data: bool  # no domain in the manifest: it was derived from the rows
    # "kept": run.json is the exported run's own (same fingerprint); else why not, or "" without an origin
    provenance: str = ""


def import_run(
    manifest_path: str | Path, data_path: str | Path, out: str | Path, max_file_bytes: int = MAX_FILE_BYTES
) -> Imported:
    """Build the run directory `out` from the manifest's networks and the data; every input file is
    refused, before it is read, when larger than `max_file_bytes`."""
    out = Path(out)
    _check_out(out)
    manifest = read_manifest(manifest_path, max_file_bytes)
    data = load_data(data_path, max_file_bytes)
    stacks = open_stacked(manifest, max_file_bytes)
    order = check_rows(manifest, len(data.y_train), max_file_bytes)
    n_file = manifest.files[order[0]].parent / manifest.name_of(order[0])
    n = _read_entry(manifest, order[0], stacks)
    sizes = n.layer_sizes
    d, num_classes = sizes[0], sizes[-1]
    if d != data.X_train.shape[1]:
        raise LucidError(f"{n_file}: N takes {d} inputs but the data has {data.X_train.shape[1]} features")
    if num_classes < 2:
        raise LucidError(f"{n_file}: N has {num_classes} output; a classifier needs at least 2 classes")
    for name, y in (("training", data.y_train), ("test", data.y_test)):
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise LucidError(
                f"{data.source}: the {name} labels must be class ids 0..{num_classes - 1} "
                f"(the networks' output index), got {int(y.min())}..{int(y.max())}"
            )
    domain, from_data = domain_of(manifest, data, d)
    meta: dict[str, Any] = {
        "format": RUN_FORMAT,
        "num_classes": num_classes,
        "input_dim": d,
        "train_size": len(data.y_train),
        "test_size": len(data.y_test),
        "domain": domain,
        # a 2-D CNN stays one (its kernels stored, lowered as `lucid train`'s are); any other as dense layers
        "architecture": n.cnn2d() or {"type": "mlp", "hidden": sizes[1:-1]},
        "training": {"algorithm": EXTERNAL_ALGORITHM, **manifest.training},
        "labels": labels_of(manifest, num_classes),
        "scaler": scaler_of(manifest, d),
        "data": {
            "source": data.source,
            "feature_names": feature_names_of(manifest, d),
            # whether the owner gave the verified box: a report must not call a given box "no public domain"
            "domain_source": "manifest" if manifest.domain is not None else "default",
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        tensors = _stacked(
            manifest, order, n, stacks, (domain["lower"], domain["upper"]), meta["architecture"]["type"] == "cnn2d"
        )
        check_tensors_range(tensors, meta, f"the networks of manifest {manifest.path}")
        arrays = (data.X_train, data.y_train, data.X_test, data.y_test)
        meta["training"]["fingerprint"] = imported_run_fingerprint(meta, arrays, tensors)
        kept = restored_run(manifest.origin, meta, arrays, tensors)
        provenance = "kept" if kept is not None else ("" if manifest.origin is None else NOT_KEPT)
        meta = kept or meta
        _publish(staging, out, meta, data, tensors)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Imported(out, meta, len(order), from_data, provenance)


def _publish(staging: Path, out: Path, meta: dict, data: ImportData, tensors: dict[str, np.ndarray]) -> None:
    write_atomic(staging / NETWORKS_FILE, lambda tmp: save_file(tensors, tmp))

    def write_npz(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, X_train=data.X_train, y_train=data.y_train, X_test=data.X_test, y_test=data.y_test)

    write_atomic(staging / "data.npz", write_npz)
    write_json_atomic(staging / "run.json", meta)  # last: its presence marks a complete run
    _check_out(out)  # again: someone may have written there while the networks were read
    if out.exists():
        out.rmdir()
    os.replace(staging, out)
