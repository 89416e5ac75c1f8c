"""ReLU-splitting branch and bound on one leave-one-out network's bound beta*_{c,{i}}: the tier
between the symbolic screen and the singleton MILP. This module holds its search and the
verifier's entry (`split_singleton`); a domain and the choice of its next split are in
`lucid.bounds.split_domains`, the bound of a batch of domains in `lucid.bounds.split_lagrangian`.

The quantity (`lucid.bounds.symbolic`): for a rival t, beta_t = max { (s_c - s_t)(x) : x in the
box, (s'_c - s'_t)(x) <= 0 }, and beta*_{c,{i}} <= max_t beta_t. The symbolic bound relaxes every
unstable ReLU of N and of N' at once; what it leaves above beta_t is that relaxation's gap, which
only splitting closes. A *domain* fixes the sign of some pre-activations: of N's neurons
(zhat_j >= 0 or <= 0) and of N''s (zhat'_j = zhat_j + deltahat_j >= 0 or <= 0). The domains of a
split partition the box's trajectories, so beta_t is the maximum over the open domains, and a
domain whose bound is <= the cutoff is closed for good.

The batch of open domains with the largest bounds is split each round, then depth first beyond
`SplitOptions.max_domains` (`_search`). The result is always a sound upper bound: the maximum of
the open domains' bounds and of the closed ones'.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lucid.bounds.joint import JointSystem
from lucid.bounds.pair import PairProblem
from lucid.bounds.split_domains import _Domains
from lucid.bounds.split_lagrangian import _Brancher
from lucid.bounds.split_options import DomainBound, Hopeless, SplitControl, SplitLimits, SplitOptions, is_set
from lucid.bounds.symbolic import ScreenOptions, singleton_upper_bounds
from lucid.witness.gradient import gradient_search
from lucid.witness.replay import LeakQuery, LeakWitness, climb

LEAF_STEPS = 200  # Adam steps for a domain with nothing left to split (its bound is then final)
LEAK_STARTS = 4  # leak searches from the highest open domains of an unproved network
TRACE_EVERY = 1.0  # seconds between two points of a search's recorded bound
# The batch split per round is 1/POOL_SHARE of the open domains, between `SplitOptions.batch` (a
# small pool: the best few first, for a good anytime bound) and `deep_batch` (a large pool, and the
# depth-first phase: a batch's fixed costs, e.g. reordering the pool, spread over more domains).
# Adult 2x50's network 1941 to its cutoff, two torch threads: the same 1.47 M domains in 273 s with
# 1 024 per batch until the pool was full and 8 192 after, 170 s with 8 192 throughout, 154 s
# growing (one thread: 257 s); 1 024 throughout had not proved it after 150 s
# (benchmarks/results/split_tier.md).
POOL_SHARE = 16
# `split_singleton` checks once, after CHECK_SHARE of its time, whether the split is on track to
# prove the cutoff, and hands the rest of its time to the MILP when it is not: when its bound is
# still more than GIVE_UP_EXCESS (relative) above the cutoff, or when a leak at the cutoff is found
# (no relaxation proves a network below a level at which it leaks). Measured on the class's last
# networks (one thread, benchmarks/results/split_tier.md, "When the split gives up"): Adult 2x50's
# witness network 1941, which only the split proves, was 5-7 % above its cutoff after 60 s (the
# end-to-end run's worker gave up on it at 5.1 % when the limit was 5 %) and 0.4-3 % after 240 s;
# Crypto 2x100's 1526 and 1387, which only the MILP proved, 39 % / 25 % and 14 % / 8.6 %.
CHECK_SHARE = 0.25
GIVE_UP_EXCESS = 0.10
# A split whose time runs out with its bound within EXTEND_EXCESS (relative) of the cutoff is all
# but done: it may go on for the rest of its node's attempt (`SplitLimits.extend`) rather
# than hand the node to a MILP and, on the next attempt, start over (Adult 2x50's 1941, one
# thread: 0.4 % above after its 240 s, proved after 257 s).
EXTEND_EXCESS = 0.02


@dataclass
class _Checkpoint:
    """`split_upper_bound`'s checkpoint: asked once per network, whichever rival's search passes
    its time first (the searches of one network share this object)."""

    at: float  # seconds since the network's split started
    hopeless: Hopeless
    asked: bool = False


@dataclass
class _Extension:
    """`split_upper_bound`'s extension: once per network, a search whose time has run out with its
    bound within `excess` (relative) of the cutoff goes on for `seconds` more."""

    seconds: float
    excess: float
    used: bool = False

    def grants(self, bound: float, cutoff: float) -> bool:
        """Whether the search at `bound` goes on (and the extension is used up)."""
        if self.used or self.seconds <= 0 or bound > cutoff + self.excess * abs(cutoff):
            return False
        self.used = True
        return True


@dataclass
class _Network:
    """What the searches of one network's rivals share: its start, the bound recorded as it fell,
    and the caller's steering (`SplitControl`), its checkpoint and extension made stateful."""

    t0: float  # time.perf_counter() at the network's start
    checkpoint: _Checkpoint | None
    extension: _Extension | None
    stop: threading.Event | None
    domain_bound: DomainBound | None
    trace: list[tuple[float, float]] = field(default_factory=list)

    @classmethod
    def start(cls, control: SplitControl) -> _Network:
        return cls(
            time.perf_counter(),
            None if control.checkpoint is None else _Checkpoint(*control.checkpoint),
            None if control.extension is None else _Extension(*control.extension),
            control.stop,
            control.domain_bound,
        )


