"""A tiny hand-written run directory (lucid-run/1) for the verify/log tests: no training needed.

N is a random 2-4-4-C MLP; the leave-one-out networks are N plus small seeded perturbations, in a
few groups of similar size, like real leave-one-out networks (and so k-means has clusters to find).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_tiny_run(path: Path, *, networks: int = 8, classes: int = 2, hidden=(4, 4), seed: int = 0,
                   input_dim: int = 2, spread=(0.05, 0.15, 0.4)) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    sizes = [input_dim, *hidden, classes]
    base = [(rng.normal(size=(o, i)) / np.sqrt(i), rng.normal(size=o) * 0.3) for i, o in zip(sizes, sizes[1:])]
    k = networks + 1
    scales = np.concatenate([[0.0], rng.choice(list(spread), size=networks)])
    tensors = {}
    for li, (w, b) in enumerate(base):
        tensors[f"layers.{li}.weight"] = (w[None] + scales[:, None, None] * rng.normal(size=(k, *w.shape))).astype(np.float32)
        tensors[f"layers.{li}.bias"] = (b[None] + scales[:, None] * rng.normal(size=(k, *b.shape))).astype(np.float32)
    tensors["removed"] = np.concatenate([[-1], np.arange(networks)]).astype(np.int64)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "networks.safetensors"))
    X = rng.uniform(size=(networks, input_dim)).astype(np.float32)
    y = rng.integers(0, classes, size=networks).astype(np.int64)
    np.savez(path / "data.npz", X_train=X, y_train=y, X_test=X[:0], y_test=y[:0])
    meta = {
        "format": "lucid-run/1", "num_classes": classes, "input_dim": input_dim, "train_size": networks,
        "test_size": 0, "domain": {"lower": [0.0] * input_dim, "upper": [1.0] * input_dim},
        "architecture": {"type": "mlp", "hidden": list(hidden)},
        "training": {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "epochs": 0, "batch_size": 1,
                     "seed": seed, "test_fraction": 0.0},
        "labels": list(range(classes)),
        "scaler": {"type": "affine", "offset": [0.0] * input_dim, "scale": [1.0] * input_dim},
        "data": {"source": "tests/helpers/bab_fixtures.py", "feature_names": [f"x{i}" for i in range(input_dim)]},
    }
    (path / "run.json").write_text(json.dumps(meta))
    return path
