"""How a node's time is divided: the one place that rule lives.

The rule has two halves, one per side of the executor:
- the engine gives every attempt at a node a time limit (`attempt_time_limit`): the first
  attempt's limit grown RETRY_GROWTH-fold per retry, capped by what its deadline
  leaves (less `deadline_margin`), all of that for the last work left, at most SEEK_TIME_LIMIT for
  a seek; an AGT parameter box's verification shares the run among its classes (`parameter_box_class_time_limit`);
- the node analysis divides its attempt's limit among its stages (`NodeTimeShares`): the
  symbolic hull of its networks, the solver-free leak search, the ReLU-splitting tier, the MILP
  after it, each target group, the climb from the relaxation, the probe solve, bound tightening
  and the final MILP; a small node's targeted search keeps a reserve of its own
  (`targeted_search_reserve`). Every stage ends by the attempt's end, so the node's bound reaches
  the engine before the run's deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from lucid.deadline import Deadline
from lucid.settings import EncodingOptions, VerifySettings

# Each retry repeats the leak search, probe and OBBT (and, without a kept tree, restarts the
# MILP), so a short growth pays those costs, and the time-limited attempts before the one that
# proves the node, too often. Growing 4x reaches a given proof time in fewer attempts than
# doubling (60, 240, 960 s against 60, 120, 240, 480, 960 s), and a larger last limit costs
# nothing when the node is proved early (figures in benchmarks/results/idle_machine.md).
RETRY_GROWTH = 4
# A seek is after a leak (the primal side): its solver finds the incumbents it will find within
# about a minute (Adult 2x50: the class's best leak at 30 s), and the rest of a long node limit
# goes into the dual bound, which the seek's own retry under the cutoff proves far faster (Adult
# 2x50 with 8 000 rows: two 450-s seeks per class, one gaining nothing while its retry took 16 s).
SEEK_TIME_LIMIT = 60.0
# Each retry of a singleton gets this many times the split time, as its node limit grows.
SPLIT_GROWTH = 4
# The split gets at most this share of the node's limit: the MILP must keep time of its own.
SPLIT_SHARE = 0.5
# The probe solve that supplies a lower bound for tightening: at most this share of its stage.
PROBE_SHARE = 0.25
# The climb from the LP relaxation's maximiser is a heuristic: a few seconds, a small share.
CLIMB_TIME = 5.0
CLIMB_SHARE = 0.05
# A solve given less time than this returns before it has read its model; an attempt whose
# session is nearly over still gets this little, so it returns the bounds it has.
MIN_STAGE_TIME = 0.1
MIN_ATTEMPT_TIME = 0.05
# The symbolic hull of a node's networks (a tightening of its MILP's difference bounds) and the
# solver-free leak search each get at most this share of the attempt: on a thousand 2-D CNNs of 64
# inputs the hull took 6 s and the search 17-37 s, which left their MILP nothing of a 20-s limit.
HULL_SHARE = 0.25
SEARCH_SHARE = 0.25
# A small node whose MILP ends without a leak gets a search aimed at its networks
# (`lucid.analysis.outcome.with_targeted_search`): this share of its attempt, at most
# TARGETED_SEARCH_TIME seconds, is kept for it, so that search too ends within the limit.
TARGETED_SEARCH_SHARE = 0.1
TARGETED_SEARCH_TIME = 5.0


def deadline_margin(time_limit: float) -> float:
    """Node MILPs stop this long before the session's deadline, so their bounds are collected."""
    return min(3.0, 0.02 * time_limit)


def default_node_time_limit(time_limit: float | None) -> float | None:
    """Per-node MILP limit when only a total limit is given: an eighth of it, at least 20 s.

    Without one the root MILP gets all the time, and a root over thousands of networks may
    not finish in it at all, leaving only the screening bound. A node that hits its limit still
    returns its proved dual bound, and a hyper-network node is then split.
    """
    if time_limit is None:
        return None
    return max(20.0, time_limit / 8)


