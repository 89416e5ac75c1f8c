"""Shared pieces of the baselines: the training configuration, the result record, a plain
(non-private) SGD trainer that ALIBI and subsample-and-aggregate reuse, and data checks."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lucid.errors import LucidError
from lucid.rundir import open_run


@dataclass
class TrainConfig:
    """The training algorithm of the LUCID run the baseline is compared with (paper settings)."""

    arch: str | dict = "2x50"
    epochs: int = 50
    lr: float = 0.1
    weight_decay: float = 1e-5
    batch_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.epochs) < 1:
            raise LucidError(f"epochs must be positive, got {self.epochs}")
        if int(self.batch_size) < 1:
            raise LucidError(f"batch size must be positive, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise LucidError(f"learning rate must be a positive number, got {self.lr}")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise LucidError(f"weight decay must be a non-negative number, got {self.weight_decay}")


@dataclass
class BaselineResult:
    method: str  # "dpsgd", "alibi", "subsample_aggregate[T=16]", "plain"
    epsilon: float | None  # None: no privacy
    accuracy: float | None  # test accuracy in [0, 1]; None when the run did not happen
    train_seconds: float
    status: str = "ok"  # "ok" or "unreachable" (the privacy target cannot be met)
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Dataset:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_dim(self) -> int:
        return int(self.X_train.shape[1])


def check_data(
    X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray, y_test: np.ndarray, num_classes: int | None = None
) -> Dataset:
    """Validate the splits (finite float features, labels 0..C-1) and return them as float32/int64."""
    arrays = []
    for name, X, y in (("training", X_train, y_train), ("test", X_test, y_test)):
        X = np.asarray(X)
        y = np.asarray(y)
        if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
            raise LucidError(f"{name} data must be X [rows, features] and y [rows], got {X.shape} and {y.shape}")
        if len(X) < 1:
            raise LucidError(f"the {name} split is empty")
        if not np.issubdtype(X.dtype, np.number) or not np.isfinite(X).all():
            raise LucidError(f"{name} features must be finite numbers")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise LucidError(f"{name} labels must be class ids 0..C-1")
        arrays.append((X.astype(np.float32), y.astype(np.int64)))
    (xa, ya), (xb, yb) = arrays
    if xa.shape[1] != xb.shape[1]:
        raise LucidError(f"training rows have {xa.shape[1]} features but test rows have {xb.shape[1]}")
    c = int(num_classes) if num_classes is not None else int(max(ya.max(), yb.max()) + 1)
    if c < 2:
        raise LucidError("a classifier needs at least 2 classes")
    if ya.max() >= c or yb.max() >= c:
        raise LucidError(f"labels must be below the number of classes ({c})")
    return Dataset(xa, ya, xb, yb, c)


def load_run_data(run_dir: str | Path) -> tuple[Dataset, TrainConfig]:
    """The splits and the training configuration of a LUCID run directory (baselines on any run)."""
    run = open_run(run_dir)
    data = run.data()
    for key in ("X_train", "y_train", "X_test", "y_test"):
        if key not in data:
            raise LucidError(f"{run.path / 'data.npz'} lacks the '{key}' array")
    if len(data["X_test"]) == 0:
        raise LucidError(f"run {run.path} has no test split to measure accuracy on")
    t = run.meta.get("training", {})
    config = TrainConfig(
        arch=run.meta["architecture"],
        epochs=int(t.get("epochs", 50)),
        lr=float(t.get("lr", 0.1)),
        weight_decay=float(t.get("weight_decay", 1e-5)),
        batch_size=int(t.get("batch_size", 1024)),
        seed=int(t.get("seed", 0)),
    )
    return check_data(data["X_train"], data["y_train"], data["X_test"], data["y_test"], run.num_classes), config


def predict(model: torch.nn.Module, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))).argmax(dim=1).numpy()


def accuracy(model: torch.nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    return float((predict(model, X) == y).mean())


def train_sgd(
    X: np.ndarray,
    targets: np.ndarray,
    num_classes: int,
    config: TrainConfig,
    seed: int | None = None,
) -> torch.nn.Module:
    """Plain minibatch SGD on mean cross-entropy; `targets` are class ids [n] or soft labels [n, C]."""
    from lucid.baselines.models import build_model

    seed = config.seed if seed is None else seed
    torch.manual_seed(seed)
    model = build_model(config.arch, X.shape[1], num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    x_all = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
    t_all = torch.from_numpy(np.ascontiguousarray(targets))
    if t_all.dtype.is_floating_point:
        t_all = t_all.float()
    gen = torch.Generator().manual_seed(seed)
    n = len(x_all)
    for _ in range(int(config.epochs)):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, int(config.batch_size)):
            idx = order[start : start + int(config.batch_size)]
            optimizer.zero_grad()
            F.cross_entropy(model(x_all[idx]), t_all[idx]).backward()
            optimizer.step()
    return model


def train_plain(data: Dataset, config: TrainConfig) -> BaselineResult:
    """The non-private reference: same architecture and SGD settings, no privacy."""
    start = time.perf_counter()
    model = train_sgd(data.X_train, data.y_train, data.num_classes, config)
    seconds = time.perf_counter() - start
    return BaselineResult("plain", None, accuracy(model, data.X_test, data.y_test), seconds)


@dataclass(frozen=True)
class DpSgdSettings:
    """The (eps, delta)-DP training settings besides eps that DP-SGD and DP-CERT share (`--delta`,
    `--max-grad-norm`): delta (None: 1/n) and the clipping norm C of a row's gradient.

    Checked when a run uses them (`delta_for`), after its epsilon, so that the first bad value of a
    call is the one named, as before these travelled together."""

    delta: float | None = None
    max_grad_norm: float = 1.0

    def delta_for(self, n: int) -> float:
        """delta for n training rows; a delta outside (0, 1) or a clipping norm <= 0 is one error line."""
        delta = 1.0 / n if self.delta is None else float(self.delta)
        if not 0 < delta < 1:
            raise LucidError(f"delta must lie in (0, 1), got {delta}")
        if not self.max_grad_norm > 0:
            raise LucidError(f"the clipping norm must be positive, got {self.max_grad_norm}")
        return delta
