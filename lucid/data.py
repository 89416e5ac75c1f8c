"""Loading training data and mapping it into the networks' input space.

Sources: a CSV file with a header row (label column chosen by name, default the last one), an
`.npz` with arrays `X` and `y`, or `sklearn:NAME` for scikit-learn's bundled data sets.

Scaling (see docs/training.md): every feature lands in [0, 1] and the verified domain is
[0, 1]^d in network space. A feature whose values already lie in [0, 1] (up to a 1e-6 slack,
then clipped: the shared data has a few -1e-16 entries) is kept; any other feature is min-max
scaled over all rows given (train and test). `--domain` replaces this with an explicit box in
original units, which is then mapped onto [0, 1]^d. The scaler is affine:
x_net = (x_orig - offset) * scale.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lucid.atomic import read_json
from lucid.errors import LucidError

SKLEARN_SETS = ("breast_cancer", "wine", "digits", "iris")
IN_UNIT_SLACK = 1e-6  # features within [-slack, 1 + slack] count as already in [0, 1]


@dataclass
class Table:
    """Raw rows as loaded: features in original units, labels as given."""

    X: np.ndarray  # float64 [rows, d]
    y: np.ndarray  # labels as given (ints, floats or strings)
    feature_names: list[str]
    source: str


@dataclass
class Dataset:
    """Train/test splits in network space, with everything run.json records about them."""

    X_train: np.ndarray  # float32 [n, d]
    y_train: np.ndarray  # int64 [n], class ids 0..C-1
    X_test: np.ndarray
    y_test: np.ndarray
    labels: list  # original label values, index = class id
    scaler: dict
    domain: dict
    feature_names: list[str]
    source: str

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def input_dim(self) -> int:
        return int(self.X_train.shape[1])


# --------------------------------------------------------------------------------------- loading


def load_table(spec: str, label: str | None = None) -> Table:
    """Load DATA as given on the command line (CSV path, .npz path or sklearn:NAME)."""
    if spec.startswith("sklearn:"):
        if label is not None:
            raise LucidError("--label applies to CSV data only")
        return _load_sklearn(spec[len("sklearn:") :])
    path = Path(spec)
    if not path.exists():
        raise LucidError(f"data file {spec} does not exist")
    if path.is_dir():
        raise LucidError(f"data file {spec} is a directory")
    if path.suffix.lower() == ".npz":
        if label is not None:
            raise LucidError("--label applies to CSV data only (an .npz holds arrays X and y)")
        return _load_npz(path)
    return _load_csv(path, label)


def _load_sklearn(name: str) -> Table:
    if name not in SKLEARN_SETS:
        raise LucidError(f"unknown scikit-learn data set '{name}' (choose from {', '.join(SKLEARN_SETS)})")
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    names = [str(f) for f in getattr(bunch, "feature_names", [])] or [f"x{i}" for i in range(bunch.data.shape[1])]
    return Table(np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target), names, f"sklearn:{name}")


def _load_npz(path: Path) -> Table:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("X", "y") if k not in npz.files]
            if missing:
                raise LucidError(f"{path} lacks array(s) {', '.join(missing)} (an .npz needs X and y)")
            X, y = npz["X"], npz["y"]
    except LucidError:
        raise
    except Exception as exc:  # noqa: BLE001 (zipfile/numpy raise many types for corrupt or pickled files)
        raise LucidError(f"cannot read {path} as .npz: {exc}") from None
    if X.ndim != 2:
        raise LucidError(f"{path}: X must be a 2-D array [rows, features], got shape {X.shape}")
    if y.ndim != 1 or len(y) != len(X):
        raise LucidError(f"{path}: y must be a 1-D array with one label per row of X, got shape {y.shape}")
    if not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise LucidError(f"{path}: X must be real numbers, got dtype {X.dtype}")
    return Table(X.astype(np.float64), y, [f"x{i}" for i in range(X.shape[1])], str(path))


def _load_csv(path: Path, label: str | None) -> Table:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LucidError(f"cannot read CSV {path}: {exc}") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise LucidError(f"CSV {path} is empty (expected a header row and data rows)")
    header = [h.strip() for h in rows[0]]
    if len(header) < 2:
        raise LucidError(f"CSV {path} needs at least two columns (features and a label), got {len(header)}")
    if label is None:
        label_col = len(header) - 1
    elif label in header:
        label_col = header.index(label)
    else:
        raise LucidError(f"label column '{label}' is not in {path} (columns: {', '.join(header)})")
    feature_cols = [i for i in range(len(header)) if i != label_col]
    X = np.empty((len(rows) - 1, len(feature_cols)), dtype=np.float64)
    labels: list[str] = []
    for r, row in enumerate(rows[1:]):
        line = r + 2
        if len(row) != len(header):
            raise LucidError(f"cannot read CSV {path}: line {line} has {len(row)} fields, the header has {len(header)}")
        for j, c in enumerate(feature_cols):
            try:
                X[r, j] = float(row[c])
            except ValueError:
                raise LucidError(
                    f"cannot read CSV {path}: line {line}, column '{header[c]}': '{row[c]}' is not a number"
                ) from None
        labels.append(row[label_col].strip())
    return Table(X, _typed_labels(labels), [header[c] for c in feature_cols], str(path))


def _typed_labels(values: list[str]) -> np.ndarray:
    """CSV labels as ints if they all are, else floats, else strings (so '1' and '1.0' sort sensibly)."""
    for kind in (int, float):
        try:
            return np.array([kind(v) for v in values])
        except ValueError:
            pass
    return np.array(values, dtype=str)


def _json_label(value) -> int | float | str:
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return int(value) if float(value).is_integer() else float(value)
    return str(value)


# ------------------------------------------------------------------------------------- checking


def _check_finite(table: Table, what: str) -> None:
    bad = ~np.isfinite(table.X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise LucidError(
            f"{what} {table.source} has {int(bad.sum())} NaN/inf feature value(s) "
            f"(first: row {int(r)}, feature '{table.feature_names[c]}')"
        )
    if table.y.dtype.kind == "f" and not np.isfinite(table.y).all():
        raise LucidError(f"{what} {table.source} has NaN/inf labels")


def load_domain(path: str | Path, d: int) -> tuple[np.ndarray, np.ndarray]:
    """A --domain file: JSON {"lower": [d numbers], "upper": [d numbers]} in original units."""
    path = Path(path)
    obj = read_json(
        path, missing=f"domain file {path} does not exist", unreadable=f"cannot read domain file {path} as JSON"
    )
    if not isinstance(obj, dict) or "lower" not in obj or "upper" not in obj:
        raise LucidError(f"domain file {path} must be a JSON object with 'lower' and 'upper' lists")
    try:
        lower = np.asarray(obj["lower"], dtype=np.float64)
        upper = np.asarray(obj["upper"], dtype=np.float64)
    except (TypeError, ValueError):
        raise LucidError(f"domain file {path}: 'lower' and 'upper' must be lists of numbers") from None
    if lower.shape != (d,) or upper.shape != (d,):
        raise LucidError(f"domain file {path}: 'lower' and 'upper' need {d} numbers each (one per feature)")
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        raise LucidError(f"domain file {path}: bounds must be finite")
    if (lower > upper).any():
        j = int(np.argmax(lower > upper))
        raise LucidError(f"domain file {path}: lower > upper for feature {j}")
    return lower, upper


# -------------------------------------------------------------------------------------- scaling


def _fit_scaler(X_all: np.ndarray, domain_box: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """(offset, scale) with x_net = (x - offset) * scale, mapping every feature into [0, 1]."""
    if domain_box is not None:
        lo, hi = domain_box
    else:
        lo, hi = X_all.min(axis=0), X_all.max(axis=0)
        in_unit = (lo >= -IN_UNIT_SLACK) & (hi <= 1 + IN_UNIT_SLACK)
        lo = np.where(in_unit, 0.0, lo)
        hi = np.where(in_unit, 1.0, hi)
    width = hi - lo
    # A constant feature (or a degenerate box side) is shifted to 0 and left unscaled.
    scale = np.where(width > 0, 1.0 / np.where(width > 0, width, 1.0), 1.0)
    return lo.astype(np.float64), scale.astype(np.float64)


def _to_network_space(
    X: np.ndarray, offset: np.ndarray, scale: np.ndarray, explicit_box: bool, what: str
) -> np.ndarray:
    Z = (X - offset) * scale
    if explicit_box:
        outside = (Z < -IN_UNIT_SLACK) | (Z > 1 + IN_UNIT_SLACK)
        if outside.any():
            r, c = np.argwhere(outside)[0]
            raise LucidError(
                f"{int(outside.any(axis=1).sum())} {what} row(s) lie outside the --domain box "
                f"(first: row {int(r)}, feature {int(c)})"
            )
    return np.clip(Z, 0.0, 1.0).astype(np.float32)


def _split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split into train/test row indices, stratified when every class can be split."""
    n = len(y)
    idx = np.arange(n)
    if test_fraction == 0:
        return idx, idx[:0]
    from sklearn.model_selection import train_test_split

    n_test = math.ceil(test_fraction * n)
    if n_test >= n:
        raise LucidError(f"--test-fraction {test_fraction} leaves no training rows out of {n}")
    _, counts = np.unique(y, return_counts=True)
    stratify = y if counts.min() >= 2 and n_test >= len(counts) and n - n_test >= len(counts) else None
    train, test = train_test_split(idx, test_size=n_test, random_state=seed, shuffle=True, stratify=stratify)
    return np.sort(train), np.sort(test)


