"""`lucid import`: a run directory from networks trained elsewhere (docs/interop.md).

The manifest lists one file per network (ONNX, a `.pt` state dict or `.safetensors`): N (removed
null) and one network per training row. Everything that can be checked from the manifest and the
data is checked before any network is read; then the networks are read one at a time into one
preallocated float32 array per tensor of networks.safetensors (N at position 0, then rows 0..n-1,
the layout `lucid train` writes), so no float64 copy of all networks ever exists. The run is
assembled in a temporary sibling of OUT and renamed to OUT in one step: OUT is either absent or
complete, whatever check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from lucid.atomic import read_json, write_atomic, write_json_atomic
from lucid.dynamic_range import check_scaler_range, check_tensors_range
from lucid.errors import LucidError
from lucid.interop.dense import DenseNet, non_finite_layer
from lucid.interop.provenance import NOT_KEPT, imported_run_fingerprint, restored_run
from lucid.interop.onnx_io import read_onnx
from lucid.interop.state_dict import read_safetensors, read_torch
from lucid.network import NETWORKS_FILE
from lucid.rundir import EXTERNAL_ALGORITHM, RUN_FORMAT

IN_UNIT_SLACK = 1e-6  # as lucid.data: features within [-slack, 1 + slack] count as in [0, 1]
READERS = {".onnx": read_onnx, ".pt": read_torch, ".pth": read_torch, ".safetensors": read_safetensors}


@dataclass
class Manifest:
    path: Path
    training: dict[str, str]
    files: list[Path]  # in the manifest's order
    removed: list[int]  # -1 for N
    domain: Any
    labels: Any
    scaler: Any
    feature_names: Any
    origin: Any = None  # `lucid export --all`'s record of the run it came from


@dataclass
class ImportData:
    X_train: np.ndarray  # float32 [n, d]
    y_train: np.ndarray  # int64 class ids
    X_test: np.ndarray
    y_test: np.ndarray
    source: str


# ------------------------------------------------------------------------------------- manifest


def read_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    obj = read_json(path, missing=f"manifest {path} does not exist", unreadable=f"cannot read manifest {path} as JSON")
    if not isinstance(obj, dict):
        raise LucidError(f"manifest {path} must be a JSON object with 'training' and 'networks'")
    unknown = sorted(set(obj) - {"training", "networks", "domain", "labels", "scaler", "feature_names", "origin"})
    if unknown:
        raise LucidError(f"manifest {path}: unknown field '{unknown[0]}'")
    training = obj.get("training")
    if not isinstance(training, dict) or not isinstance(training.get("name"), str) or not training["name"].strip():
        raise LucidError(f"manifest {path}: 'training' must be an object with a non-empty 'name' "
                         "(and optional 'version' and 'description')")
    record = {"name": training["name"]}
    for key in ("version", "description"):
        value = training.get(key, "")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise LucidError(f"manifest {path}: training '{key}' must be a string")
        record[key] = str(value)
    networks = obj.get("networks")
    if not isinstance(networks, list) or not networks:
        raise LucidError(f"manifest {path}: 'networks' must be a non-empty list of {{\"file\": ..., \"removed\": ...}}")
    files, removed = [], []
    for j, entry in enumerate(networks):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or "removed" not in entry:
            raise LucidError(f"manifest {path}: networks[{j}] must be {{\"file\": PATH, \"removed\": ROW or null}}")
        row = entry["removed"]
        if row is not None and (isinstance(row, bool) or not isinstance(row, int) or row < 0):
            raise LucidError(f"manifest {path}: networks[{j}] 'removed' must be a training row (an integer >= 0) or null")
        files.append(path.parent / entry["file"])  # relative paths are relative to the manifest
        removed.append(-1 if row is None else row)
    return Manifest(path, record, files, removed, obj.get("domain"), obj.get("labels"), obj.get("scaler"),
                    obj.get("feature_names"), obj.get("origin"))


def check_rows(manifest: Manifest, train_size: int) -> list[int]:
    """The manifest's order of the stack: N first, then the network of each training row 0..n-1."""
    where: dict[int, int] = {}
    for j, row in enumerate(manifest.removed):
        if row in where:
            which = "N (removed null)" if row == -1 else f"training row {row}"
            raise LucidError(f"manifest {manifest.path}: {which} appears twice "
                             f"({manifest.files[where[row]].name} and {manifest.files[j].name})")
        if row >= train_size:
            raise LucidError(f"manifest {manifest.path}: {manifest.files[j].name} leaves out row {row}, "
                             f"but the data has {train_size} training rows (0..{train_size - 1})")
        where[row] = j
    if -1 not in where:
        raise LucidError(f"manifest {manifest.path}: no network is N (one entry needs \"removed\": null)")
    missing = [row for row in range(train_size) if row not in where]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise LucidError(f"manifest {manifest.path}: no network for training row {missing[0]}{more} "
                         f"(LUCID needs one per row of the {train_size} training rows)")
    for file in manifest.files:
        if not file.is_file():
            raise LucidError(f"manifest {manifest.path}: network file {file} does not exist")
        if file.suffix.lower() not in READERS:
            raise LucidError(f"{file}: unknown network file type '{file.suffix}' (use .onnx, .pt, .pth or .safetensors)")
    return [where[row] for row in range(-1, train_size)]


