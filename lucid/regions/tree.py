"""`RegionTree`: the partition of the domain into boxes with their bounds, and its JSON section
(lucid-regions/1; read and checked by lucid/regions/reader.py); why any partition keeps the
guarantee: lucid/regions/__init__.py.

With `--residual M` each box also keeps, per class, its own residual set and level
(`lucid.residual.ClassResidual`): the level bounds every network outside the box's set over the
box. Unlike a box's bound it is never capped by its parent's *level* (that one holds only outside
the parent's set), only by the parent's bound, which holds for every network."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid.regions.lookup import RegionLookup
from lucid.residual import ClassResidual
from lucid.rundir import bound_entry_value

REGIONS_FORMAT = "lucid-regions/1"
MAX_DEPTH = 320  # every lookup walks the tree's depth, one Python step per level for a single query
# (each carve of the rest of a leaf is one level deeper)
CARVE = -2  # `feature` of a carve node (-1: a leaf)


@dataclass
class RegionTree:
    """The boxes and their bounds. Arrays are indexed by node id (0 is the root, the domain)."""

    lower: np.ndarray  # [d] the domain
    upper: np.ndarray
    num_classes: int
    feature: list[int] = field(default_factory=lambda: [-1])  # -1: a leaf, CARVE: a carve
    threshold: list[float] = field(default_factory=lambda: [math.inf])
    children: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])  # a leaf: itself twice
    parent: list[int] = field(default_factory=lambda: [-1])
    bound_upper: list[np.ndarray] = field(default_factory=list)  # [C] per node: +inf where nothing is proved
    bound_lower: list[np.ndarray] = field(default_factory=list)  # [C] per node: best leaking confidence, -inf none
    complete: list[np.ndarray] = field(default_factory=list)  # [C] per node: its verification finished
    verified: list[bool] = field(default_factory=lambda: [False])
    seconds: list[float] = field(default_factory=lambda: [0.0])
    carved: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # carve node -> its box
    residual: list[dict[int, ClassResidual]] = field(default_factory=lambda: [{}])  # per node: class -> its set

    def __post_init__(self) -> None:
        self.lower = np.asarray(self.lower, dtype=np.float64)
        self.upper = np.asarray(self.upper, dtype=np.float64)
        if not self.bound_upper:
            self.bound_upper = [np.full(self.num_classes, np.inf)]
            self.bound_lower = [np.full(self.num_classes, -np.inf)]
            self.complete = [np.zeros(self.num_classes, dtype=bool)]

    # --- structure --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.feature)

    def is_leaf(self, node: int) -> bool:
        return self.feature[node] == -1

    def inherits_box(self, node: int) -> bool:
        """`node` is the rest of a carved node: it is verified over its parent's box, so verifying it
        again cannot lower the parent's bound."""
        parent = self.parent[node]
        return parent >= 0 and self.feature[parent] == CARVE and node == self.children[parent][0]

    def is_carved_box(self, node: int) -> bool:
        """`node` is the box a carve split off (its parent's right child)."""
        parent = self.parent[node]
        return parent in self.carved and node == self.children[parent][1]

    def leaves(self) -> list[int]:
        return [i for i in range(len(self)) if self.is_leaf(i)]

    def ancestors(self, node: int) -> list[int]:
        """`node`'s parent, its parent's parent, ..., the root (none for the root itself)."""
        out = []
        while self.parent[node] >= 0:
            node = self.parent[node]
            out.append(node)
        return out

    def depth_of(self, node: int) -> int:
        return len(self.ancestors(node))

    @property
    def depth(self) -> int:
        """The number of steps every lookup walks (the deepest leaf's depth)."""
        return max(self.depth_of(i) for i in self.leaves())

    def box(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """The closed box node `node` is verified over."""
        path = []
        while self.parent[node] >= 0:
            path.append(node)
            node = self.parent[node]
        lo, hi = self.lower.copy(), self.upper.copy()
        for child in reversed(path):
            p = self.parent[child]
            f, t = self.feature[p], self.threshold[p]
            if f == CARVE:  # inside: the carved box; outside: the node's box, a superset of its cell
                if child == self.children[p][1]:
                    lo, hi = np.maximum(lo, self.carved[p][0]), np.minimum(hi, self.carved[p][1])
            elif child == self.children[p][0]:
                hi[f] = min(hi[f], t)
            else:
                lo[f] = max(lo[f], t)
        return lo, hi

    def split(self, node: int, feature: int, threshold: float) -> tuple[int, int]:
        """Split leaf `node` at `threshold` on `feature` (strictly inside its box); the children
        start with the node's bounds (sound over any sub-box) and are not verified yet."""
        if not self.is_leaf(node):
            raise ValueError(f"region {node} is already split")
        lo, hi = self.box(node)
        if not (0 <= feature < len(lo)) or not (lo[feature] < threshold < hi[feature]):
            raise ValueError(f"threshold {threshold!r} is not inside region {node}'s box on feature {feature}")
        left, right = self._add_children(node)
        self.feature[node], self.threshold[node] = int(feature), float(threshold)
        return left, right

    def carve(self, node: int, lower: np.ndarray, upper: np.ndarray) -> tuple[int, int]:
        """Split the closed box [lower, upper], inside leaf `node`'s box and smaller than it, off
        the leaf: (the rest of the leaf, the carved box), both starting with the node's bounds."""
        if not self.is_leaf(node):
            raise ValueError(f"region {node} is already split")
        lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
        lo, hi = self.box(node)
        if (
            lower.shape != lo.shape
            or upper.shape != lo.shape
            or not (np.isfinite(lower).all() and np.isfinite(upper).all())
        ):
            raise ValueError(f"the box carved from region {node} must have {len(lo)} finite bounds per side")
        if not (np.all(lo <= lower) and np.all(lower <= upper) and np.all(upper <= hi)):
            raise ValueError(f"the box carved from region {node} is not inside its box")
        if np.array_equal(lower, lo) and np.array_equal(upper, hi):
            raise ValueError(f"the box carved from region {node} is its whole box")
        outside, inside = self._add_children(node)
        self.feature[node] = CARVE
        self.carved[node] = (lower.copy(), upper.copy())
        return outside, inside

    def _add_children(self, node: int) -> tuple[int, int]:
        if self.depth_of(node) >= MAX_DEPTH:
            raise ValueError(f"region {node} is at the maximum depth {MAX_DEPTH}")
        left, right = len(self), len(self) + 1
        for _ in (left, right):
            self.feature.append(-1)
            self.threshold.append(math.inf)
            self.parent.append(node)
            self.bound_upper.append(self.bound_upper[node].copy())
            self.bound_lower.append(np.full(self.num_classes, -np.inf))
            self.complete.append(np.zeros(self.num_classes, dtype=bool))
            self.verified.append(False)
            self.seconds.append(0.0)
            self.residual.append(dict(self.residual[node]))  # sound over any sub-box, as the bound
        self.children += [(left, left), (right, right)]
        self.children[node] = (left, right)
        return left, right

    def record(
        self, node: int, upper: np.ndarray, lower: np.ndarray, seconds: float = 0.0, complete: np.ndarray | None = None
    ) -> None:
        """A verification of `node`'s box: its upper bounds are capped by the parent's (which hold
        over a superset) and cap its descendants', its lower bounds are leaks inside the box;
        ancestors' lower bounds rise."""
        upper = np.asarray(upper, dtype=np.float64)
        parent = self.parent[node]
        cap = self.bound_upper[node] if parent < 0 else np.minimum(self.bound_upper[node], self.bound_upper[parent])
        self.bound_upper[node] = np.minimum(upper, cap)
        # A box verified again (its branch-and-bound continued) after it was split: every box below
        # it lies inside it, so its new upper bounds hold there too (ids grow from parents to children).
        for child in range(node + 1, len(self)):
            self.bound_upper[child] = np.minimum(self.bound_upper[child], self.bound_upper[self.parent[child]])
        self.bound_lower[node] = np.maximum(self.bound_lower[node], np.asarray(lower, dtype=np.float64))
        self.verified[node] = True
        self.seconds[node] += float(seconds)
        if complete is not None:
            self.complete[node] = np.asarray(complete, dtype=bool)
        up = parent
        while up >= 0:
            self.bound_lower[up] = np.maximum(self.bound_lower[up], self.bound_lower[node])
            up = self.parent[up]

    def record_residual(self, node: int, c: int, found: ClassResidual) -> None:
        """A residual set and level of class `c` proved over `node`'s box. The level is capped by the
        parent's bound (which holds for every network over a superset), and the node keeps the set
        it inherited instead when that one's level is lower (both are sound over the box)."""
        parent = self.parent[node]
        level = found.level if parent < 0 else min(found.level, float(self.bound_upper[parent][c]))
        kept = self.residual[node].get(c)
        if kept is None or level <= kept.level:
            self.residual[node][c] = ClassResidual(level, found.positions, found.bounds)

    def release_bounds(self) -> np.ndarray:
        """[nodes, C]: the bound an input's confidence must exceed to be released in each box: with
        residual sets the box's level (where the residual networks agree), else its bound."""
        out = np.array(self.bound_upper, dtype=np.float64).reshape(len(self), self.num_classes)
        for i, sets in enumerate(self.residual):
            for c, r in sets.items():
                out[i, c] = min(out[i, c], r.level)
        return out

    def sets_digest(self) -> str:
        """A fingerprint of every node's residual sets (which networks check which box and class)."""
        listed = [{str(c): r.positions.tolist() for c, r in sorted(sets.items())} for sets in self.residual]
        return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]

    def residual_sets(self) -> list[ClassResidual]:
        """Every set a leaf is served with (the union of their networks is what serving needs)."""
        return [r for i in self.leaves() for r in self.residual[i].values()]

    def leaf_upper(self) -> np.ndarray:
        """[C]: the domain's bound per class as the leaves prove it (max over the leaves, which cover
        the domain), never above the root's own."""
        leaves = np.array([self.bound_upper[i] for i in self.leaves()])
        return np.minimum(leaves.max(axis=0), self.bound_upper[0])

    def best_lower(self) -> np.ndarray:
        return self.bound_lower[0].copy()

    def leaves_complete(self) -> np.ndarray:
        """[C]: every leaf's verification of the class finished (its bound is exact per leaf)."""
        return np.asarray(np.array([self.complete[i] for i in self.leaves()]).all(axis=0))

    # --- lookup -----------------------------------------------------------------------------------
    def lookup_arrays(self) -> RegionLookup:
        carves = sorted(self.carved)
        d = len(self.lower)
        return RegionLookup(
            np.array([max(f, 0) for f in self.feature], dtype=np.int64),
            np.array([math.inf if f == CARVE else t for f, t in zip(self.feature, self.threshold, strict=True)]),
            np.array(self.children, dtype=np.int64),
            self.depth,
            np.array(carves, dtype=np.int64),
            np.array([self.carved[i][0] for i in carves]).reshape(len(carves), d),
            np.array([self.carved[i][1] for i in carves]).reshape(len(carves), d),
        )

    def locate(self, X: np.ndarray) -> np.ndarray:
        """The leaf of each row of X (network space, inside the domain)."""
        return self.lookup_arrays().locate(X)

    # --- JSON -------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        nodes = []
        for i in range(len(self)):
            lo, hi = self.box(i)
            nodes.append(
                {
                    "id": i,
                    "parent": None if self.parent[i] < 0 else self.parent[i],
                    "split": self._split_json(i),
                    "lower": lo.tolist(),
                    "upper": hi.tolist(),
                    "verified": self.verified[i],
                    "seconds": round(self.seconds[i], 3),
                    "bounds": {
                        str(c): {
                            "upper": bound_entry_value(self.bound_upper[i][c], upper=True),
                            "lower": bound_entry_value(self.bound_lower[i][c], upper=False),
                            "complete": bool(self.complete[i][c]),
                            **({"residual": self.residual[i][c].to_json()} if c in self.residual[i] else {}),
                        }
                        for c in range(self.num_classes)
                    },
                }
            )
        return {"format": REGIONS_FORMAT, "depth": self.depth, "leaves": len(self.leaves()), "nodes": nodes}

    def _split_json(self, i: int) -> dict[str, Any] | None:
        if self.is_leaf(i):
            return None
        left, right = self.children[i]
        if self.feature[i] == CARVE:
            lo, hi = self.carved[i]
            return {"box": {"lower": lo.tolist(), "upper": hi.tolist()}, "left": left, "right": right}
        return {"feature": self.feature[i], "threshold": self.threshold[i], "left": left, "right": right}

    def digest(self) -> str:
        """A fingerprint of the partition (not of its bounds): the memo records it."""
        h = hashlib.sha256(self.lower.tobytes() + self.upper.tobytes())
        h.update(json.dumps([self.feature, self.threshold, self.children]).encode())
        for i in sorted(self.carved):
            h.update(i.to_bytes(8, "little") + self.carved[i][0].tobytes() + self.carved[i][1].tobytes())
        return h.hexdigest()[:16]
