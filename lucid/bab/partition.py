"""Splitting a node's network set: k-means on the flattened parameter vectors.

Networks with similar parameters give a tight hyper-network, so clustering them keeps the
children's MILPs close to their members' true bounds. k is picked at the elbow (knee) of the
distortion (inertia) curve over k in {2, 4, 8}: the k whose inertia lies furthest below the chord
from k=1 (the set's total scatter) to the largest candidate. A fixed random_state keeps splits —
and hence logs, checkpoints and resumed runs — reproducible. A small set whose own MILP ran out
of time is split into singletons instead (`split_node`), and a set whose hyper-network MILP did not
even beat its members' screened bounds is peeled (`peel_top`).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from lucid.network import NetworkStack

CANDIDATE_KS = (2, 4, 8)

# A hyper-network MILP over a handful of networks that ran out of time is no easier than their
# singletons' (which are exact and get bound tightening), and k-means on a few networks tends to
# peel one outlier off per split, so each split would cost a full node time limit to remove one
# network while the bound stays far above the best leak. Such sets go straight to singletons.
UNPROVED_SINGLETONS_AT = 8


def preload_kmeans() -> None:
    """Import scikit-learn's k-means ahead of the first split (it takes seconds: run in a thread)."""
    with contextlib.suppress(Exception):  # only a head start: `_kmeans` imports it again and raises any failure
        import sklearn.cluster  # noqa: F401 (imported for its start-up cost only)


def _kmeans(x: np.ndarray, k: int, random_state: int) -> tuple[np.ndarray, float]:
    from sklearn.cluster import KMeans

    with warnings.catch_warnings():
        # Identical networks (e.g. a duplicated training row) make k-means find fewer distinct
        # clusters than asked; that is handled below, not an error.
        warnings.simplefilter("ignore")
        km = KMeans(n_clusters=k, n_init=1, random_state=random_state, max_iter=100).fit(x)
    return km.labels_, float(km.inertia_)


def choose_k(inertia: dict[int, float]) -> int:
    """The knee of a decreasing distortion curve {k: inertia} (k=1 included)."""
    ks = sorted(inertia)
    first, last = ks[0], ks[-1]
    if len(ks) <= 2:
        return last
    span_y = inertia[first] - inertia[last]
    if span_y <= 0:
        return ks[1]
    best_k, best_gain = ks[1], -np.inf
    for k in ks[1:-1]:
        chord = inertia[first] - span_y * (k - first) / (last - first)
        gain = chord - inertia[k]  # how far below the straight line: the bend of the elbow
        if gain > best_gain + 1e-12 * abs(span_y):
            best_k, best_gain = k, gain
    # A curve with no bend (gain <= 0) still splits: the smallest k keeps the children large.
    return best_k if best_gain > 0 else ks[1]


class FlatParameters:
    """`params[positions]` = the flat parameter rows (`NetworkStack.flat_parameters`) of those networks,
    computed per node: the whole [networks, parameters] matrix is never built (3.6 GB in float64
    for 36 000 networks of 2x100)."""

    def __init__(self, stack: NetworkStack) -> None:
        self.stack = stack

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        return self.stack.select(positions).flat_parameters()


def split_positions(
    params: np.ndarray, positions: np.ndarray, *, random_state: int = 0, ks: tuple[int, ...] = CANDIDATE_KS
) -> list[np.ndarray]:
    """Partition `positions` (rows of `params` are the networks' flat parameters, indexed by position)
    into >= 2 non-empty, sorted groups. A set of two or three networks is split into singletons/pairs."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    n = len(positions)
    if n < 2:
        raise ValueError("cannot split a set of fewer than two networks")
    if n == 2:
        return [positions[:1], positions[1:]]
    x = np.asarray(params[positions], dtype=np.float64)
    x = x - x.mean(axis=0)
    inertia = {1: float((x**2).sum())}
    labels_by_k: dict[int, np.ndarray] = {}
    for k in ks:
        if k >= n:
            break
        labels_by_k[k], inertia[k] = _kmeans(x, k, random_state)
    if not labels_by_k:  # n <= smallest k: every network alone
        return [positions[i : i + 1] for i in range(n)]
    labels = labels_by_k[choose_k(inertia)]
    groups = [positions[labels == g] for g in np.unique(labels)]
    groups = [g for g in groups if len(g)]
    if len(groups) < 2:  # all parameter vectors identical: any partition is as good
        half = n // 2
        groups = [positions[:half], positions[half:]]
    # Deterministic order: by the smallest position of each group.
    return sorted(groups, key=lambda g: int(g[0]))


def split_node(params: np.ndarray, positions: np.ndarray, *, proved: bool, random_state: int = 0) -> list[np.ndarray]:
    """Children of a solved node: singletons for a small set whose MILP did not finish, else k-means."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    if not proved and 1 < len(positions) <= UNPROVED_SINGLETONS_AT:
        return [positions[i : i + 1] for i in range(len(positions))]
    return split_positions(params, positions, random_state=random_state)


# A root with more screened networks than this is peeled at once, without its hyper-network MILP:
# over hundreds of networks the interval weights are so loose that the MILP spends its whole time
# limit and ends above the members' screened bounds (Adult 2x50: 359 and 130 networks, 450 s each,
# no gain), which is what would make the engine peel anyway. The symbolic screens bound every
# network on its own more tightly than a MILP over the interval hull of even a few networks can
# (Crypto 2x50 class 1: a 5-network root MILP took 106 s and ended at its screen, while its
# singletons were proved in 0.5-14 s), so with them every root of more than one network is peeled.
PEEL_ROOT_ABOVE = {"interval": 32, "symbolic": 1, "optimised": 1}


def peel_top(positions: np.ndarray, screen: np.ndarray, k: int) -> list[np.ndarray]:
    """The `k` networks with the largest screened bounds, each alone, then the rest as one set.

    For a set whose hyper-network MILP ended above its members' screened bounds, clustering is
    no help: the interval weights of a hyper-network, even over a few networks, keep its
    children's MILPs above their screens too, while the singletons' MILPs (exact, tightened)
    prove most networks below the cutoff in about a second. The class's bound is the largest screen left, so the
    top-screened networks are the ones worth a MILP; the rest waits, unsolved."""
    positions = np.asarray(positions, dtype=np.int64)
    order = np.argsort(-screen[positions], kind="stable")
    top = positions[order[:k]]
    rest = np.sort(positions[order[k:]])
    return [top[i : i + 1] for i in range(len(top))] + ([rest] if len(rest) else [])