@dataclass
class SplitResult:
    """The outcome of `split_upper_bound` for one network and class."""

    bound: float  # sound upper bound on beta*_{c,{i}} (-inf: no input can leak)
    proved: bool  # bound <= cutoff
    domains: int  # domains bounded
    seconds: float
    per_target: dict[int, float]  # the bound per rival t that N' can reach
    starts: np.ndarray | None = None  # [n, d] where the highest open domains attain their bounds (unproved only)
    witness: LeakWitness | None = None  # a replayed leak found from `starts` (`split_singleton`), or None
    trace: list[tuple[float, float]] = field(default_factory=list)  # (seconds, the searched rival's bound) as it fell
    gave_up: bool = False  # stopped at the checkpoint (`SplitControl.checkpoint`), not at the time limit


def _peaks(parts: list[_Domains]) -> np.ndarray:
    """[<= LEAK_STARTS, d]: where the highest open domains of `parts` attain their bounds (where a
    leak above the cutoff would most likely be)."""
    top = _Domains.cat([d.take(torch.argsort(d.bound, descending=True)[:LEAK_STARTS]) for d in parts if len(d)])
    return top.x[torch.argsort(top.bound, descending=True)[:LEAK_STARTS]].cpu().numpy()


def split_upper_bound(
    pair: PairProblem,
    cls: int,
    cutoff: float,
    *,
    margin_upper: np.ndarray | None = None,
    start: np.ndarray | None = None,
    control: SplitControl = SplitControl(),
    options: SplitOptions = SplitOptions(),
) -> SplitResult:
    """Sound upper bound on beta*_{cls,{i}} for the one network N' of `pair` against N, by
    ReLU-splitting branch and bound until every domain is <= `cutoff` or control.time_limit
    seconds have passed (module docstring; `control`: the caller's checkpoint, extension, stop and
    second opinion); best first while at most options.max_domains are open, then depth first
    (`_search`).

    margin_upper [C, C]: sound bounds on max_x s_c - s_t (optional cap). start: optional [C] sound
    bounds per rival (e.g. the optimised screen's `per_target`); rivals at -inf (N' can never
    prefer them) or already <= cutoff are skipped."""
    if pair.count != 1:
        raise ValueError(f"split_upper_bound bounds one network N', not {pair.count}")
    net = _Network.start(control)
    t0 = net.t0
    root = JointSystem(pair, device=options.device)
    C = root.W[-1].shape[0]
    cap = np.full((C, C), np.inf) if margin_upper is None else np.asarray(margin_upper, dtype=np.float64)
    per_target: dict[int, float] = {}
    evaluated, gave_up = 0, False
    more = net.extension
    starts: list[np.ndarray] = []
    # |s_c - s_u| <= max(margin_upper[c, u], margin_upper[u, c]): what mixing the rivals needs
    mix_bound = float(max(np.max(cap[cls]), np.max(cap[:, cls]))) if C > 2 and margin_upper is not None else None
    for t in range(C):
        if t == cls:
            continue
        first = min(math.inf if start is None else float(start[t]), cap[cls, t])
        if first <= cutoff:  # unreachable (-inf) or already below the cutoff
            per_target[t] = first
            continue
        b = _Brancher(root, cls, t, options, mix_bound)
        open_ = b.bound(b.root_domains(first), steps=0)
        # beta's and lambda's step sizes relative to the bound's scale, lambda's also to N''s margin range
        scale = abs(float(open_.bound[0]))
        scale = max(scale, 1e-6) if math.isfinite(scale) else 1.0
        hl, hu = root.hl[-1][0], root.hu[-1][0]
        spread = max(float(hu[cls] - hl[t]), float(hu[t] - hl[cls]), 1e-6)
        b.lr, b.lam_lr = options.lr * scale, options.lam_lr * scale / spread
        open_ = b.bound(open_)
        deadline = t0 + control.time_limit + (more.seconds if more is not None and more.used else 0.0)
        per_target[t], open_, gave_up = _search(b, open_, cutoff, deadline, options, net)
        evaluated += b.evaluated
        if per_target[t] > cutoff and len(open_):
            starts.append(_peaks([open_]))
        if per_target[t] > cutoff > -math.inf or is_set(net.stop):
            break  # this rival alone already keeps the network above the cutoff: nothing to prove
    for t in range(C):  # rivals not reached (an earlier one already failed): their start bound
        if t != cls and t not in per_target:
            per_target[t] = min(math.inf if start is None else float(start[t]), cap[cls, t])
    bound = max(per_target.values(), default=-math.inf)
    return SplitResult(
        bound,
        bound <= cutoff,
        evaluated,
        time.perf_counter() - t0,
        per_target,
        np.concatenate(starts) if starts else None,
        trace=net.trace,
        gave_up=gave_up,
    )


