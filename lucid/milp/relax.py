"""Relax-if-similar: the one place that decides which hyper neurons lose their binary."""

from __future__ import annotations

import numpy as np


def relax_if_similar(
    diff_lower: np.ndarray, diff_upper: np.ndarray, enabled: bool, tau: float, exact: bool
) -> np.ndarray:
    """Neurons whose hyper/N pre-activation difference interval is at most `tau` wide.

    Such a neuron of N# behaves almost like N's neuron, so its binary buys little precision:
    the triangle relaxation plus the matching dependencies stays sound and removes a binary.
    A singleton (exact) hyper-network is never relaxed, so its encoding stays exact.
    """
    if not enabled or exact:
        return np.zeros(np.shape(diff_lower), dtype=bool)
    return (diff_upper - diff_lower) <= tau
