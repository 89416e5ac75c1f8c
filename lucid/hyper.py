"""Hyper-networks: one interval-weighted network that over-approximates a set S of networks.

Every weight and bias of the hyper-network N#_S is the interval [min, max] of that parameter
over the networks of S (paper Sec. 4). Any network of S is then one concrete choice of
parameters inside the intervals, so a bound proved for N#_S holds for every network of S.
A singleton set gives degenerate intervals (lo == hi): the concrete network itself, which the
encoder recognises (`exact`) and encodes with equalities instead of interval inequalities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.network import NetworkStack


@dataclass
class HyperNetwork:
    w_lo: list[np.ndarray]  # each [out, in]
    w_hi: list[np.ndarray]
    b_lo: list[np.ndarray]  # each [out]
    b_hi: list[np.ndarray]
    positions: np.ndarray  # stack positions of the networks of S

    @property
    def exact(self) -> bool:
        """True when every interval is a point (S is a singleton, or all networks coincide)."""
        return all(np.array_equal(lo, hi) for lo, hi in zip(self.w_lo + self.b_lo, self.w_hi + self.b_hi, strict=True))

    @property
    def num_layers(self) -> int:
        return len(self.w_lo)

    def join(self, other: HyperNetwork) -> HyperNetwork:
        """The hyper-network of both sets of networks: the union of their intervals."""
        return HyperNetwork(
            [np.minimum(a, b) for a, b in zip(self.w_lo, other.w_lo, strict=True)],
            [np.maximum(a, b) for a, b in zip(self.w_hi, other.w_hi, strict=True)],
            [np.minimum(a, b) for a, b in zip(self.b_lo, other.b_lo, strict=True)],
            [np.maximum(a, b) for a, b in zip(self.b_hi, other.b_hi, strict=True)],
            np.concatenate([self.positions, other.positions]),
        )


def hyper_network(stack: NetworkStack, positions: np.ndarray | list[int]) -> HyperNetwork:
    """The element-wise [min, max] of the parameters of the networks at `positions`."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        raise ValueError("a hyper-network needs at least one network")
    w_lo, w_hi, b_lo, b_hi = [], [], [], []
    for w, b in zip(stack.weights, stack.biases, strict=True):
        ws, bs = w[positions], b[positions]
        w_lo.append(ws.min(axis=0))
        w_hi.append(ws.max(axis=0))
        b_lo.append(bs.min(axis=0))
        b_hi.append(bs.max(axis=0))
    return HyperNetwork(w_lo, w_hi, b_lo, b_hi, positions)


def stack_hull(stack: NetworkStack) -> HyperNetwork:
    """The hyper-network of every network of the stack, read in place: a reduction along the stack
    axis (memory-mapped networks are streamed, never copied as `hyper_network`'s indexing would)."""
    return HyperNetwork(
        [np.min(w, axis=0) for w in stack.weights],
        [np.max(w, axis=0) for w in stack.weights],
        [np.min(b, axis=0) for b in stack.biases],
        [np.max(b, axis=0) for b in stack.biases],
        np.arange(len(stack), dtype=np.int64),
    )