def prepare_dataset(
    data: str,
    *,
    label: str | None = None,
    test_data: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    domain: str | Path | None = None,
) -> Dataset:
    """Load, validate, split and scale: everything `lucid train` needs before training."""
    if not (0 <= test_fraction < 1) or not math.isfinite(test_fraction):
        raise LucidError(f"--test-fraction must be in [0, 1), got {test_fraction}")
    table = load_table(data, label)
    _check_finite(table, "data")
    if len(table.X) < 2:
        raise LucidError(f"data {table.source} has {len(table.X)} row(s); training needs at least 2")
    if table.X.shape[1] < 1:
        raise LucidError(f"data {table.source} has no feature columns")
    if test_data is not None:
        test_table = load_table(test_data, label)
        _check_finite(test_table, "test data")
        if test_table.X.shape[1] != table.X.shape[1]:
            raise LucidError(
                f"test data {test_table.source} has {test_table.X.shape[1]} features, "
                f"the training data has {table.X.shape[1]}"
            )
        X_tr, y_tr, X_te, y_te = table.X, table.y, test_table.X, test_table.y
    else:
        train_idx, test_idx = _split(table.y, test_fraction, seed)
        X_tr, y_tr, X_te, y_te = table.X[train_idx], table.y[train_idx], table.X[test_idx], table.y[test_idx]

    labels_sorted = np.unique(y_tr)
    if len(labels_sorted) < 2:
        raise LucidError(
            f"the training rows of {table.source} have a single class ({_json_label(labels_sorted[0])}); "
            "a classifier needs at least 2"
        )
    if len(X_tr) < 2:
        raise LucidError(f"only {len(X_tr)} training row(s) after the split; training needs at least 2")
    try:
        y_te_ids = np.searchsorted(labels_sorted, y_te)
        unknown = (y_te_ids >= len(labels_sorted)) | (
            labels_sorted[np.minimum(y_te_ids, len(labels_sorted) - 1)] != y_te
        )
    except TypeError:
        raise LucidError("test labels are not comparable with the training labels") from None
    if len(y_te) and unknown.any():
        raise LucidError(
            f"test data has label(s) the training rows lack: {sorted({_json_label(v) for v in y_te[unknown]})}"
        )

    box = load_domain(domain, table.X.shape[1]) if domain is not None else None
    X_all = np.concatenate([X_tr, X_te]) if len(X_te) else X_tr
    offset, scale = _fit_scaler(X_all, box)
    d = X_tr.shape[1]
    return Dataset(
        X_train=_to_network_space(X_tr, offset, scale, box is not None, "training"),
        y_train=np.searchsorted(labels_sorted, y_tr).astype(np.int64),
        X_test=_to_network_space(X_te, offset, scale, box is not None, "test").reshape(len(X_te), d),
        y_test=y_te_ids.astype(np.int64) if len(y_te) else np.zeros(0, dtype=np.int64),
        labels=[_json_label(v) for v in labels_sorted],
        scaler={"type": "affine", "offset": offset.tolist(), "scale": scale.tolist()},
        domain={"lower": [0.0] * d, "upper": [1.0] * d},
        feature_names=table.feature_names,
        source=table.source,
    )