# ------------------------------------------------------------------------------------- data


def load_data(path: str | Path) -> ImportData:
    """DATA: an .npz with X_train, y_train (and optionally X_test, y_test), or X, y (all training rows),
    in the networks' input space, y as class ids (the networks' output index)."""
    path = Path(path)
    if path.suffix.lower() != ".npz":
        raise LucidError(f"--data must be an .npz file with X_train and y_train (or X and y), got {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise LucidError(f"data file {path} does not exist") from None
    except Exception as exc:  # zipfile/numpy raise many types for damaged or pickled files
        raise LucidError(f"cannot read {path} as .npz: {exc}") from None
    if "X_train" in arrays and "y_train" in arrays:
        names = ("X_train", "y_train", "X_test", "y_test")
        if ("X_test" in arrays) != ("y_test" in arrays):
            raise LucidError(f"{path} has only one of X_test and y_test; give both or neither")
    elif "X" in arrays and "y" in arrays:
        names = ("X", "y", "", "")
    else:
        raise LucidError(f"{path} needs arrays X_train and y_train (optionally X_test, y_test), or X and y")
    X = _features(arrays[names[0]], path, names[0])
    y = _class_ids(arrays[names[1]], len(X), path, names[1])
    if names[2] in arrays:
        X_test = _features(arrays[names[2]], path, names[2])
        y_test = _class_ids(arrays[names[3]], len(X_test), path, names[3])
        if X_test.shape[1] != X.shape[1]:
            raise LucidError(f"{path}: {names[2]} has {X_test.shape[1]} features, {names[0]} {X.shape[1]}")
    else:
        X_test, y_test = np.zeros((0, X.shape[1]), dtype=np.float32), np.zeros(0, dtype=np.int64)
    if len(X) < 1:
        raise LucidError(f"{path}: {names[0]} has no rows")
    return ImportData(X, y, X_test, y_test, str(path))


def _features(X: np.ndarray, path: Path, name: str) -> np.ndarray:
    if X.ndim != 2 or not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise LucidError(f"{path}: {name} must be a 2-D array of real numbers [rows, features], got {X.dtype} {X.shape}")
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise LucidError(f"{path}: {name} has {int(bad.sum())} NaN/inf value(s) (first: row {int(r)}, feature {int(c)})")
    return X.astype(np.float32)


def _class_ids(y: np.ndarray, rows: int, path: Path, name: str) -> np.ndarray:
    if y.ndim != 1 or len(y) != rows:
        raise LucidError(f"{path}: {name} must be a 1-D array with one class id per row, got shape {y.shape}")
    if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all())):
        raise LucidError(f"{path}: {name} must hold class ids (integers 0..C-1, the networks' output index)")
    return y.astype(np.int64)


# ------------------------------------------------------------------------------------- run.json fields


def _vector(value: Any, d: int, what: str) -> np.ndarray:
    try:
        v = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        v = np.zeros(0)
    if v.shape != (d,) or not np.isfinite(v).all():
        raise LucidError(f"{what} must be a list of {d} finite numbers (one per feature)")
    return v


