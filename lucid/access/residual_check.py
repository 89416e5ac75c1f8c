"""The query-time half of `lucid verify --residual M`: do the residual networks agree with N?

For a row that N labels c, every network of R_c (`lucid.residual`) must label it c as well, in
exact arithmetic: its float64 margin s_c - max_{t != c} s_t must exceed that network's float error
over the domain (`lucid.analysis.soundness.confidence_error`, the same rule that covers N's own
confidence), rounded up. The networks outside R_c are covered by the level L_c, which the
classifier checks as it checks beta_c.

Equal work: every row evaluates exactly M networks, those of its class's set, padded to M with
slots that always pass; the classes' sets are stacked to the same shapes, so a row of any class,
released or not, costs the same matrix products, and the result is combined without a branch.
Whether a row is released by the level, released by the check or noised therefore costs the same
time. A single row uses its class's stack as a view (no copy): the common case of one query per
request costs M networks, not the union of every class's set.
"""

from __future__ import annotations

import numpy as np

from lucid.analysis.soundness import confidence_error
from lucid.residual import ResidualSets


class ResidualCheck:
    """Per class, its set's networks stacked to M slots: [C, M, in, out] weights, error margins."""

    def __init__(self, sets: ResidualSets, lower: np.ndarray, upper: np.ndarray) -> None:
        stack = sets.stack
        self.size = sets.size
        self.count = len(sets.positions)  # networks in the union
        num_classes, slots = sets.members.shape[0], max(1, sets.size)
        errors = np.array([confidence_error([w[k] for w in stack.weights], [b[k] for b in stack.biases], lower, upper)
                           for k in range(self.count)], dtype=np.float64)
        # slot j of class c holds union network index[c, j]; a padding slot repeats network 0 (or a
        # zero network when the union is empty) and passes whatever its margin (threshold -inf)
        index = np.zeros((num_classes, slots), dtype=np.int64)
        margins = np.full((num_classes, slots), -np.inf)
        for c in range(num_classes):
            members = np.flatnonzero(sets.members[c])
            index[c, : len(members)] = members
            margins[c, : len(members)] = np.nextafter(errors[members], np.inf)
        self._margins = margins[:, :, None]  # [C, M, 1]: a margin above it is exact
        self._others = [np.array([t for t in range(num_classes) if t != c]) for c in range(num_classes)]
        if not self.count:  # every set empty (all networks proved harmless): nothing to check
            self._first = None
            return
        weights = [np.ascontiguousarray(w.transpose(0, 2, 1)[index]) for w in stack.weights]  # [C, M, in, out]
        biases = [np.ascontiguousarray(b[index][:, :, None, :]) for b in stack.biases]  # [C, M, 1, out]
        # the first layer of all M slots as one [in, M * out] matrix: one product for the row
        first = weights[0]
        self._first = np.ascontiguousarray(first.transpose(0, 2, 1, 3).reshape(num_classes, first.shape[2], -1))
        self._first_bias = biases[0].reshape(num_classes, -1)
        self._weights, self._biases = weights[1:], biases[1:]
        self._slots, self._hidden = slots, first.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes of parameters held: M slots per class."""
        if self._first is None:
            return 0
        return sum(a.nbytes for a in (self._first, self._first_bias, *self._weights, *self._biases))

    def _class_scores(self, c: int, xn: np.ndarray) -> np.ndarray:
        """Scores [M, B, C] of class c's M slots on the rows `xn` [B, d]."""
        h = xn @ self._first[c]
        h += self._first_bias[c]
        h = h.reshape(len(xn), self._slots, self._hidden).transpose(1, 0, 2)
        if self._weights:
            np.maximum(h, 0.0, out=h)
        last = len(self._weights) - 1
        for i, (w, b) in enumerate(zip(self._weights, self._biases)):
            h = np.matmul(h, w[c])
            h += b[c]
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def _class_agree(self, c: int, xn: np.ndarray) -> np.ndarray:
        """[B] bool: every slot of class c gives c a margin above its error bound at each row."""
        s = self._class_scores(c, xn)
        runner_up = s[:, :, self._others[c]].max(axis=2)  # max_{t != c} s_t, the float scores as computed
        return ((s[:, :, c] - runner_up) > self._margins[c]).all(axis=0)

    def agree(self, xn: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """[B] bool: every network of R_{classes[b]} labels row b with classes[b], exactly."""
        if self._first is None:
            return np.ones(len(xn), dtype=bool)
        if len(xn) == 1:
            return self._class_agree(int(classes[0]), xn)
        out = np.empty(len(xn), dtype=bool)
        for c in range(self._first.shape[0]):  # every class, an empty group too: the same steps per batch
            rows = classes == c
            out[rows] = self._class_agree(c, xn[rows])
        return out
