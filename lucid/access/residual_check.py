"""The query-time half of `lucid verify --residual M`: do the residual networks agree with N?

For a row that N labels c, every network of R_c (`lucid.residual`) must label it c as well, in
exact arithmetic: its float64 margin s_c - max_{t != c} s_t must exceed that network's float error
over the domain (`lucid.analysis.soundness.confidence_error`, the same rule that covers N's own
confidence), rounded up. The networks outside R_c are covered by the level L_c, which the
classifier checks as it checks beta_c.

Equal work: every row evaluates every network of the union of the residual sets, whatever its
class and whatever the answer, and the result is combined without a branch. Whether a row is
released by the level, released by the check or noised therefore costs the same time.
"""

from __future__ import annotations

import numpy as np

from lucid.analysis.soundness import confidence_error
from lucid.residual import ResidualSets


class ResidualCheck:
    """The union's networks as stacked float64 matrices, their error bounds and the class sets."""

    def __init__(self, sets: ResidualSets, lower: np.ndarray, upper: np.ndarray) -> None:
        stack = sets.stack
        self.size = sets.size
        self.count = len(sets.positions)
        self.members = np.ascontiguousarray(sets.members)  # [C, K]
        self._weights = [np.ascontiguousarray(w.transpose(0, 2, 1)) for w in stack.weights]  # [K, in, out]
        self._biases = [np.ascontiguousarray(b[:, None, :]) for b in stack.biases]  # [K, 1, out]
        errors = np.array([confidence_error([w[k] for w in stack.weights], [b[k] for b in stack.biases], lower, upper)
                           for k in range(self.count)], dtype=np.float64)
        self.margins = np.nextafter(errors, np.inf)[:, None]  # [K, 1]: a margin above it is exact

    def scores(self, xn: np.ndarray) -> np.ndarray:
        """Every union network's scores on every row: [K, B, C] (float64)."""
        h = np.broadcast_to(xn, (self.count, *xn.shape))
        last = len(self._weights) - 1
        for i, (w, b) in enumerate(zip(self._weights, self._biases)):
            h = np.matmul(h, w)
            h += b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def agree(self, xn: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """[B] bool: every network of R_{classes[b]} labels row b with classes[b], exactly."""
        if self.count == 0:
            return np.ones(len(xn), dtype=bool)
        s = self.scores(xn)
        rows = np.arange(len(xn))
        own = s[:, rows, classes]  # [K, B]
        s[:, rows, classes] = -np.inf
        margin = own - s.max(axis=2)
        needed = self.members[classes].T  # [K, B]: whether the row's class checks network k
        return ((margin > self.margins) | ~needed).all(axis=0)