def domain_of(manifest: Manifest, data: ImportData, d: int) -> tuple[dict, bool]:
    """(run.json's domain, whether it was derived from the data). Given: checked to hold every
    training row. Default, as `lucid train` does: [0, 1] for a feature whose values lie in it,
    else the feature's range over the rows (which then reveals the data's extremes)."""
    where = f"manifest {manifest.path}: domain"
    if manifest.domain is not None:
        if not isinstance(manifest.domain, dict):
            raise LucidError(f"{where} must be {{\"lower\": [...], \"upper\": [...]}}")
        lower = _vector(manifest.domain.get("lower"), d, f"{where} 'lower'")
        upper = _vector(manifest.domain.get("upper"), d, f"{where} 'upper'")
        if (lower > upper).any():
            raise LucidError(f"{where}: lower > upper for feature {int(np.argmax(lower > upper))}")
        slack = IN_UNIT_SLACK * np.maximum(1.0, np.maximum(np.abs(lower), np.abs(upper)))
        outside = (data.X_train < lower - slack) | (data.X_train > upper + slack)
        if outside.any():
            r, c = np.argwhere(outside)[0]
            raise LucidError(f"{where}: {int(outside.any(axis=1).sum())} training row(s) lie outside it "
                             f"(first: row {int(r)}, feature {int(c)}); the domain is in the networks' input space")
        return {"lower": lower.tolist(), "upper": upper.tolist()}, False
    rows = np.concatenate([data.X_train, data.X_test]).astype(np.float64)
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    in_unit = (lo >= -IN_UNIT_SLACK) & (hi <= 1 + IN_UNIT_SLACK)
    lower, upper = np.where(in_unit, 0.0, lo), np.where(in_unit, 1.0, hi)
    return {"lower": lower.tolist(), "upper": upper.tolist()}, bool((~in_unit).any())


def labels_of(manifest: Manifest, num_classes: int) -> list:
    if manifest.labels is None:
        return list(range(num_classes))
    labels = manifest.labels
    if (not isinstance(labels, list) or len(labels) != num_classes
            or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in labels)
            or len({json.dumps(v) for v in labels}) != num_classes):
        raise LucidError(f"manifest {manifest.path}: 'labels' must list {num_classes} distinct values "
                         "(the original label of each output index)")
    return labels


def scaler_of(manifest: Manifest, d: int) -> dict:
    if manifest.scaler is None:
        return {"type": "affine", "offset": [0.0] * d, "scale": [1.0] * d}
    s = manifest.scaler
    where = f"manifest {manifest.path}: scaler"
    if not isinstance(s, dict) or s.get("type", "affine") != "affine":
        raise LucidError(f"{where} must be {{\"type\": \"affine\", \"offset\": [...], \"scale\": [...]}}")
    offset = _vector(s.get("offset"), d, f"{where} 'offset'")
    scale = _vector(s.get("scale"), d, f"{where} 'scale'")
    check_scaler_range(offset, scale, where)
    return {"type": "affine", "offset": offset.tolist(), "scale": scale.tolist()}


def feature_names_of(manifest: Manifest, d: int) -> list[str]:
    names = manifest.feature_names
    if names is None:
        return [f"x{i}" for i in range(d)]
    if not isinstance(names, list) or len(names) != d or not all(isinstance(n, str) for n in names):
        raise LucidError(f"manifest {manifest.path}: 'feature_names' must list {d} strings")
    return names


# ------------------------------------------------------------------------------------- networks


def read_network(path: Path) -> DenseNet:
    return two_scores(READERS[path.suffix.lower()](path))


def two_scores(net: DenseNet) -> DenseNet:
    """A binary head of one logit z (scikit-learn's MLPClassifier, a BCEWithLogits model) as the two
    scores (0, z): the same label (class 1 iff z > 0; a tie goes to class 0, as scikit-learn's 0.5
    threshold does) and the same confidence |z|. Every other network is returned as it is."""
    if net.weights[-1].shape[0] != 1:
        return net
    w, b = net.weights[-1], net.biases[-1]
    weights = [*net.weights[:-1], np.concatenate([np.zeros_like(w), w])]
    biases = [*net.biases[:-1], np.concatenate([np.zeros_like(b), b])]
    return DenseNet(weights, biases, net.kinds)


