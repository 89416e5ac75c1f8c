"""The query-time half of `lucid verify --residual M`: do the residual networks agree with N?

For a row that N labels c, every network of R_c (`lucid.residual`) must label it c as well, in
exact arithmetic: its float64 margin s_c - max_{t != c} s_t must exceed that network's float error
over the domain (`lucid.analysis.soundness.confidence_error`, the same rule that covers N's own
confidence), rounded up. The networks outside R_c are covered by the level L_c, which the
classifier checks as it checks beta_c.

Equal work: every row evaluates every network of the union of the classes' sets, whatever its
class and whatever the answer, and the result is combined without a branch: the row's class only
selects which networks' verdicts count (a mask). Whether a row is released by the level, released
by the check or noised therefore costs the same time, and so do rows of different classes: N's
class is hidden in a noised answer, so it must not show in time either. (Evaluating only the
row's own class's networks is faster, but each class's networks then sit in the cache or not, and
the time of a single query tells the classes apart.)
"""

from __future__ import annotations

import numpy as np

from lucid.analysis.soundness import confidence_error
from lucid.regions import RegionTree
from lucid.residual import ResidualSets


class ResidualCheck:
    """The union's networks as stacked float64 matrices, their error margins and the class masks
    (with regions, per box: a row's leaf selects the mask as its class does)."""

    def __init__(
        self, sets: ResidualSets, lower: np.ndarray, upper: np.ndarray, regions: RegionTree | None = None
    ) -> None:
        stack = sets.stack
        self.size = sets.size
        self.count = len(sets.positions)  # K, the networks of the union
        self.members = np.ascontiguousarray(sets.members)  # [C, K]
        self.box_members = (
            None
            if regions is None
            else np.stack(  # [nodes, C, K]
                [
                    [
                        np.isin(sets.positions, box[c].positions) if c in box else np.zeros(self.count, dtype=bool)
                        for c in range(len(sets.members))
                    ]
                    for box in regions.residual
                ]
            )
        )
        errors = np.array(
            [
                confidence_error([w[k] for w in stack.weights], [b[k] for b in stack.biases], lower, upper)
                for k in range(self.count)
            ],
            dtype=np.float64,
        )
        self._margins = np.nextafter(errors, np.inf)[:, None]  # [K, 1]: a margin above it is exact
        if not self.count:  # every set empty (all networks proved harmless): nothing to check
            self._first = None
            return
        weights = [np.ascontiguousarray(w.transpose(0, 2, 1)) for w in stack.weights]  # [K, in, out]
        biases = [np.ascontiguousarray(b[:, None, :]) for b in stack.biases]  # [K, 1, out]
        # the first layer of all K networks as one [in, K * out] matrix: one product per row
        self._first = np.ascontiguousarray(weights[0].transpose(1, 0, 2).reshape(weights[0].shape[1], -1))
        self._first_bias = biases[0].reshape(-1)
        self._hidden = weights[0].shape[2]
        self._weights, self._biases = weights[1:], biases[1:]

    @property
    def nbytes(self) -> int:
        """Bytes of parameters held: the union's networks once."""
        if self._first is None:
            return 0
        return sum(a.nbytes for a in (self._first, self._first_bias, *self._weights, *self._biases))

    def scores(self, xn: np.ndarray) -> np.ndarray:
        """Every union network's scores on every row: [K, B, C] (float64)."""
        h = xn @ self._first
        h += self._first_bias
        h = h.reshape(len(xn), self.count, self._hidden).transpose(1, 0, 2)
        if not self._weights:
            return np.array(h)  # one layer: the scores, no longer a view of the product
        np.maximum(h, 0.0, out=h)
        last = len(self._weights) - 1
        for i, (w, b) in enumerate(zip(self._weights, self._biases, strict=True)):
            h = np.matmul(h, w)
            h += b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def agree(self, xn: np.ndarray, classes: np.ndarray, leaves: np.ndarray | None = None) -> np.ndarray:
        """[B] bool: every network of R_{classes[b]} (of the box `leaves[b]` with regions) labels
        row b with classes[b], exactly."""
        if self._first is None:
            return np.ones(len(xn), dtype=bool)
        s = self.scores(xn)
        rows = np.arange(len(xn))
        own = s[:, rows, classes]  # [K, B]
        s[:, rows, classes] = -np.inf
        margin = own - s.max(axis=2)  # s_c - max_{t != c} s_t, the float scores as computed
        # [K, B]: whether row b's class (and box) checks network k
        needed = (self.members[classes] if leaves is None else self.box_members[leaves, classes]).T
        return ((margin > self._margins) | ~needed).all(axis=0)
