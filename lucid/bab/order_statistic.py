"""The residual level as an order statistic (`lucid verify --residual M`).

Per class the engine keeps every network's own proven upper bound (`ClassState.network_bound`,
with its screen: `network_bounds`) and its best replayed leak (`ClassState.network_leak`). With M
networks checked at query time, the set is the M networks with the largest bounds (ties: the
lower position first; a network proved harmless, bound -inf, never takes a place) and the level is
the (M+1)-th largest bound: it bounds every network outside the set by construction, whatever the
set is. Its lower bound is the (M+1)-th largest leak: any set of M networks leaves one of the M + 1
networks with the largest leaks outside, so no set's level can be below it.

So the search spends its time where the level is decided: nodes whose bound is below the level
cannot change it (`relevant`), a network that leaks above the level is in the set by construction
(its bound is above the level), and a singleton that is hard to prove but ranks among the M largest
bounds is simply set aside (`set_aside`), instead of being retried while the level waits.
"""

from __future__ import annotations

import math

import numpy as np

from lucid.bab.node import Node
from lucid.bab.state import ClassState
from lucid.residual import ClassResidual
from lucid.residual_choice import ChoiceInputs, SizeChoice, choose_size


def track_networks(cs: ClassState, size: int, num_networks: int) -> None:
    """Start keeping the class's per-network bounds and leaks, with `size` networks in its set (a
    resumed class keeps its own)."""
    if cs.residual_size is None:
        cs.residual_size = size
    if cs.network_bound is None:
        cs.network_bound = np.full(num_networks, math.inf)
        cs.network_leak = np.full(num_networks, -math.inf)


def network_bounds(cs: ClassState) -> np.ndarray:
    """Per position: the smallest proven upper bound on beta*_{c,{i}} (screen and node analyses)."""
    if cs.screen is None:
        return cs.network_bound
    return np.minimum(cs.screen, cs.network_bound)


def ranked(bounds: np.ndarray, size: int) -> tuple[np.ndarray, float, int | None]:
    """The set (the `size` largest bounds over positions >= 1, ascending positions), the level (the
    next largest bound, -inf when no network is left outside) and the position that holds it."""
    positions = np.arange(1, len(bounds), dtype=np.int64)
    values = bounds[1:]
    order = np.lexsort((positions, -values))
    members = order[:size]
    members = members[values[members] > -math.inf]
    if len(order) <= size or values[order[size]] == -math.inf:
        return np.sort(positions[members]), -math.inf, None
    return np.sort(positions[members]), float(values[order[size]]), int(positions[order[size]])


def leak_floor(leaks: np.ndarray, size: int) -> tuple[float | None, int | None]:
    """The (size + 1)-th largest leak over positions >= 1 and its position (None: fewer leaks)."""
    values = leaks[1:]
    if size >= len(values):
        return None, None
    k = int(np.argpartition(-values, size)[size])
    value = float(values[k])
    return (None, None) if value == -math.inf else (value, k + 1)


def set_aside(cs: ClassState, node: Node) -> bool:
    """Whether `node`, a singleton, is in its class's current set (the M largest bounds, ties by
    position): proving it can only lower the level by evicting it."""
    if cs.residual_size is None or not node.is_singleton or cs.residual is None:
        return False
    return bool(np.isin(node.positions[0], cs.residual))


def known_member(cs: ClassState, node: Node) -> bool:
    """Whether `node` is a singleton whose network leaks at or above the level: every set with a
    lower level holds it, so analysing it could only find its exact bound, which no lower level
    needs: it is set aside unanalysed (at most M networks leak that high, or the level would be
    higher)."""
    return cs.residual_size is not None and node.is_singleton and bool(cs.network_leak[node.positions[0]] >= cs.level)


def worth_retrying(cs: ClassState, node: Node) -> bool:
    """Whether a set-aside singleton is worth another analysis: it is no known member (evicting
    it could lower the level)."""
    return not known_member(cs, node)


def relevant(cs: ClassState, node: Node) -> bool:
    """Whether `node` holds a network at or above the level (only those can lower it)."""
    return cs.residual_size is None or node.upper >= cs.level


def residual_set(cs: ClassState) -> ClassResidual:
    """The class's set and level as they stand, with the members' proven bounds."""
    bounds = network_bounds(cs)
    members, level, _ = ranked(bounds, cs.residual_size)
    return ClassResidual(level, members, bounds[members].astype(np.float64))


def leak_outside(cs: ClassState, members: np.ndarray) -> tuple[float | None, int | None]:
    """The best leak of a network outside `members` and its position: the level of that set can
    be no lower (None: no leak outside)."""
    leaks = cs.network_leak.copy()
    leaks[0] = -math.inf
    leaks[members] = -math.inf
    p = int(np.argmax(leaks))
    return (None, None) if leaks[p] == -math.inf else (float(leaks[p]), p)


class SizeChooser:
    """`--residual auto` within one verification: the engine asks it for M after improvements
    (`EngineHooks.choose_size`), from every class's network bounds (lucid/residual_choice.py)."""

    def __init__(self, inputs: ChoiceInputs, cap: int, networks: int) -> None:
        self.inputs, self.cap, self.networks = inputs, cap, networks
        self.last: SizeChoice | None = None

    def choose(self, states: dict[int, ClassState]) -> int:
        sizes = {c: cs.residual_size for c, cs in states.items() if cs.residual_size is not None}
        current = min(sizes.values(), default=self.cap)
        self.last = choose_size(self.inputs, {c: network_bounds(states[c]) for c in sizes}, self.cap, current)
        return self.last.size

    def record(self, section: dict | None) -> dict:
        """bounds.json's "residual_choice": the last choice, the networks it serves and their bytes."""
        served = 0 if section is None else len(section["networks"])
        out = self.last.to_json(served, self.inputs.bytes_per_network) if self.last is not None else {"size": self.cap}
        out["every_network"] = self.cap >= self.networks  # fewer networks than the cap: Naive-iDP is in reach
        return out