def _check(net: DenseNet, path: Path, row: int, reference: DenseNet, reference_file: Path) -> None:
    if net.layer_sizes != reference.layer_sizes:
        raise LucidError(f"{path}: layer widths {net.layer_sizes} differ from N's {reference.layer_sizes} "
                         f"({reference_file.name}); every network needs the same architecture")
    for k, (mine, theirs) in enumerate(zip(net.layer_kinds, reference.layer_kinds)):
        if mine != theirs:
            raise LucidError(f"{path}: layer {k} is {mine} but N's is {theirs} ({reference_file.name}); every "
                             "network needs N's architecture, layer kinds included")
    bad = non_finite_layer(net)
    if bad is not None:
        who = "N" if row == -1 else f"the network without row {row}"
        raise LucidError(f"{path} ({who}): layer {bad} has NaN or infinite parameters")


def _stacked(manifest: Manifest, order: list[int], n: DenseNet) -> dict[str, np.ndarray]:
    """networks.safetensors' tensors, filled one network at a time (position p = order[p])."""
    k = len(order)
    tensors: dict[str, np.ndarray] = {}
    for i, (w, b) in enumerate(zip(n.weights, n.biases)):
        tensors[f"layers.{i}.weight"] = np.empty((k, *w.shape), dtype=np.float32)
        tensors[f"layers.{i}.bias"] = np.empty((k, *b.shape), dtype=np.float32)
    tensors["removed"] = np.array([manifest.removed[j] for j in order], dtype=np.int64)
    reference, n_file = n, manifest.files[order[0]]
    for position, j in enumerate(order):
        net = n if position == 0 else read_network(manifest.files[j])
        _check(net, manifest.files[j], manifest.removed[j], reference, n_file)
        for i, (w, b) in enumerate(zip(net.weights, net.biases)):
            tensors[f"layers.{i}.weight"][position] = w
            tensors[f"layers.{i}.bias"][position] = b
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


def import_run(manifest_path: str | Path, data_path: str | Path, out: str | Path) -> Imported:
    """Build the run directory `out` from the manifest's networks and the data."""
    out = Path(out)
    _check_out(out)
    manifest = read_manifest(manifest_path)
    data = load_data(data_path)
    order = check_rows(manifest, len(data.y_train))
    n_file = manifest.files[order[0]]
    n = read_network(n_file)
    sizes = n.layer_sizes
    d, num_classes = sizes[0], sizes[-1]
    if d != data.X_train.shape[1]:
        raise LucidError(f"{n_file}: N takes {d} inputs but the data has {data.X_train.shape[1]} features")
    if num_classes < 2:
        raise LucidError(f"{n_file}: N has {num_classes} output; a classifier needs at least 2 classes")
    for name, y in (("training", data.y_train), ("test", data.y_test)):
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise LucidError(f"{data.source}: the {name} labels must be class ids 0..{num_classes - 1} "
                             f"(the networks' output index), got {int(y.min())}..{int(y.max())}")
    domain, from_data = domain_of(manifest, data, d)
    meta = {
        "format": RUN_FORMAT, "num_classes": num_classes, "input_dim": d, "train_size": int(len(data.y_train)),
        "test_size": int(len(data.y_test)), "domain": domain,
        "architecture": {"type": "mlp", "hidden": sizes[1:-1]},
        "training": {"algorithm": EXTERNAL_ALGORITHM, **manifest.training},
        "labels": labels_of(manifest, num_classes), "scaler": scaler_of(manifest, d),
        "data": {"source": data.source, "feature_names": feature_names_of(manifest, d)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        tensors = _stacked(manifest, order, n)
        check_tensors_range(tensors, meta, str(manifest.path))
        arrays = (data.X_train, data.y_train, data.X_test, data.y_test)
        meta["training"]["fingerprint"] = imported_run_fingerprint(meta, arrays, tensors)
        kept = restored_run(manifest.origin, meta, arrays, tensors, len(sizes) - 1)
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
