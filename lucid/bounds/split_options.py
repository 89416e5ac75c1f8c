"""What a splitting tier is run with, apart from its network: the search's tuning knobs
(`SplitOptions`), when a singleton's tier stops in the verifier's terms (`SplitLimits`), and how a
caller steers the ReLU split's search of one network (`SplitControl`).

Three objects rather than one because they change at different places: the knobs are fixed for a
verification, the limits are the node's (its time, its race with the MILP), and the control is
what `lucid.bounds.relu_split.split_singleton` makes of the limits for one network (a checkpoint
that searches for leaks, the second opinion of the network's LP).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# (bound, xs) -> whether the search should give up: xs [n, d] are where its highest open domains peak
Hopeless = Callable[[float, np.ndarray], bool]
# (rival, N's split signs per hidden layer, N''s) -> a second sound bound of the domain
DomainBound = Callable[[int, list, list], float]


@dataclass(frozen=True)
class SplitOptions:
    """The ReLU split's tuning knobs (`lucid.bounds.relu_split.split_upper_bound`).

    batch, deep_batch: the fewest and the most domains split per round (`relu_split.POOL_SHARE`);
    max_domains: open domains beyond which the search goes depth first; steps, lr, lam_lr,
    alpha_lr: Adam steps per bound of a batch and the step sizes of the split multipliers beta,
    of lambda (both relative to the bound's scale) and of the slopes and the mix
    (`lucid.bounds.split_lagrangian`); device: where the tensors live; search: whether an
    unproved network gets a leak search from where its open domains peak (off with --no-search)."""

    batch: int = 1024
    deep_batch: int = 8192
    steps: int = 20
    lr: float = 0.0125
    lam_lr: float = 0.1
    alpha_lr: float = 0.1
    max_domains: int = 300_000
    device: str = "cpu"
    search: bool = True


@dataclass(frozen=True)
class SplitLimits:
    """When a singleton's splitting tier stops before it has closed every domain, in the
    verifier's terms (`split_singleton`, `input_split_singleton`).

    time_limit: seconds; stop: a `threading.Event` that ends it early when set (a race with the
    MILP that settled the node first); give_up: stop at the checkpoint when the split is not on
    track (each tier's own test; `gave_up` in the result); extend: up to this many seconds more for
    a ReLU split whose time runs out all but done (`relu_split.EXTEND_EXCESS`; the input split
    does not extend); leak_deadline: when the climbs to a leak from the highest open domains (at
    the checkpoint and after an unproved split) end (time.monotonic(); the node attempt's end)."""

    time_limit: float
    stop: threading.Event | None = None
    give_up: bool = True
    extend: float = 0.0
    leak_deadline: float | None = None


@dataclass(frozen=True)
class SplitControl:
    """How a caller steers `split_upper_bound`'s search of one network.

    time_limit: seconds from the call's start; stop: as in `SplitLimits`; checkpoint: None, or
    (seconds from the call's start, hopeless), asked once for the network by the first rival's
    search to pass that time, which stops if hopeless(bound, xs) answers True; extension: None, or
    (seconds, relative excess): once for the network, a search whose time runs out with its bound
    within that excess of the cutoff goes on for those seconds; domain_bound: None, or a second
    sound bound asked for stalled domains in the depth-first phase (`relu_split._search`)."""

    time_limit: float = 10.0
    stop: threading.Event | None = None
    checkpoint: tuple[float, Hopeless] | None = None
    extension: tuple[float, float] | None = None
    domain_bound: DomainBound | None = None


def is_set(stop: threading.Event | None) -> bool:
    """Whether a caller's stop (None: there is none) is set."""
    return stop is not None and stop.is_set()
