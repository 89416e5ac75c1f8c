"""Reading a run directory (format `lucid-run/1`, documented in docs/formats.md).

RUN/
  run.json               metadata: classes, input dim, domain (network input space), scaler, ...
  networks.safetensors   N and every leave-one-out network (see lucid.network)
  data.npz               scaled splits: X_train, y_train, X_test, y_test (y as 0..C-1)
  bounds.json            written by `lucid verify` (format `lucid-bounds/1`)
  cache/                 derived, recomputable data (e.g. N's pre-activation bounds)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from lucid.atomic import read_json, write_json_atomic
from lucid.dynamic_range import check_scaler_range
from lucid.errors import LucidError
from lucid.network import load_networks

RUN_FORMAT = "lucid-run/1"
EXTERNAL_ALGORITHM = "external"  # run.json's training algorithm of a run built by `lucid import`
BOUNDS_FORMAT = "lucid-bounds/1"
BOUNDS_FILE = "bounds.json"
RESIDUAL_FILES = "residual-*.safetensors"  # the parameter files of `lucid verify --residual` (lucid/residual.py)


def encode_float(v: float | None) -> float | str | None:
    """JSON has no infinities: the run directory's files write them as the strings "inf"/"-inf"."""
    if v is None or math.isfinite(v):
        return v
    return "inf" if v > 0 else "-inf"


@overload
def decode_float(v: float | str) -> float: ...
@overload
def decode_float(v: None) -> None: ...
def decode_float(v: float | str | None) -> float | None:
    return None if v is None else float(v)


def bound_entry_value(v: float | None, *, upper: bool) -> float | None:
    """bounds.json numbers: +inf (nothing proved) -> null; -inf (nothing can leak) -> -1.0 for an
    upper bound (same effect: N's confidence in its own label is >= 0) and null for a lower one."""
    if v is None:
        return None
    if math.isinf(v):
        return -1.0 if (upper and v < 0) else None
    return float(v)


def bound_entry(
    upper: float | None,
    lower: float | None,
    *,
    complete: bool,
    exact: bool,
    seconds: float,
    nodes: int,
    reason: str | None,
    leaking_row: int | None,
    **extra: Any,
) -> dict:
    """One class's entry of bounds.json (every strategy builds its entries here): its bounds as
    `bound_entry_value` writes them, whether it finished (`complete`) without a gap (`exact`), its
    seconds and nodes, why it stopped, the training row of its best leak, and a strategy's own
    fields (`extra`: `stopped_in`, `removals`)."""
    return {
        "upper": bound_entry_value(upper, upper=True),
        "lower": bound_entry_value(lower, upper=False),
        "complete": bool(complete),
        "exact": bool(exact),
        "seconds": round(seconds, 3),
        "nodes": nodes,
        "reason": reason,
        "leaking_row": leaking_row,
        **extra,
    }


def write_bounds(
    run_dir: str | Path,
    bounds: dict[str, dict],
    *,
    solver: str,
    options: dict[str, Any],
    regions: dict | None = None,
    residual: dict | None = None,
    residual_choice: dict | None = None,
) -> dict:
    """Write RUN/bounds.json (lucid-bounds/1) atomically and return its content; `bounds` maps a
    class id to its entry (upper, lower, complete, exact, seconds, nodes, reason, leaking_row);
    `regions`: the per-box bounds of `lucid verify --regions K` (lucid/regions/tree.py); `residual`: the
    residual sets of `lucid verify --residual M` (lucid/residual.py); `residual_choice`: with
    `--residual auto`, the M chosen and its figures (lucid/residual_choice.py). Each class's `upper` always
    bounds every network, so a reader that knows neither section stays sound."""
    content = {"format": BOUNDS_FORMAT, "solver": solver, "options": options, "bounds": bounds}
    if regions is not None:
        content["regions"] = regions
    if residual is not None:
        content["residual"] = residual
    if residual_choice is not None:
        content["residual_choice"] = residual_choice
    write_json_atomic(Path(run_dir) / BOUNDS_FILE, content)
    _remove_stale_residual_files(Path(run_dir), residual)
    return content


def _remove_stale_residual_files(run_dir: Path, residual: dict | None) -> None:
    """Delete the residual parameter files that bounds.json no longer names: after its rename, since
    the old bounds.json named the old file until then."""
    keep = None if residual is None else residual.get("file")
    for path in run_dir.glob(RESIDUAL_FILES):
        if path.name != keep:
            path.unlink(missing_ok=True)


