"""The DATA of `lucid import`: an .npz of training (and test) rows in the networks' input space.

Read and checked before any network is: 2-D finite features, one class id per row (as integers,
or floats that are whole numbers), and test arrays with the training features' width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lucid.errors import LucidError

# Per input file of `lucid import` (its --max-file-size raises it): a file above it is refused from
# its size alone, before any byte is read, so a wrong path to a huge file costs no memory.
MAX_FILE_BYTES = 2**30


def size_text(size: int) -> str:
    """A byte count as a --max-file-size value that reads back to at least it."""
    for unit, exponent in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 2**exponent:
            return f"{-(-size // 2 ** (exponent - 1)) / 2:g}{unit}"  # rounded up to half a unit
    return str(size)


def checked_file(path: Path, what: str, max_bytes: int) -> Path:
    """`path` if it is a regular file of at most `max_bytes`; else one line naming it (`what`
    says which input it is) and what to do."""
    if path.is_dir():
        raise LucidError(f"{what} {path} is a directory; give the file itself")
    if not path.is_file():
        kind = "does not exist" if not path.exists() else "is not a regular file"
        raise LucidError(f"{what} {path} {kind}")
    size = path.stat().st_size
    if size > max_bytes:
        raise LucidError(
            f"{what} {path} has {size_text(size)}B, more than the {size_text(max_bytes)}B that lucid "
            f"import reads per file; if it is the right file, pass --max-file-size {size_text(size)}"
        )
    return path


@dataclass
class ImportData:
    X_train: np.ndarray  # float32 [n, d]
    y_train: np.ndarray  # int64 class ids
    X_test: np.ndarray
    y_test: np.ndarray
    source: str


def load_data(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> ImportData:
    """DATA: an .npz with X_train, y_train (and optionally X_test, y_test), or X, y (all training rows),
    in the networks' input space, y as class ids (the networks' output index)."""
    path = Path(path)
    if path.suffix.lower() != ".npz":
        raise LucidError(f"--data must be an .npz file with X_train and y_train (or X and y), got {path}")
    checked_file(path, "data file", max_bytes)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise LucidError(f"data file {path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 (zipfile/numpy raise many types for damaged or pickled files)
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
        raise LucidError(
            f"{path}: {name} must be a 2-D array of real numbers [rows, features], got {X.dtype} {X.shape}"
        )
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise LucidError(
            f"{path}: {name} has {int(bad.sum())} NaN/inf value(s) (first: row {int(r)}, feature {int(c)})"
        )
    return X.astype(np.float32)


def _class_ids(y: np.ndarray, rows: int, path: Path, name: str) -> np.ndarray:
    if y.ndim != 1 or len(y) != rows:
        raise LucidError(f"{path}: {name} must be a 1-D array with one class id per row, got shape {y.shape}")
    if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all())):
        raise LucidError(f"{path}: {name} must hold class ids (integers 0..C-1, the networks' output index)")
    return y.astype(np.int64)
