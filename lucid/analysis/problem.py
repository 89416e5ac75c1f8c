"""The verification problem of a run: every network, the input domain, N's bounds over it.

A `VerificationProblem` is all a worker needs for any node, and it is shipped to each worker once.
N's pre-activation bounds (LP-tightened by default) are cached in RUN/cache/, keyed by content.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lucid.analysis.scaling import hidden_scales, rescale_stack
from lucid.atomic import write_atomic
from lucid.bounds.difference import DifferenceBounds, WeightIntervals, difference_bounds, intersect_differences
from lucid.bounds.interval import LayerBounds, interval_bounds, interval_margin_upper
from lucid.bounds.pair import PairProblem
from lucid.deadline import paced, past
from lucid.dynamic_range import check_dynamic_range
from lucid.errors import LucidError
from lucid.hyper import HyperNetwork, stack_hull
from lucid.network import NetworkStack
from lucid.network_cache import mapped_networks
from lucid.settings import BOUND_METHODS

log = logging.getLogger(__name__)


@dataclass
class VerificationProblem:
    """Everything a worker needs for any node: picklable (numpy only)."""

    stack: NetworkStack
    lower: np.ndarray
    upper: np.ndarray
    n_bounds: LayerBounds  # N's pre-activation bounds over the domain
    margin_upper: np.ndarray  # [C, C] sound upper bounds of s_c - s_t for N
    bounds_method: str = "lp"
    points: np.ndarray | None = None  # training inputs: where the witness search starts (None: samples only)
    # power-of-two factors of the hidden neurons (lucid.analysis.scaling); None: the networks as stored
    neuron_scales: list[np.ndarray] | None = None

    @property
    def num_classes(self) -> int:
        return self.stack.num_classes

    @property
    def n_weights(self) -> list[np.ndarray]:
        return [w[0] for w in self.stack.weights]

    @property
    def n_biases(self) -> list[np.ndarray]:
        return [b[0] for b in self.stack.biases]

    @classmethod
    def from_stack(
        cls,
        stack: NetworkStack,
        lower: np.ndarray,
        upper: np.ndarray,
        bounds: str = "lp",
        deadline: float | None = None,
    ) -> VerificationProblem:
        """The problem of `stack` over the box [lower, upper]; N's LP bounds until `deadline`
        (`compute_n_bounds`)."""
        lower, upper = _check_domain(stack, lower, upper)
        stack, scales = _rescaled(stack, lower, upper)
        n_bounds, margin = compute_n_bounds(stack, lower, upper, bounds, deadline)
        return cls(stack, lower, upper, n_bounds, margin, bounds, neuron_scales=scales)

    @classmethod
    def from_run(
        cls, run, bounds: str = "lp", with_points: bool = False, deadline: float | None = None
    ) -> VerificationProblem:
        """Load the run's networks and N's bounds (cached in RUN/cache/, keyed by content);
        `with_points`: also the training inputs, for the witness search. N's LP bounds stop at
        `deadline` (time.monotonic(); `compute_n_bounds`), and bounds cut short are not cached."""
        points = None
        if with_points:
            try:
                points = run.data().get("X_train")
            except LucidError:
                points = None  # the search then samples the domain only

        stack = mapped_networks(run.path, run.meta)  # float64, shared by the worker processes
        lower, upper = _check_domain(stack, *run.domain)
        stack, scales = _rescaled(stack, lower, upper)
        key = _cache_key(stack, lower, upper, bounds)
        path = Path(run.cache_dir) / f"n-bounds-{bounds}-{key}.npz"
        L = len(stack.weights)
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
                return cls(
                    stack,
                    lower,
                    upper,
                    LayerBounds.from_arrays(arrays, L),
                    arrays["margin_upper"],
                    bounds,
                    points,
                    scales,
                )
            except Exception:  # noqa: BLE001 (a corrupt cache is recomputed, never trusted)
                log.warning("ignoring unreadable cache file %s", path)
        n_bounds, margin = compute_n_bounds(stack, lower, upper, bounds, deadline)
        if past(deadline):  # (the tightening may have been cut short: the next run computes them again)
            return cls(stack, lower, upper, n_bounds, margin, bounds, points, scales)
        try:

            def write(tmp: str) -> None:
                with open(tmp, "wb") as fh:
                    np.savez(fh, margin_upper=margin, **n_bounds.to_arrays())

            write_atomic(path, write)
        except OSError as exc:
            log.warning("cannot cache N's bounds in %s: %s", path, exc)
        return cls(stack, lower, upper, n_bounds, margin, bounds, points, scales)


def _rescaled(
    stack: NetworkStack, lower: np.ndarray, upper: np.ndarray
) -> tuple[NetworkStack, list[np.ndarray] | None]:
    """The stack with extreme hidden neurons rescaled by powers of two (the same functions, exactly),
    after the entry guard on its dynamic range; unchanged (memory-mapped) for ordinary networks."""
    hull = stack_hull(stack)  # one pass over every network, without a copy
    check_dynamic_range(hull, lower, upper, "the run's networks")
    scales = hidden_scales(hull, lower, upper)
    if scales is None:
        return stack, None
    log.info("hidden neurons of extreme magnitude rescaled by powers of two (the same networks exactly)")
    return rescale_stack(stack, scales), scales


def _check_domain(stack: NetworkStack, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    d = stack.input_dim
    if lower.shape != (d,) or upper.shape != (d,):
        raise LucidError(f"the domain has {lower.size}/{upper.size} bounds but the networks take {d} inputs")
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))) or np.any(lower > upper):
        raise LucidError("the domain must be a finite box with lower <= upper")
    return lower, upper


def _cache_key(stack: NetworkStack, lower: np.ndarray, upper: np.ndarray, bounds: str) -> str:
    h = hashlib.sha256(bounds.encode())
    for arr in [*(w[0] for w in stack.weights), *(b[0] for b in stack.biases), lower, upper]:
        h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def compute_n_bounds(
    stack: NetworkStack, lower: np.ndarray, upper: np.ndarray, method: str = "lp", deadline: float | None = None
) -> tuple[LayerBounds, np.ndarray]:
    """N's pre-activation bounds and the [C, C] margin bounds by `method` ("interval" | "lp"); the
    LP tightening stops at `deadline` (time.monotonic()), where the bounds it has not tightened yet
    stay the interval ones (sound, looser)."""
    if method not in BOUND_METHODS:
        raise LucidError(f"unknown bound method {method!r}; valid: {', '.join(BOUND_METHODS)}")
    w = [x[0] for x in stack.weights]
    b = [x[0] for x in stack.biases]
    if method == "interval":
        nb = interval_bounds(w, b, lower, upper)
        return nb, interval_margin_upper(nb)
    from lucid.bounds.lp import lp_bounds, lp_margin_upper

    nb = lp_bounds(w, b, lower, upper, deadline=deadline)
    return nb, lp_margin_upper(w, b, lower, upper, nb, deadline)


def node_difference_bounds(
    problem: VerificationProblem,
    hyper: HyperNetwork,
    positions: np.ndarray | None = None,
    deadline: float | None = None,
) -> DifferenceBounds:
    """The difference intervals of a node's hyper-network (interval propagation); with `positions`
    (the node's networks) intersected with the hull of each network's symbolic intervals, when
    that is done by `deadline` (time.monotonic(); a hull over only some members bounds nothing).

    The hull is not a bound over every weight vector of the hyper-network's box, only over its
    member networks; that is all the MILP needs, since only the members' trajectories must stay
    feasible (the same argument as for the matching dependencies)."""
    diff = difference_bounds(
        problem.n_weights, problem.n_biases, WeightIntervals.of(hyper), problem.n_bounds, problem.lower, problem.upper
    )
    if positions is None:
        return diff
    from lucid.bounds.symbolic import difference_intervals

    positions = np.asarray(positions, dtype=np.int64)
    pre = hyp = None
    covered = 0
    for part in paced(len(positions), SYMBOLIC_CHUNK, deadline):  # chunks bound the memory of the pass
        chunk = positions[part]
        covered += len(chunk)
        pair = PairProblem(
            problem.n_weights,
            problem.n_biases,
            [w[chunk] for w in problem.stack.weights],
            [b[chunk] for b in problem.stack.biases],
            problem.n_bounds.lower,
            problem.n_bounds.upper,
            problem.lower,
            problem.upper,
        )
        sym = difference_intervals(pair)
        pre, hyp = _hull(sym.pre, pre), _hull(sym.hyper, hyp)
    if covered < len(positions):
        return diff
    return intersect_differences(diff, pre, hyp)


SYMBOLIC_CHUNK = 256


def _hull(bounds: LayerBounds, so_far: LayerBounds | None) -> LayerBounds:
    """The interval hull over the networks (leading axis), joined with `so_far`."""
    lower = [lo.min(axis=0) for lo in bounds.lower]
    upper = [hi.max(axis=0) for hi in bounds.upper]
    if so_far is not None:
        lower = [np.minimum(a, b) for a, b in zip(lower, so_far.lower, strict=True)]
        upper = [np.maximum(a, b) for a, b in zip(upper, so_far.upper, strict=True)]
    return LayerBounds(lower, upper)