@dataclass
class Run:
    path: Path
    meta: dict

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def input_dim(self) -> int:
        return int(self.meta["input_dim"])

    @property
    def train_size(self) -> int:
        return int(self.meta["train_size"])

    @property
    def domain(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) of the verified input box, in the networks' input space."""
        d = self.meta["domain"]
        return np.asarray(d["lower"], dtype=np.float64), np.asarray(d["upper"], dtype=np.float64)

    @property
    def cache_dir(self) -> Path:
        return self.path / "cache"

    def networks(self):
        return load_networks(self.path, self.meta)

    def data(self) -> dict[str, np.ndarray]:
        path = self.path / "data.npz"
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        except FileNotFoundError:
            raise LucidError(f"{path} does not exist") from None
        except Exception as exc:  # noqa: BLE001 (zipfile/numpy raise many types for corrupt files)
            raise LucidError(f"cannot read {path}: {exc}") from None


def open_run(path: str | Path) -> Run:
    """Open and validate a run directory's metadata (tensors are loaded on demand)."""
    path = Path(path)
    if not path.is_dir():
        raise LucidError(f"run directory {path} does not exist")
    meta_path = path / "run.json"
    meta = read_json(
        meta_path, missing=f"{path} is not a LUCID run directory (no run.json)", unreadable=f"{meta_path} is corrupt"
    )
    if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
        raise LucidError(f"{meta_path} is not a {RUN_FORMAT} file")
    for key in ("num_classes", "input_dim", "train_size", "domain", "architecture", "labels"):
        if key not in meta:
            raise LucidError(f"{meta_path} lacks the '{key}' field")
    return Run(path, meta)


def read_scaler(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(offset, scale) of run.json's affine scaler: x_net = (x - offset) * scale (identity if absent)."""
    d = run.input_dim
    scaler = run.meta.get("scaler") or {"type": "affine", "offset": [0.0] * d, "scale": [1.0] * d}
    if scaler.get("type", "affine") != "affine":
        raise LucidError(f"run.json: unsupported scaler type {scaler.get('type')!r}")
    try:
        offset = np.asarray(scaler["offset"], dtype=np.float64).reshape(d)
        scale = np.asarray(scaler["scale"], dtype=np.float64).reshape(d)
    except (KeyError, ValueError, TypeError):
        raise LucidError(f"run.json: the scaler needs 'offset' and 'scale' lists of length {d}") from None
    if not (np.isfinite(offset).all() and np.isfinite(scale).all()):
        raise LucidError("run.json: the scaler has non-finite values")
    check_scaler_range(offset, scale, "run.json: scaler")
    return offset, scale


def read_public_inputs(run: Run, path: str | Path) -> np.ndarray:
    """`--public-inputs FILE`: an .npz's array X of public inputs (the data's units), mapped into
    network space and clipped to the domain; one-line LucidError for a missing, malformed,
    wrongly shaped or non-finite file."""
    lower, upper = run.domain
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            X = np.asarray(npz["X"], dtype=np.float64)
    except FileNotFoundError:
        raise LucidError(f"--public-inputs: {path} does not exist") from None
    except (KeyError, ValueError, OSError) as exc:
        raise LucidError(f"--public-inputs: {path} must be a .npz file with an array X ({exc})") from None
    if X.ndim != 2 or X.shape[1] != len(lower) or len(X) == 0:
        raise LucidError(f"--public-inputs: X must have shape [rows, {len(lower)}], got {list(X.shape)}")
    if not np.isfinite(X).all():
        raise LucidError("--public-inputs: X has NaN or infinite values")
    offset, scale = read_scaler(run)
    return np.clip((X - offset) * scale, lower, upper)


def trained_run_fingerprint(
    meta: dict, X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray, y_test: np.ndarray
) -> str:
    """Identity of a run of `lucid train`: the exact training inputs and everything that defines T's
    output. Paths (data source, test file) are left out so the same data reached another way is the
    same run. (`lucid import` keeps it when a run comes back from `lucid export --all`.)"""
    h = hashlib.sha256()
    ident = {k: meta[k] for k in ("format", "architecture", "labels", "scaler", "domain")}
    ident["training"] = {k: v for k, v in meta["training"].items() if k not in ("test_data", "fingerprint")}
    h.update(json.dumps(ident, sort_keys=True).encode())
    for arr in (X_train, y_train, X_test, y_test):
        h.update(str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()
