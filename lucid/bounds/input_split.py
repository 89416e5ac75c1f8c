"""Input-splitting branch and bound on one leave-one-out network's bound beta*_{c,{i}}: the
splitting tier for networks with few inputs.

The ReLU-splitting tier (`lucid.bounds.relu_split`) keeps the box and refines the relaxation of
its neurons; with few inputs it is often cheaper to cut the box instead. Every bound of the
symbolic screen (`lucid.bounds.symbolic`) is sound for any box, and on a smaller box N's neuron
bounds and the joint system's are tighter, so the relaxation's gap shrinks with the box's width.
The boxes of a split partition their parent, so beta_t over the domain is the maximum over the
leaves, and a leaf whose bound is <= the cutoff is closed for good.

Best first: the open box with the largest bound is cut in two at the middle of its widest side
(widths relative to the domain's). Each box is bounded by the plain symbolic pass (no slope
optimisation: on Crypto 2x100 many cheap boxes beat fewer optimised ones, 0.354 against 0.369
after 60 s on network 1526) over N's interval bounds on that box. The result is always a sound
upper bound: the maximum of the open leaves' bounds and of the closed ones'.
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from lucid.bounds.interval import interval_bounds, interval_margin_upper
from lucid.bounds.pair import PairProblem
from lucid.bounds.relu_split import CHECK_SHARE, LEAK_STARTS, TRACE_EVERY, SplitResult, leaks_from
from lucid.bounds.split_options import SplitLimits, SplitOptions, is_set
from lucid.bounds.symbolic import ScreenOptions, singleton_upper_bounds

# After CHECK_SHARE of its time the tier gives up (leaving the rest to the MILP) unless it has closed
# at least GIVE_UP_LEFT of the distance from its first bound to the cutoff: cutting boxes gains
# steadily or hardly at all (Crypto 2x100 class 1's networks 1526 and 1387 were proved in about 20 s
# of a 240-s allowance; class 0's 1387, which the MILP proves, was still 9 % above its cutoff after
# 240 s).
GIVE_UP_LEFT = 0.5
# Boxes narrower than this (relative to the domain) on every side are not cut again: their bound
# stays open (a network whose beta_t needs them is left to the MILP).
MIN_WIDTH = 1e-9


def box_bound(
    problem, cls: int, position: int, lower: np.ndarray, upper: np.ndarray, cutoff: float, device: str = "cpu"
) -> np.ndarray:
    """[C] sound upper bounds on beta_t of the network at `position` over the box [lower, upper] (a
    sub-box of the problem's domain), -inf for the rivals N' cannot reach there."""
    stack = problem.stack
    n_bounds = interval_bounds([w[0] for w in stack.weights], [b[0] for b in stack.biases], lower, upper)
    margin = interval_margin_upper(n_bounds)
    pair = PairProblem.singleton(stack, position, n_bounds.lower, n_bounds.upper, lower, upper)
    return singleton_upper_bounds(pair, cls, margin, ScreenOptions(device=device), cutoff=cutoff).per_target[0]


def input_split_singleton(
    problem,
    cls: int,
    position: int,
    cutoff: float,
    limits: SplitLimits,
    options: SplitOptions = SplitOptions(),
    *,
    max_boxes: int | None = None,
) -> SplitResult:
    """Sound upper bound on beta*_{cls,{i}} of the network at `position` of problem.stack (a
    `VerificationProblem`) by cutting the domain into boxes until every box is below `cutoff` or
    limits.time_limit seconds have passed (or limits.stop is set, or `max_boxes` boxes are
    bounded: a budget that does not depend on the machine's speed), or, with limits.give_up, at the
    checkpoint when it is not on track (GIVE_UP_LEFT; `gave_up` in the result). An unproved network
    gets a leak search from the centres of its highest open boxes (the result's witness; not with
    options.search off, as with --no-search). Of `options` only `device` and `search` apply here."""
    time_limit = limits.time_limit
    t0 = time.perf_counter()
    lower, upper = np.asarray(problem.lower, dtype=np.float64), np.asarray(problem.upper, dtype=np.float64)
    scale = np.where(upper > lower, upper - lower, 1.0)
    C = problem.num_classes
    per_target = np.full(C, -math.inf)  # over the closed leaves; the open ones are added at the end
    closed = -math.inf
    heap: list[tuple[float, int, np.ndarray, np.ndarray, np.ndarray]] = []
    tick, boxes = 0, 0
    trace: list[tuple[float, float]] = []
    last_trace = -math.inf

    def add(lo: np.ndarray, hi: np.ndarray) -> None:
        nonlocal tick, boxes, closed, per_target
        per = box_bound(problem, cls, position, lo, hi, cutoff, options.device)
        boxes += 1
        b = float(per.max())
        if b <= cutoff:
            closed = max(closed, b)
            per_target = np.maximum(per_target, per)
            return
        tick += 1
        heapq.heappush(heap, (-b, tick, lo, hi, per))

    add(lower.copy(), upper.copy())
    first = -heap[0][0] if heap else -math.inf
    checked, gave_up = not limits.give_up, False
    while heap and -heap[0][0] > cutoff and time.perf_counter() - t0 < time_limit:
        if is_set(limits.stop) or (max_boxes is not None and boxes >= max_boxes):
            break
        if not checked and time.perf_counter() - t0 >= CHECK_SHARE * time_limit:
            checked = True
            if max(-heap[0][0], closed) - cutoff > GIVE_UP_LEFT * (first - cutoff):
                gave_up = True
                break
        now = time.perf_counter() - t0
        if now - last_trace >= TRACE_EVERY:
            trace.append((now, max(-heap[0][0], closed)))
            last_trace = now
        neg, _, lo, hi, per = heapq.heappop(heap)
        widths = (hi - lo) / scale
        d = int(np.argmax(widths))
        if widths[d] <= MIN_WIDTH:  # nothing left to cut: this box's bound is final
            tick += 1
            heapq.heappush(heap, (neg, tick, lo, hi, per))
            break
        mid = 0.5 * (lo[d] + hi[d])
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[d], right_lo[d] = mid, mid
        add(lo, left_hi)
        add(right_lo, hi)
    top = -heap[0][0] if heap else -math.inf
    bound = max(top, closed)
    for _, _, _, _, per in heap:
        per_target = np.maximum(per_target, per)
    proved = bound <= cutoff
    starts = None
    witness = None
    if not proved and heap:
        highest = heapq.nsmallest(LEAK_STARTS, heap)
        starts = np.array([0.5 * (lo + hi) for _, _, lo, hi, _ in highest])
        if options.search:
            witness = max(
                leaks_from(problem, cls, position, starts, limits.leak_deadline),
                key=lambda leak: leak.confidence,
                default=None,
            )
    trace.append((time.perf_counter() - t0, bound))
    return SplitResult(
        bound=bound,
        proved=proved,
        domains=boxes,
        seconds=time.perf_counter() - t0,
        per_target={t: float(v) for t, v in enumerate(per_target) if t != cls and v > -math.inf},
        starts=starts,
        witness=witness,
        trace=trace,
        gave_up=gave_up,
    )
