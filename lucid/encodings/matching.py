"""Matching dependencies: z + dl <= z# <= z + du, linking each hyper neuron to N's neuron."""

from __future__ import annotations

import numpy as np

from lucid.encodings.builder import ModelBuilder


def add_matching(b: ModelBuilder, z: np.ndarray, z_hyper: np.ndarray, lower: np.ndarray, upper: np.ndarray, name: str) -> int:
    """Rows lower <= z#_j - z_j <= upper for every neuron with a finite, non-trivial interval."""
    same = z == z_hyper  # both fixed to the same column (cannot happen today, but harmless)
    useful = ~same & (np.isfinite(lower) | np.isfinite(upper))
    if not useful.any():
        return 0
    b.add_rows(np.stack([z_hyper[useful], z[useful]], 1), [1.0, -1.0], lower[useful], upper[useful], name)
    return int(useful.sum())