# With --residual M the level is decided by thousands of singletons, each asked whether its network
# stays below a question it mostly answers in a second or two, while the few whose true bound is above
# it (the networks the set will hold) spend any limit they get: an eighth of the run each would let a
# dozen of those hold both workers for the whole run (Adult 4k 2x50: 37.5-s singletons, 5 in 300 s,
# each ending at 0.51-0.58 where the split proves 0.50 in 1-2 s). They come back sooner and are
# retried with RETRY_GROWTH-fold limits while the level waits for them.
RESIDUAL_NODE_SHARE = 1 / 64
RESIDUAL_MIN_NODE_TIME = 5.0


def node_limit(settings: VerifySettings, deadline: Deadline) -> float | None:
    """A node's first attempt's limit: --node-time-limit, or a share of the deadline's span (a
    smaller one with --residual M)."""
    if settings.node_time_limit is not None:
        return settings.node_time_limit
    if settings.residual and deadline.seconds is not None:
        return max(RESIDUAL_MIN_NODE_TIME, deadline.seconds * RESIDUAL_NODE_SHARE)
    return default_node_time_limit(deadline.seconds)


def attempt_time_limit(
    settings: VerifySettings, attempts: int, deadline: Deadline, *, last_work: bool, seek: bool
) -> float | None:
    """Seconds for a node's next attempt, after `attempts` earlier ones, within `deadline` (None:
    no limit).

    `last_work`: nothing else can ever need the node's worker, so a shorter limit would only
    restart the node (repeating its tightening and, without a kept tree, its MILP): it gets all of
    the deadline's remaining time. `seek`: the attempt looks for a leak without the cutoff; when
    the node can be retried (a node limit exists) it gets at most SEEK_TIME_LIMIT."""
    first = node_limit(settings, deadline)
    limit = None if first is None else first * (RETRY_GROWTH ** max(0, attempts))
    if deadline.seconds is not None:
        total = deadline.seconds
        remaining = max(MIN_ATTEMPT_TIME, total - deadline.used() - deadline_margin(total))
        limit = remaining if limit is None or last_work else min(limit, remaining)
    if seek and first is not None and limit is not None:
        limit = min(limit, SEEK_TIME_LIMIT)
    return limit


def targeted_search_reserve(time_limit: float | None) -> float:
    """Seconds of an attempt kept for the targeted search after its MILP (0 without a limit)."""
    return 0.0 if time_limit is None else min(TARGETED_SEARCH_TIME, TARGETED_SEARCH_SHARE * time_limit)


def monotonic(at: float | None) -> float | None:
    """`at` (a time.perf_counter() value, which the node's stages count in) on time.monotonic()'s
    clock, which the searches and screens read (`lucid.deadline.past`)."""
    return None if at is None else time.monotonic() + (at - time.perf_counter())


def parameter_box_class_time_limit(
    node_time_limit: float | None, seconds_left: float | None, classes_left: int
) -> float | None:
    """A box verification's MILP for one class: --node-time-limit, and a fair share of what
    --time-limit leaves (`seconds_left`; None: no total limit) among the classes still to do."""
    limit = node_time_limit
    if seconds_left is not None:
        share = max(seconds_left / classes_left, MIN_STAGE_TIME)
        limit = share if limit is None else min(limit, share)
    return limit


