"""`lucid verify --residual auto`: the smallest M whose release rule meets the noised-share target.

The rule with M networks per class noises an input that N labels c when its confidence is at or
below the class's release threshold (max(level, 0) + N's float error, the access layer's) or when
one of the class's M networks disagrees with N there. Both terms follow from the per-network
bounds (the ranking and the (M+1)-th largest bound, lucid/bab/order_statistic.py) and from every
network's label on a fixed set of inputs (the test split, or `--public-inputs`), computed once:
per input, the rank of the first network that disagrees. So the noised share of every M from 0 to
the cap costs one pass over the inputs, and the choice is made again each time the bounds improve
(M only ever shrinks: a smaller M serves fewer networks and a higher level is all it costs).

The target is the one the benchmarks use: at most max(2 x Naive-iDP's share, Naive-iDP's + 2
points), where Naive-iDP noises exactly the inputs on which some network disagrees. The choice
and its figures go to bounds.json ("residual_choice"), the log and `lucid report`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid.analysis.soundness import confidence_error, release_thresholds
from lucid.network import NetworkStack, confidence

TARGET_FACTOR, TARGET_POINTS = 2.0, 0.02


def noised_target(naive: float) -> float:
    """The share the rule may noise: max(2 x Naive-iDP's, Naive-iDP's + 2 points)."""
    return max(TARGET_FACTOR * naive, naive + TARGET_POINTS)


@dataclass(frozen=True, eq=False)
class ChoiceInputs:
    """The inputs the choice is measured on, as every network labels them (eq=False: arrays)."""

    source: str  # "the test split" or "--public-inputs"
    labels: np.ndarray  # [n] N's class
    confidences: np.ndarray  # [n] N's confidence (float64)
    disagreeing: list[np.ndarray]  # per input: the positions (>= 1) of the networks that label it otherwise
    error: float  # N's float error bound over the domain (the access layer's E_N)
    bytes_per_network: int  # float64 parameters of one network, as the access layer holds them

    @classmethod
    def measure(
        cls, stack: NetworkStack, x: np.ndarray, source: str, lower: np.ndarray, upper: np.ndarray, chunk: int = 256
    ) -> ChoiceInputs:
        """Every network's label on `x` (network space, float64)."""
        x = np.asarray(x, dtype=np.float64)
        scores_n = stack.select(np.array([0])).forward(x)[0]
        labels = scores_n.argmax(axis=1)
        hits: list[list[int]] = [[] for _ in range(len(x))]
        for start in range(1, len(stack), chunk):
            positions = np.arange(start, min(start + chunk, len(stack)))
            other = stack.select(positions).forward(x).argmax(axis=2) != labels[None, :]  # [k, n]
            for k, i in zip(*np.nonzero(other), strict=True):
                hits[i].append(int(positions[k]))
        weights = [w[0] for w in stack.select(np.array([0])).weights]
        biases = [b[0] for b in stack.select(np.array([0])).biases]
        error = confidence_error(weights, biases, lower, upper)
        size = sum(int(w[0].size) + int(b[0].size) for w, b in zip(stack.weights, stack.biases, strict=True))
        return cls(
            source,
            labels,
            confidence(scores_n, labels),
            [np.asarray(h, dtype=np.int64) for h in hits],
            float(error),
            8 * size,
        )

    @property
    def naive_share(self) -> float:
        """Naive-iDP's noised share: the inputs on which some network disagrees."""
        return float(np.mean([len(h) > 0 for h in self.disagreeing])) if len(self.labels) else 0.0


def noised_shares(inputs: ChoiceInputs, bounds: dict[int, np.ndarray], cap: int) -> np.ndarray:
    """[cap + 1]: the share of `inputs` the rule noises with M = 0..cap networks per class, from
    each class's per-network bounds (position 0: N, ignored). A class without bounds (not
    verified) noises all its inputs."""
    counts = np.zeros(cap + 2, dtype=np.int64)  # a difference array over M
    n = len(inputs.labels)
    for c in np.unique(inputs.labels):
        rows = np.flatnonzero(inputs.labels == c)
        if int(c) not in bounds:
            counts[0] += len(rows)
            continue
        values = bounds[int(c)][1:]
        positions = np.arange(1, len(values) + 1)
        order = np.lexsort((positions, -values))
        rank = np.empty(len(values) + 1, dtype=np.int64)
        rank[positions[order]] = np.arange(len(values))
        levels = np.full(cap + 1, -math.inf)
        known = min(cap + 1, len(values))
        levels[:known] = values[order[:known]]
        thresholds = release_thresholds(levels, inputs.error)  # non-increasing in M
        for i in rows:
            # noised by the level for M < k; by a member for M > the first disagreeing network's rank
            k = int(np.searchsorted(-thresholds, -inputs.confidences[i], side="right"))
            hits = inputs.disagreeing[i]
            first = int(rank[hits].min()) if len(hits) else cap + 1
            if k > first:
                counts[0] += 1
                counts[cap + 1] -= 1
                continue
            counts[0] += 1
            counts[k] -= 1
            if first + 1 <= cap:
                counts[first + 1] += 1
    return np.cumsum(counts)[: cap + 1] / max(n, 1)


@dataclass(frozen=True)
class SizeChoice:
    """One choice of M and why (bounds.json's "residual_choice", the log's `residual_size`)."""

    size: int
    cap: int
    noised: float
    naive_idp: float
    target: float
    inputs: str
    count: int
    needed: int | None  # the smallest M (up to |D|) that meets the target with these bounds, if > cap

    @property
    def met(self) -> bool:
        return self.noised <= self.target

    def to_json(self, served: int | None = None, bytes_per_network: int | None = None) -> dict[str, Any]:
        out = {
            "size": self.size,
            "cap": self.cap,
            "noised": round(self.noised, 6),
            "naive_idp": round(self.naive_idp, 6),
            "target": round(self.target, 6),
            "met": self.met,
            "inputs": self.inputs,
            "count": self.count,
        }
        if self.needed is not None:
            out["needed"] = self.needed
        if served is not None:
            out["networks_served"] = served
            if bytes_per_network is not None:
                out["bytes_served"] = (served + 1) * bytes_per_network  # N and the union of the sets
        return out


def choose_size(inputs: ChoiceInputs, bounds: dict[int, np.ndarray], cap: int, current: int) -> SizeChoice:
    """The smallest M <= min(cap, current) meeting the target with these bounds; if none does, the
    one with the smallest share (and `needed`: the M that would, up to every network)."""
    naive = inputs.naive_share
    target = noised_target(naive)
    limit = min(cap, current)
    shares = noised_shares(inputs, bounds, limit)
    meets = np.flatnonzero(shares <= target + 1e-12)
    needed = None
    if len(meets):
        size = int(meets[0])
    else:
        size = int(np.argmin(shares))
        networks = max(len(b) - 1 for b in bounds.values()) if bounds else 0
        everything = noised_shares(inputs, bounds, networks)
        over = np.flatnonzero(everything <= target + 1e-12)
        needed = int(over[0]) if len(over) else networks
    return SizeChoice(size, cap, float(shares[size]), naive, target, inputs.source, len(inputs.labels), needed)
