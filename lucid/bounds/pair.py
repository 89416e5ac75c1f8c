"""What every bound of N against networks N' starts from: both networks' layers, N's neuron
bounds and the input box. The joint system (`lucid.bounds.joint`), the symbolic bounds
(`lucid.bounds.symbolic`) and the ReLU splitting (`lucid.bounds.relu_split`) all take one
`PairProblem`, so the arrays cannot be passed in a wrong order or one of them forgotten.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, eq=False)
class PairProblem:
    """N against K networks N' over an input box (eq=False: the fields are arrays).

    The networks N' are stacked on a leading axis: weights[k] [K, out, in], biases[k] [K, out].
    Any array that can be sliced along that axis will do (`lucid.bounds.stack_screen` passes views that
    gather one chunk at a time)."""

    n_weights: Sequence[np.ndarray]  # N's layers, [out, in]
    n_biases: Sequence[np.ndarray]  # [out]
    weights: Sequence[np.ndarray]  # the networks N', [K, out, in] per layer
    biases: Sequence[np.ndarray]  # [K, out]
    n_lower: Sequence[np.ndarray]  # N's pre-activation bounds per layer (the LP-tightened ones)
    n_upper: Sequence[np.ndarray]
    lower: np.ndarray  # the input box
    upper: np.ndarray

    @property
    def count(self) -> int:
        """K, the number of networks N'."""
        return self.weights[0].shape[0]

    @classmethod
    def singleton(
        cls,
        stack,
        position: int,
        n_lower: Sequence[np.ndarray],
        n_upper: Sequence[np.ndarray],
        lower: np.ndarray,
        upper: np.ndarray,
    ) -> PairProblem:
        """N (network 0 of `stack`, a NetworkStack) against the one network at `position`, over the box
        [lower, upper] with N's pre-activation bounds n_lower / n_upper there."""
        return cls(
            [w[0] for w in stack.weights],
            [b[0] for b in stack.biases],
            [w[position][None] for w in stack.weights],
            [b[position][None] for b in stack.biases],
            n_lower,
            n_upper,
            lower,
            upper,
        )

    def networks(self, idx: slice | np.ndarray) -> PairProblem:
        """The same problem for the networks N' at `idx` (a slice or an index array) only."""
        return replace(self, weights=[w[idx] for w in self.weights], biases=[b[idx] for b in self.biases])