@dataclass(frozen=True)
class NodeTimeShares:
    """One node analysis's time and its division among the stages (seconds; None: no limit).

    `start` is the time.perf_counter() at which `time_limit` began to run: every stage's allowance
    is measured from it, so a stage that overruns shortens the ones after it, never the total."""

    time_limit: float | None
    start: float
    split_time: float = 0.0  # the ReLU-splitting tier's allowance for this attempt
    obbt_probe: float = 5.0
    obbt_share: float = 0.5

    @classmethod
    def for_attempt(
        cls, settings: VerifySettings, encoding: EncodingOptions, time_limit: float | None, attempt: int, start: float
    ) -> NodeTimeShares:
        """The time shares of a node's `attempt` (1 = first): --split-time grows SPLIT_GROWTH-fold per
        retry, as the node limit does, up to SPLIT_SHARE of the limit. The tightening knobs come
        from `encoding`, which ablation experiments may set apart from `settings`."""
        split = settings.split_time * SPLIT_GROWTH ** max(0, attempt - 1)
        if time_limit is not None:
            split = min(split, time_limit * SPLIT_SHARE)
        return cls(time_limit, start, split, encoding.obbt_probe, encoding.obbt_share)

    def after_split(self, now: float) -> NodeTimeShares:
        """The time shares once the split ended unproved at `now`: the MILP gets as long as the split
        had, not the rest of the node's limit, so an unproved node comes back sooner (retried with
        both allowances grown) instead of holding its worker while easier networks wait (Adult
        2x50: a 60-s split, then a 390-s MILP that ended unproved too). A split that gave up early
        leaves the MILP the rest of its allowance too. Never past the attempt's limit (a split that
        took its extension leaves the MILP what is left of it, or MIN_STAGE_TIME)."""
        if self.time_limit is None:
            return self
        return replace(self, time_limit=min(self.time_limit, max(now - self.start, self.split_time) + self.split_time))

    @property
    def split_extension(self) -> float:
        """Seconds the ReLU split may go on past `split_time` when it is all but done
        (`lucid.bounds.relu_split.EXTEND_EXCESS`): the rest of the attempt (without a limit, its
        allowance once more). Its MILP then gets what is left."""
        if self.time_limit is None:
            return self.split_time
        return max(0.0, self.time_limit - self.split_time)

    def seconds_left(self, now: float) -> float | None:
        """What is left at `now` (at least MIN_STAGE_TIME, so a late stage still reports a bound)."""
        return None if self.time_limit is None else self._left(self.time_limit, now)

    def _left(self, time_limit: float, now: float) -> float:
        return max(time_limit - (now - self.start), MIN_STAGE_TIME)

    def from_now(self, now: float) -> NodeTimeShares:
        """The rest of these shares as shares of their own from `now`: a target group's, which its probe,
        tightening and final MILP divide in turn."""
        return replace(self, time_limit=self.seconds_left(now), start=now)

    @property
    def end(self) -> float | None:
        """The time.perf_counter() at which the attempt's limit runs out (None: no limit)."""
        return None if self.time_limit is None else self.start + self.time_limit

    def _share_end(self, now: float, share: float) -> float | None:
        """time.monotonic() at which a stage starting at `now` has used `share` of the limit, or
        the limit has run out."""
        if self.time_limit is None:
            return None
        return monotonic(min(now + share * self.time_limit, self.start + self.time_limit))

    def hull_deadline(self, now: float) -> float | None:
        """When the symbolic hull of the node's networks, started at `now`, is given up
        (time.monotonic())."""
        return self._share_end(now, HULL_SHARE)

    def search_deadline(self, now: float) -> float | None:
        """When the node's solver-free leak search, started at `now`, returns its best
        (time.monotonic())."""
        return self._share_end(now, SEARCH_SHARE)

    @property
    def monotonic_end(self) -> float | None:
        """The attempt's end on time.monotonic()'s clock (the leak climbs after a split stop there)."""
        return monotonic(self.end)

    def climb_time(self, now: float) -> float:
        """The climb from the relaxation's maximiser (a heuristic), at most what is left at `now`."""
        if self.time_limit is None:
            return CLIMB_TIME
        return min(CLIMB_TIME, CLIMB_SHARE * self.time_limit, self._left(self.time_limit, now))

    def probe_time(self, now: float) -> float:
        """The short probe solve whose replayed witness restricts the tightening LPs: at most
        PROBE_SHARE of its stage, and what is left at `now`."""
        if self.time_limit is None:
            return self.obbt_probe
        return min(self.obbt_probe, self.time_limit * PROBE_SHARE, self._left(self.time_limit, now))

    @property
    def tightening_deadline(self) -> float | None:
        """When bound tightening stops (a perf_counter time): it may take `obbt_share` of the limit."""
        return None if self.time_limit is None else self.start + self.time_limit * self.obbt_share
