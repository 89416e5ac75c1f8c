"""ReLU encodings: exact big-M (paper 3d/3f/3g) and the triangle (LP) relaxation.

Stable neurons need no binary: u <= 0 fixes z = 0, l >= 0 makes z the pre-activation itself
(the same column is reused). Big-M constants are the neuron's sound pre-activation bounds.
"""

from __future__ import annotations

import numpy as np

from lucid.milp.builder import ModelBuilder


def stability(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stably active, stably inactive, unstable) masks of neurons with pre-activation bounds [lower, upper]."""
    active = lower >= 0
    inactive = upper <= 0
    return active, inactive, ~active & ~inactive


def encode_relu(
    b: ModelBuilder,
    zhat: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    name: str,
    relax: np.ndarray | None = None,
) -> tuple[np.ndarray, dict]:
    """Add z = ReLU(zhat) for columns `zhat` with bounds [lower, upper]; return z's columns and
    statistics (with "indicator": each neuron's binary column, 1 = active, or -1 if it has none).

    Neurons where `relax` is True (and every neuron if relax is all True) get the triangle
    relaxation  z >= 0, z >= zhat, z <= u (zhat - l) / (u - l)  instead of a binary.
    """
    n = len(zhat)
    relax = np.zeros(n, dtype=bool) if relax is None else np.asarray(relax, dtype=bool)
    z = np.array(zhat, dtype=np.int64, copy=True)
    active, inactive, unstable = stability(lower, upper)
    indicator = np.full(n, -1, dtype=np.int64)  # the binary column of each neuron, -1 if none
    n_inactive = int(inactive.sum())
    if n_inactive:
        z[inactive] = b.add_vars(n_inactive, 0.0, 0.0, f"{name}.off")
    exact = unstable & ~relax
    tri = unstable & relax
    for mask, kind in ((exact, "exact"), (tri, "tri")):
        k = int(mask.sum())
        if not k:
            continue
        l, u, zh = lower[mask], upper[mask], zhat[mask]
        zc = b.add_vars(k, 0.0, u, f"{name}.z")
        z[mask] = zc
        b.add_rows(np.stack([zc, zh], 1), [1.0, -1.0], 0.0, np.inf, f"{name}.ge")
        if kind == "exact":
            a = b.add_vars(k, 0.0, 1.0, f"{name}.a", integer=True)
            indicator[mask] = a
            # z <= zhat - l (1 - a)   and   z <= u a
            b.add_rows(np.stack([zc, zh, a], 1), np.stack([np.ones(k), -np.ones(k), -l], 1), -np.inf, -l, f"{name}.lo")
            b.add_rows(np.stack([zc, a], 1), np.stack([np.ones(k), -u], 1), -np.inf, 0.0, f"{name}.up")
        else:
            slope = u / (u - l)
            b.add_rows(np.stack([zc, zh], 1), np.stack([np.ones(k), -slope], 1), -np.inf, -slope * l, f"{name}.tri")
    stats = {
        "binaries": int(exact.sum()),
        "relaxed": int(tri.sum()),
        "stable_active": int(active.sum()),
        "stable_inactive": n_inactive,
        "indicator": indicator,
    }
    return z, stats
