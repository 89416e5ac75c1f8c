"""The access-time walk of a region tree (lucid/regions/tree.py): the leaf of each input, in work that
does not depend on the input or its leaf.

Every node's test is computed for every row at once (a carve's box test included, whichever
nodes the walk visits), then the walk takes the tree's depth in steps for every row: a leaf's
children are itself, so a shallow leaf costs the same as a deep one. Batches are vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RegionLookup:
    """The tree as arrays for the fixed-depth walk (a leaf's children are itself)."""

    feature: np.ndarray  # [M]
    threshold: np.ndarray  # [M] (+inf at a leaf: always 'left', i.e. itself)
    children: np.ndarray  # [M, 2]
    depth: int
    carves: np.ndarray  # [J] the carve nodes
    carve_lower: np.ndarray  # [J, d] their boxes
    carve_upper: np.ndarray
    _children_list: list[list[int]] = field(init=False, repr=False, compare=False)  # `children` as lists

    def __post_init__(self) -> None:
        object.__setattr__(self, "_children_list", self.children.tolist())

    def locate(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        # Every node's test for every row at once, then `depth` steps for every row and every tree
        # path (a leaf's children are itself), so the work does not depend on the input's box.
        right = X[:, self.feature] >= self.threshold  # [B, M]
        if len(self.carves):  # every carve's box test too, whichever nodes the walk visits
            right[:, self.carves] = ((X[:, None, :] >= self.carve_lower) & (X[:, None, :] <= self.carve_upper)).all(
                axis=2
            )
        if len(X) == 1:  # one query: the same walk in plain Python is ~10x faster than numpy's
            bits, children, leaf = right[0].tobytes(), self._children_list, 0  # bytes index to 0 / 1
            for _ in range(self.depth):
                leaf = children[leaf][bits[leaf]]
            return np.array([leaf], dtype=np.int64)
        right = right.astype(np.int64)
        rows = np.arange(len(X))
        node = np.zeros(len(X), dtype=np.int64)
        for _ in range(self.depth):
            node = self.children[node, right[rows, node]]
        return node