def _search(
    b: _Brancher, open_: _Domains, cutoff: float, deadline: float, options: SplitOptions, net: _Network
) -> tuple[float, _Domains, bool]:
    """Branch and bound from the bounded domains `open_` until every domain is closed (<= cutoff,
    or nothing left to split), a closed one is above the cutoff, or the deadline passes. Returns
    the sound bound (the maximum over closed and open domains), the domains left open and whether
    the checkpoint stopped it.

    Best first (the batch of highest bounds is split each round; options.batch, .deep_batch: its
    fewest and most domains, see POOL_SHARE) while at most options.max_domains are open: that
    lowers the anytime bound fastest. Beyond that, each round's reordering of the whole open set
    would cost more than the bounding, and memory grows with it, so the search goes depth first:
    it takes the best batch off the pool and finishes that subtree (a stack of batches, the newest
    children first) before the next. Which domains must be split to prove a cutoff does not
    depend on the order, only the anytime bound does.

    net.domain_bound: None, or a second sound bound for a domain, (rival, N's split signs per layer,
    N''s) -> float, asked in the depth-first phase for the children whose own bound did not
    improve on their parent's (the verifier's `DomainLp`: the LP of the singleton's MILP, about 6 ms
    against the pass's 0.3, but tighter where the pass stalls: on Adult's witness network, deep
    domains stuck at 0.0207 by the pass had 0.0178 by the LP).

    net.trace: where to append (seconds since net.t0, bound) when the bound falls (at most every
    TRACE_EVERY seconds) and at the end.

    net.checkpoint: None, or a `_Checkpoint` not yet asked: once its time (seconds since t0) has
    passed, the search asks hopeless(bound, xs) (xs: where the highest open domains attain their
    bounds) and stops if it answers True. Stopping early changes only how long the search runs:
    the bound is sound. net.stop: once set, the search ends as at its deadline. net.extension:
    None, or an `_Extension` asked when the deadline passes: the deadline moves on by its seconds
    if it grants them."""
    t0, trace, checkpoint, extension = net.t0, net.trace, net.checkpoint, net.extension
    batch, pool = (options.batch, options.deep_batch), options.max_domains
    closed = -math.inf
    stack: list[_Domains] = []
    stopped = False

    def settle(d: _Domains) -> _Domains:
        # closed: below the cutoff, or nothing left to split (the relaxation is then as tight as
        # it gets: the domain keeps its bound, after a longer optimisation)
        nonlocal closed
        leaf = (d.choice < 0) & (d.bound > cutoff)
        if leaf.any():  # (those the LP's multipliers proved empty need no polishing)
            started = b.lp_start(d.take(torch.nonzero(leaf).flatten()))
            empty = started.bound == -math.inf
            parts = [d.take(torch.nonzero(~leaf).flatten()), started.take(torch.nonzero(empty).flatten())]
            if not empty.all():
                parts.append(b.bound(started.take(torch.nonzero(~empty).flatten()), steps=LEAF_STEPS, leaves=True))
            d = _Domains.cat(parts)
        done = (d.bound <= cutoff) | (d.choice < 0)
        if done.any():
            closed = max(closed, float(d.bound[done].max()))
            d = d.take(torch.nonzero(~done).flatten())
        return d

    def split(d: _Domains, deep: bool) -> _Domains:
        # the children, bounded; in the depth-first phase those no better than their parent get
        # the second opinion (best first, where the pass still makes progress, it only cost time:
        # Adult's top network took 22 s instead of 11)
        kids = b.children(d)
        inherited = kids.bound.clone()
        kids = b.bound(kids)
        if deep and net.domain_bound is not None:
            stalled = torch.nonzero((kids.bound >= inherited) & (kids.bound > cutoff)).flatten().tolist()
            for i in stalled:
                if time.perf_counter() > deadline or is_set(net.stop):
                    break
                other = net.domain_bound(
                    b.rival, [s[i].cpu().numpy() for s in kids.sn], [s[i].cpu().numpy() for s in kids.sp]
                )
                kids.bound[i] = min(float(kids.bound[i]), other)
        return kids

    def best_first(d: _Domains, size: int) -> tuple[_Domains, _Domains]:
        order = torch.argsort(d.bound, descending=True)
        return d.take(order[:size]), d.take(order[size:])

    open_ = settle(open_)
    while True:
        highest = max([float(d.bound.max()) for d in (open_, *stack) if len(d)], default=-math.inf)
        now = time.perf_counter()
        if not trace or (max(closed, highest) < trace[-1][1] and now - t0 >= trace[-1][0] + TRACE_EVERY):
            trace.append((now - t0, max(closed, highest)))
        if highest == -math.inf or closed >= highest or closed > cutoff > -math.inf:
            break
        if now > deadline:
            if extension is None or not extension.grants(max(closed, highest), cutoff):
                break
            deadline += extension.seconds
        if is_set(net.stop):
            break
        if checkpoint is not None and not checkpoint.asked and now - t0 >= checkpoint.at:
            checkpoint.asked = True
            if checkpoint.hopeless(max(closed, highest), _peaks([open_, *stack])):
                stopped = True
                break
        if not stack and len(open_) <= pool:
            pick, rest = best_first(open_, min(batch[1], max(batch[0], len(open_) // POOL_SHARE)))
            open_ = _Domains.cat([rest, settle(split(pick, False))])
            continue
        if not stack:
            pick, open_ = best_first(open_, batch[1])
            stack.append(pick)
        cur = stack.pop()
        if len(cur) > batch[1]:
            cur, later = best_first(cur, batch[1])
            stack.append(later)
        kids = settle(split(cur, True))
        if len(kids):
            stack.append(kids)
    open_ = _Domains.cat([open_, *stack]) if stack else open_
    final = max(closed, float(open_.bound.max()) if len(open_) else -math.inf)
    trace.append((time.perf_counter() - t0, final))
    return final, open_, stopped


# ---------------------------------------------------------------------- adapter for the verifier
def leaks_from(problem, cls: int, position: int, xs: np.ndarray, deadline: float | None = None) -> list:
    """The replayed leaks of the network at `position` of problem.stack found from the points `xs`
    (where open domains peak): an LP walk from each, and the gradient search from all, until
    `deadline` (time.monotonic())."""
    query = LeakQuery(problem.stack, np.array([position]), cls, problem.lower, problem.upper)
    found = [climb(query, x, deadline=deadline) for x in xs]
    found.append(gradient_search(query, xs, deadline=deadline))
    return [leak for leak in found if leak is not None]


def split_singleton(
    problem,
    cls: int,
    position: int,
    cutoff: float,
    limits: SplitLimits,
    options: SplitOptions = SplitOptions(),
    domain_bound: DomainBound | None = None,
) -> SplitResult:
    """`split_upper_bound` for the network at `position` of problem.stack (a `VerificationProblem`),
    started from its optimised symbolic bound per rival (`lucid.bounds.symbolic`): rivals N' cannot
    reach, or already below the cutoff there, are not branched on. domain_bound: see `_search`
    (the verifier passes its `DomainLp(...).bound`). limits.give_up: stop after CHECK_SHARE of
    the time limit if the split is not on track (GIVE_UP_EXCESS; `gave_up` in the result);
    limits.extend: up to this many seconds more when the time limit passes within EXTEND_EXCESS
    of the cutoff."""
    pair = PairProblem.singleton(
        problem.stack, position, problem.n_bounds.lower, problem.n_bounds.upper, problem.lower, problem.upper
    )
    leaks: list = []

    def leak_from(xs: np.ndarray) -> None:
        if options.search:
            leaks.extend(leaks_from(problem, cls, position, xs, limits.leak_deadline))

    def hopeless(bound: float, xs: np.ndarray) -> bool:
        if bound > cutoff + GIVE_UP_EXCESS * abs(cutoff):
            return True
        leak_from(xs)
        return any(found.confidence >= cutoff for found in leaks)

    start = singleton_upper_bounds(
        pair, cls, problem.margin_upper, ScreenOptions.optimised(options.device), cutoff=cutoff
    ).per_target[0]
    checkpoint = (CHECK_SHARE * limits.time_limit, hopeless) if limits.give_up else None
    control = SplitControl(limits.time_limit, limits.stop, checkpoint, (limits.extend, EXTEND_EXCESS), domain_bound)
    res = split_upper_bound(
        pair, cls, cutoff, margin_upper=problem.margin_upper, start=start, control=control, options=options
    )
    # unproved: climb to a real leak from where the open domains peak (unless the checkpoint just
    # climbed from those same domains and stopped on the leak it found)
    if res.starts is not None and not (res.gave_up and leaks) and not is_set(limits.stop):
        leak_from(res.starts)
    res.witness = max(leaks, key=lambda found: found.confidence, default=None)
    return res
