"""Small synthetic run directories (random MLPs, hand-set bounds) for the tests.

They follow the `lucid-run/1` contract exactly, so the access layer can be exercised without
training or verification. The bounds written here are arbitrary numbers, not verified ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lucid import rundir
from lucid.atomic import write_json_atomic


def write_synthetic_run(
    path: str | Path,
    num_classes: int = 3,
    input_dim: int = 2,
    hidden: Sequence[int] = (8,),
    train_size: int = 5,
    test_size: int = 60,
    labels: Sequence[Any] | None = None,
    offset: Sequence[float] | None = None,
    scale: Sequence[float] | None = None,
    bounds: dict[int, float | None] | None = None,
    perturbation: float = 0.05,
    seed: int = 0,
) -> Path:
    """Write RUN/{run.json, networks.safetensors, data.npz[, bounds.json]}; return the path.

    N is a random MLP; network j (the one "without row j-1") is N plus Gaussian noise of the
    given scale, so the leave-one-out networks mostly but not always agree with N.
    `bounds=None` writes no bounds.json.
    """
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    k = train_size + 1
    sizes = [input_dim, *hidden, num_classes]
    tensors: dict[str, np.ndarray] = {}
    base = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.normal(0, 1.5 / np.sqrt(fan_in), (fan_out, fan_in))
        b = rng.normal(0, 0.3, fan_out)
        base.append((w, b))
        ws = w[None] + perturbation * rng.normal(size=(k, fan_out, fan_in))
        bs = b[None] + perturbation * rng.normal(size=(k, fan_out))
        ws[0], bs[0] = w, b
        tensors[f"layers.{i}.weight"] = ws.astype(np.float32)
        tensors[f"layers.{i}.bias"] = bs.astype(np.float32)
    tensors["removed"] = np.arange(-1, train_size, dtype=np.int64)
    save_file(tensors, str(path / "networks.safetensors"))

    def n_labels(x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float64)
        for i in range(len(base)):
            w = tensors[f"layers.{i}.weight"][0].astype(np.float64)
            h = h @ w.T + tensors[f"layers.{i}.bias"][0].astype(np.float64)
            if i < len(base) - 1:
                h = np.maximum(h, 0)
        return h.argmax(1)

    x_train = rng.random((train_size, input_dim)).astype(np.float32)
    x_test = rng.random((test_size, input_dim)).astype(np.float32)
    y_test = n_labels(x_test)
    flip = rng.random(test_size) < 0.1  # N is not perfect on its test split
    y_test[flip] = (y_test[flip] + 1) % num_classes
    np.savez(
        path / "data.npz",
        X_train=x_train,
        y_train=n_labels(x_train).astype(np.int64),
        X_test=x_test,
        y_test=y_test.astype(np.int64),
    )
    meta = {
        "format": "lucid-run/1",
        "num_classes": num_classes,
        "input_dim": input_dim,
        "train_size": train_size,
        "test_size": test_size,
        "domain": {"lower": [0.0] * input_dim, "upper": [1.0] * input_dim},
        "architecture": {"type": "mlp", "hidden": list(hidden)},
        "training": {"optimizer": "synthetic", "seed": seed},
        "labels": list(labels) if labels is not None else list(range(num_classes)),
        "scaler": {
            "type": "affine",
            "offset": list(offset) if offset is not None else [0.0] * input_dim,
            "scale": list(scale) if scale is not None else [1.0] * input_dim,
        },
        "data": {"source": "synthetic", "feature_names": [f"x{i}" for i in range(input_dim)]},
    }
    write_json_atomic(path / "run.json", meta)
    if bounds is not None:
        write_bounds(path, bounds)
    return path


def write_bounds(path: str | Path, bounds: dict[int, float | None], complete: bool = True) -> None:
    """RUN/bounds.json with the given per-class `upper` values (None = nothing proved)."""
    entries = {str(c): {"upper": u, "lower": None, "complete": complete, "seconds": 0.0, "nodes": 0}
               for c, u in bounds.items()}
    rundir.write_bounds(path, entries, solver="hand-written", options={})
