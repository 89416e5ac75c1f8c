"""The manifest of `lucid import` (docs/interop.md): its reading, and the run.json fields it gives.

The manifest lists one file per network (ONNX, a `.pt` state dict or `.safetensors`): N (removed
null) and one network per training row, or stacked `.safetensors` files of many networks each; the
training algorithm's name; and optionally the run's domain, labels, scaler, feature names and a
state-dict CNN's image, strides and padding ("conv"). Network paths must lie inside the
manifest's directory. `read_manifest` checks its form; the fields are checked
against the data and N's width when the importer builds run.json from them (`domain_of`,
`labels_of`, `scaler_of`, `feature_names_of`), each with its `lucid train` default when absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from lucid.atomic import read_json
from lucid.dynamic_range import check_scaler_range
from lucid.errors import LucidError
from lucid.interop.import_data import MAX_FILE_BYTES, ImportData, checked_file
from lucid.interop.state_dict import CONV_FORM, ConvSpec

IN_UNIT_SLACK = 1e-6  # as lucid.data: features within [-slack, 1 + slack] count as in [0, 1]


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
    # per entry of `files`: the network's position in a stacked file, None for a file of one network
    positions: list[int | None] = field(default_factory=list)
    stacked: list[Path] = field(default_factory=list)  # stacked files, until `add_stacked` lists their networks
    conv: ConvSpec | None = None  # a state-dict CNN's image, strides and padding: the manifest's "conv"

    def add_stacked(self, file: Path, removed: list[int]) -> None:
        """The networks of a stacked file, one entry each, in the file's order."""
        self.files += [file] * len(removed)
        self.removed += removed
        self.positions += list(range(len(removed)))

    def name_of(self, j: int) -> str:
        """Entry j as messages name it: the file's name, and the position in a stacked file."""
        position = self.positions[j]
        return self.files[j].name if position is None else f"{self.files[j].name} (network {position})"


def read_manifest(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Manifest:
    """The manifest at `path`, its form checked (fields, training record, one entry per network)."""
    path = Path(path)
    checked_file(path, "manifest", max_bytes)
    obj = read_json(path, missing=f"manifest {path} does not exist", unreadable=f"cannot read manifest {path} as JSON")
    if not isinstance(obj, dict):
        raise LucidError(f"manifest {path} must be a JSON object with 'training' and 'networks'")
    unknown = sorted(
        set(obj) - {"training", "networks", "domain", "labels", "scaler", "feature_names", "origin", "conv"}
    )
    if unknown:
        raise LucidError(f"manifest {path}: unknown field '{unknown[0]}'")
    training = obj.get("training")
    if not isinstance(training, dict) or not isinstance(training.get("name"), str) or not training["name"].strip():
        raise LucidError(
            f"manifest {path}: 'training' must be an object with a non-empty 'name' "
            "(and optional 'version' and 'description')"
        )
    record = {"name": training["name"]}
    for key in ("version", "description"):
        value = training.get(key, "")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise LucidError(f"manifest {path}: training '{key}' must be a string")
        record[key] = str(value)
    networks = obj.get("networks")
    if not isinstance(networks, list) or not networks:
        raise LucidError(f'manifest {path}: \'networks\' must be a non-empty list of {{"file": ..., "removed": ...}}')
    files, removed, stacked = [], [], []
    for j, entry in enumerate(networks):
        form = '{"file": PATH, "removed": ROW or null} (or {"file": PATH, "stacked": true})'
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise LucidError(f"manifest {path}: networks[{j}] must be {form}")
        if entry.get("stacked", False) not in (True, False):
            raise LucidError(f"manifest {path}: networks[{j}] 'stacked' must be true or false")
        if entry.get("stacked"):
            if "removed" in entry:
                raise LucidError(
                    f"manifest {path}: networks[{j}] is stacked, so its rows come from the file's "
                    "'removed' tensor; drop its 'removed' field"
                )
            if Path(entry["file"]).suffix.lower() != ".safetensors":
                raise LucidError(
                    f"manifest {path}: networks[{j}] is stacked but '{entry['file']}' is not a "
                    ".safetensors file; a stacked file is safetensors (docs/interop.md)"
                )
            stacked.append(_network_path(path, entry["file"], j))
            continue
        if "removed" not in entry:
            raise LucidError(f"manifest {path}: networks[{j}] must be {form}")
        row = entry["removed"]
        if row is not None and (isinstance(row, bool) or not isinstance(row, int) or row < 0):
            raise LucidError(
                f"manifest {path}: networks[{j}] 'removed' must be a training row (an integer >= 0) or null"
            )
        files.append(_network_path(path, entry["file"], j))
        removed.append(-1 if row is None else row)
    return Manifest(
        path,
        record,
        files,
        removed,
        obj.get("domain"),
        obj.get("labels"),
        obj.get("scaler"),
        obj.get("feature_names"),
        obj.get("origin"),
        [None] * len(files),
        stacked,
        _conv_spec(obj.get("conv"), path),
    )


def _network_path(manifest: Path, name: str, j: int) -> Path:
    """A network file's path: relative to the manifest's directory and, once every '..' and symbolic
    link is followed, inside it. A manifest is often someone else's: it must not make the import read
    any other file the user can read (a key, a system file) into a run directory."""
    where = f"manifest {manifest}: networks[{j}] file '{name}'"
    if Path(name).is_absolute():
        raise LucidError(
            f"{where} is an absolute path; give it relative to the manifest's directory (copy or move the file there)"
        )
    base = manifest.parent.resolve()
    target = (manifest.parent / name).resolve()
    if not target.is_relative_to(base):
        raise LucidError(
            f"{where} resolves to {target}, outside the manifest's directory {base}; copy or move "
            "the file into that directory (a symbolic link must point inside it too)"
        )
    return manifest.parent / name


def _conv_spec(c: Any, path: Path) -> ConvSpec | None:
    """The manifest's "conv": what a state dict of a 2-D CNN does not say (None when absent)."""
    if c is None:
        return None
    bad = LucidError(
        f"manifest {path}: write 'conv' as {CONV_FORM}, with positive sizes, strides >= 1 and pads >= 0 "
        "(one layer per Conv2d, in order)"
    )

    def whole(v: Any, least: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise bad
        return v

    if (
        not isinstance(c, dict)
        or set(c) != {"input_shape", "layers"}
        or not isinstance(c["input_shape"], list)
        or len(c["input_shape"]) != 3
        or not isinstance(c["layers"], list)
        or not c["layers"]
    ):
        raise bad
    shape = cast(tuple[int, int, int], tuple(whole(v, 1) for v in c["input_shape"]))  # C, H, W: checked above
    if not all(isinstance(layer, dict) and set(layer) == {"stride", "pad"} for layer in c["layers"]):
        raise bad
    return ConvSpec(
        shape,
        tuple(whole(layer["stride"], 1) for layer in c["layers"]),
        tuple(whole(layer["pad"], 0) for layer in c["layers"]),
    )


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
            raise LucidError(f'{where} must be {{"lower": [...], "upper": [...]}}')
        lower = _vector(manifest.domain.get("lower"), d, f"{where} 'lower'")
        upper = _vector(manifest.domain.get("upper"), d, f"{where} 'upper'")
        if (lower > upper).any():
            raise LucidError(f"{where}: lower > upper for feature {int(np.argmax(lower > upper))}")
        slack = IN_UNIT_SLACK * np.maximum(1.0, np.maximum(np.abs(lower), np.abs(upper)))
        outside = (data.X_train < lower - slack) | (data.X_train > upper + slack)
        if outside.any():
            r, c = np.argwhere(outside)[0]
            raise LucidError(
                f"{where}: {int(outside.any(axis=1).sum())} training row(s) lie outside it "
                f"(first: row {int(r)}, feature {int(c)}); the domain is in the networks' input space"
            )
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
    if (
        not isinstance(labels, list)
        or len(labels) != num_classes
        or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in labels)
        or len({json.dumps(v) for v in labels}) != num_classes
    ):
        raise LucidError(
            f"manifest {manifest.path}: 'labels' must list {num_classes} distinct values "
            "(the original label of each output index)"
        )
    return labels


def scaler_of(manifest: Manifest, d: int) -> dict:
    if manifest.scaler is None:
        return {"type": "affine", "offset": [0.0] * d, "scale": [1.0] * d}
    s = manifest.scaler
    where = f"manifest {manifest.path}: scaler"
    if not isinstance(s, dict) or s.get("type", "affine") != "affine":
        raise LucidError(f'{where} must be {{"type": "affine", "offset": [...], "scale": [...]}}')
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
