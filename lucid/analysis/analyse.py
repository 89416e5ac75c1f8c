"""The node-analysis API: a sound upper bound (and a replayed lower bound) on beta*_{c,S}.

beta*_{c,S} = max beta  s.t.  exists x in the domain with C_N^c(x) >= beta and C_{N#_S}^c(x) <= 0,
C^c(x) = score_c - max_{c' != c} score_c'. `analyse_node` encodes Eq. 3 for the hyper-network
of S, solves it, adds the floating-point safety margin to the solver's dual bound, and replays
the solver's witness with the concrete networks to get a true lower bound. The soundness rules it
applies live in `lucid.analysis.soundness`; how its time is divided, in `lucid.analysis.time_shares`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lucid.analysis.domain_lp import DomainLp
from lucid.analysis.kept_trees import KEPT, KeptTree
from lucid.analysis.milp_tier import FinalMilp, GroupBound, GroupPlan, NodeModels, SolveContext, final_solve
from lucid.analysis.outcome import NodeOutcome, combine_outcome, with_leak
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.soundness import slack
from lucid.analysis.time_shares import NodeTimeShares
from lucid.bounds.split_options import SplitLimits, SplitOptions
from lucid.rundir import decode_float, encode_float
from lucid.settings import EncodingOptions, VerifySettings, split_space_for
from lucid.solvers.base import INFEASIBLE, OPTIMAL, TIME_LIMIT, SolverOptions
from lucid.witness.replay import LeakQuery, LeakWitness
from lucid.witness.search import search_node_witness

# lucid.analysis.agt_box (and benchmarks/screen.py) still import these three from here.

if TYPE_CHECKING:
    from lucid.bounds.relu_split import SplitResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeRequest:
    """What the caller asks of one node analysis, besides its networks and options.

    `cutoff`: the caller only needs to know whether beta*_{cls,S} exceeds this level (the
    class's best replayed leak, plus the gap it tolerates). The MILP is then restricted to
    beta >= cutoff (minus a slack), which proves most nodes below it at the root; such a node
    is returned INFEASIBLE with `upper` = the slackened cutoff, still a sound bound on
    beta*_{cls,S}. Without it the bound is as tight as the solver gets it.

    `attempt`: how often the caller has asked for this node (1 = first). Under a cutoff the first
    attempt is a plain bound-focused MILP (see `GroupBound`); later ones add bound tightening.

    `keep_trees`: a singleton retry that stops at its time limit keeps its solver tree in this
    process, and the next retry of the same node continues it (`lucid.analysis.kept_trees`).

    `split_only`: a singleton under a cutoff gets the whole time limit for its splitting tier, which
    does not give up, and no MILP: its result is the split's bound (a `--residual M` class whose
    MILPs stopped beating their split, `lucid.bab.milp_worth`)."""

    cutoff: float = -math.inf
    attempt: int = 1
    keep_trees: bool = False
    split_only: bool = False


@dataclass(frozen=True, eq=False)
class _Node:
    """One `analyse_node` call as its tiers read it (eq=False: arrays): the networks and class, the
    request, the options, and the key its singleton's MILP is kept under (None: not kept)."""

    problem: VerificationProblem
    cls: int
    positions: np.ndarray
    request: NodeRequest
    settings: VerifySettings
    encoding: EncodingOptions
    keep_key: tuple | None


def analyse_node(
    problem: VerificationProblem,
    cls: int,
    positions: np.ndarray,
    *,
    settings: VerifySettings | None = None,
    solver_options: SolverOptions | None = None,
    encoding: EncodingOptions | None = None,
    request: NodeRequest = NodeRequest(),
) -> NodeOutcome:
    """Sound bounds on beta*_{cls,S} for the networks S at `positions` (>= 1) of the stack.

    `settings`: the verification's options (solver, encoder switches, search); `solver_options`:
    this solve's time limit and threads; `encoding` overrides `settings.encoding_options()` for
    ablation experiments that switch the encoder's parts one by one; `request`: the cutoff, the
    attempt and whether a retry keeps its MILP (`NodeRequest`)."""
    t0 = time.perf_counter()
    settings = settings or VerifySettings()
    encoding = encoding or settings.encoding_options()
    solver_options = solver_options or settings.solver_options(None)
    positions = _checked_positions(problem, positions)
    cutoff, attempt = request.cutoff, request.attempt
    times = NodeTimeShares.for_attempt(settings, encoding, solver_options.time_limit, attempt, start=t0)
    keep_key = _kept_tree_key(cls, positions) if request.keep_trees and attempt > 1 else None
    node = _Node(problem, cls, positions, request, settings, encoding, keep_key)
    if _splits_first(settings, positions, cutoff) and request.split_only:
        return _profiled(_split_alone(node, times))
    # A node given more than one thread (the last work, beside idle workers) races on them as well:
    # the split on one core and the MILP on the others, rather than HiGHS's branch and bound, which
    # gains little from a second thread, on both.
    if _splits_first(settings, positions, cutoff) and (settings.split_race or solver_options.threads > 1):
        return _profiled(_raced(node, solver_options, times))
    split = None
    split_stats: dict[str, Any] = {}
    if _splits_first(settings, positions, cutoff):
        split = _split_singleton(
            node,
            SplitLimits(times.split_time, extend=times.split_extension, leak_deadline=times.monotonic_end),
            split_stats,
        )
        if split.proved:  # every domain is below the cutoff: no MILP needed
            _release_kept_tree(problem, keep_key)
            return _profiled(_split_proved(split, split_stats, t0))
        times = times.after_split(time.perf_counter())
    solver_options = dataclasses.replace(solver_options, time_limit=times.time_limit)
    outcome = _milp_side(node, solver_options, times, split)
    outcome.stats.update(split_stats)
    return _profiled(_tighter(outcome, split, cls))


def _milp_side(
    node: _Node, solver_options: SolverOptions, times: NodeTimeShares, split: SplitResult | None
) -> NodeOutcome:
    """The node's MILP tier: its kept MILP continued, or its models built and solved per target group."""
    problem, positions, cutoff = node.problem, node.positions, node.request.cutoff
    kept = _take_kept_tree(problem, node.keep_key, cutoff)
    if kept is not None:
        return _continue_kept(node, kept, solver_options, times.start)
    t_build = time.perf_counter()
    models = NodeModels.build(
        problem, node.cls, positions, node.encoding, node.settings.solver, cutoff, deadline=times.hull_deadline(t_build)
    )
    stats: dict = {
        "networks": int(positions.size),
        "bounds_seconds": time.perf_counter() - t_build,
        "targets": models.targets,
    }
    if not models.targets:
        return NodeOutcome(-math.inf, None, None, None, INFEASIBLE, time.perf_counter() - times.start, stats)
    # Under a cutoff a solver-free leak only matters if it beats the class's best leak, which a
    # search over a large set (the root's) can do but one over a single low-ranked network
    # practically never does. So a singleton's first attempt skips it; retries (the top-ranked
    # networks, where such a leak may exist) search again.
    first_cut = math.isfinite(cutoff) and node.request.attempt <= 1 and positions.size == 1
    search = models.encoding.search and not first_cut
    known = _known_leak(
        models, split, stats, deadline=times.search_deadline(time.perf_counter()) if search else None, search=search
    )
    return _solve_groups(models, times, solver_options, known, first_cut, node.keep_key, stats)


def _split_proved(split: SplitResult, split_stats: dict, t0: float) -> NodeOutcome:
    return NodeOutcome(
        split.bound, None, None, None, INFEASIBLE, time.perf_counter() - t0, {"networks": 1, **split_stats}
    )


def _split_alone(node: _Node, times: NodeTimeShares) -> NodeOutcome:
    """A singleton's splitting tier with the attempt's whole limit and no give-up, and no MILP
    (`NodeRequest.split_only`): its bound and leak are the node's, TIME_LIMIT when unproved."""
    split_stats: dict = {}
    seconds = times.time_limit if times.time_limit is not None else times.split_time
    split = _split_singleton(node, SplitLimits(seconds, give_up=False, leak_deadline=times.monotonic_end), split_stats)
    _release_kept_tree(node.problem, node.keep_key)
    if split.proved:
        return _split_proved(split, split_stats, times.start)
    outcome = NodeOutcome(
        split.bound, None, None, None, TIME_LIMIT, time.perf_counter() - times.start, {"networks": 1, **split_stats}
    )
    return with_leak(outcome, split.witness, node.cls)


def _raced(node: _Node, solver_options: SolverOptions, times: NodeTimeShares) -> NodeOutcome:
    """A singleton's splitting tier and MILP side by side (`--split-race`, or a node given several
    threads: the split takes one of them), each with the attempt's whole limit: the first to settle
    the node stops the other (`SolverOptions.stop` interrupts HiGHS; the split checks the same event
    between batches). Settled: the split proved the cutoff, or the MILP proved it or its optimum.
    Both bounds are sound, so the smaller is kept, with the better leak (`_tighter`). The split's
    give-up checkpoint still applies: a split that is off track leaves the cores to the MILP."""
    stop = threading.Event()
    split_stats: dict = {}
    box: dict = {}
    seconds = times.time_limit if times.time_limit is not None else times.split_time

    def split_side() -> None:
        try:
            box["split"] = _split_singleton(
                node, SplitLimits(seconds, stop, leak_deadline=times.monotonic_end), split_stats
            )
            if box["split"].proved:
                stop.set()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the node's thread below)
            box["error"] = exc

    thread = threading.Thread(target=split_side, name="lucid-split-race", daemon=True)
    thread.start()
    try:
        options = dataclasses.replace(
            solver_options, time_limit=times.time_limit, stop=stop, threads=max(1, solver_options.threads - 1)
        )
        outcome = _milp_side(node, options, times, None)
        if outcome.status in (OPTIMAL, INFEASIBLE) or outcome.upper <= node.request.cutoff:
            stop.set()
    except BaseException:
        stop.set()  # the MILP side failed: the split has nobody to race
        raise
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    split = box["split"]
    winner = "split" if split.proved else ("milp" if stop.is_set() else None)
    if split.proved:
        _release_kept_tree(node.problem, node.keep_key)
    outcome.stats.update(split_stats, race=winner)
    return _tighter(outcome, split, node.cls)


def _profiled(outcome: NodeOutcome) -> NodeOutcome:
    """The outcome with `stats["profile"]`: where the node's time went and the bound of each tier,
    in one place for `lucid log` and benchmarks/hard_singletons.py (seconds overlap under a race)."""
    st = outcome.stats
    solves = st.get("solves", [])
    milp = sum(float(s.get("seconds", 0.0)) for s in solves)
    root = sum(float(s["root_seconds"]) for s in solves if s.get("root_seconds") is not None)
    split = st.get("split") or {}
    st["profile"] = {
        "total": outcome.seconds,
        "bounds": st.get("bounds_seconds"),
        "split": split.get("wall_seconds"),
        "split_upper": split.get("upper"),
        "search": st.get("search_seconds"),
        "obbt": sum(float(s.get("obbt_seconds", 0.0)) for s in solves) or None,
        "milp_root": root or None,
        "milp_tree": (milp - root) if solves else None,
        "milp_upper": encode_float(min((decode_float(s.get("upper_bound", "inf")) for s in solves), default=math.inf)),
        "upper": encode_float(outcome.upper),
        "lower": outcome.lower,
        "race": st.get("race"),
    }
    return outcome


def _checked_positions(problem: VerificationProblem, positions: np.ndarray) -> np.ndarray:
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0 or positions.min() < 1 or positions.max() >= len(problem.stack):
        raise ValueError(f"positions must index leave-one-out networks 1..{len(problem.stack) - 1}")
    return positions


def _splits_first(settings: VerifySettings, positions: np.ndarray, cutoff: float) -> bool:
    """A singleton under a cutoff first gets the ReLU-splitting branch and bound (every attempt, with
    an allowance growing like the node limit): it proves most networks without any MILP."""
    return positions.size == 1 and math.isfinite(cutoff) and settings.split_time > 0 and not settings.naive


def _kept_tree_key(cls: int, positions: np.ndarray) -> tuple | None:
    """A singleton's retries keep their time-limited MILP (`lucid.analysis.kept_trees`) under this key."""
    return (int(cls), tuple(int(p) for p in positions)) if positions.size == 1 else None


def _release_kept_tree(problem: VerificationProblem, key: tuple | None) -> None:
    """Free the node's kept MILP: the node no longer needs one."""
    kept = KEPT.take(problem, key) if key is not None else None
    if kept is not None:
        kept.release()


def _take_kept_tree(problem: VerificationProblem, key: tuple | None, cutoff: float) -> KeptTree | None:
    """The node's kept MILP, if it still answers the question asked (its level is the cutoff's)."""
    kept = KEPT.take(problem, key) if key is not None else None
    if kept is not None and kept.level < slack(cutoff):  # the cutoff rose since: a weaker question
        kept.release()
        return None
    return kept


def _known_leak(
    node: NodeModels, split: SplitResult | None, stats: dict, *, search: bool, deadline: float | None
) -> LeakWitness | None:
    """The best leak known before any MILP, from a solver-free search over the node's networks
    (with `search`, until `deadline`, a time.monotonic() value) and from the splitting tier: the
    MILP then only has to look above it."""
    known = None
    if search:
        t_search = time.perf_counter()
        problem = node.problem
        known = search_node_witness(
            LeakQuery(problem.stack, node.positions, node.cls, problem.lower, problem.upper), deadline=deadline
        )
        stats["search_seconds"] = time.perf_counter() - t_search
        stats["search_lower"] = None if known is None else known.confidence
    if (
        split is not None
        and split.witness is not None
        and (known is None or split.witness.confidence > known.confidence)
    ):
        known = split.witness
    return known


def _solve_groups(
    node: NodeModels,
    times: NodeTimeShares,
    options: SolverOptions,
    known: LeakWitness | None,
    first_cut: bool,
    keep_key: tuple | None,
    stats: dict,
) -> NodeOutcome:
    """Bound the node per group of target classes (one group unless the disjunction is split):
    its bound is the largest of the groups'."""
    targets = node.targets
    groups = [[t] for t in targets] if (node.encoding.disjunction == "split" and len(targets) > 1) else [targets]
    single = len(groups) == 1
    upper, statuses, best = -math.inf, [], None
    stats["solves"] = []
    for group in groups:
        # a witness found for all targets may not leak towards this group's targets
        plan = GroupPlan(
            search=node.encoding.search and single and not first_cut,
            plain=first_cut,
            keep_key=keep_key if single else None,
        )
        solved = GroupBound(
            node, group, times.from_now(time.perf_counter()), options, known if single else None, plan
        ).solve()
        if solved is None:
            continue
        bound, result, witness, info = solved
        upper = max(upper, bound)
        statuses.append(result.status)
        if witness is not None and (best is None or witness.confidence > best.confidence):
            best = witness
        stats["solves"].append(
            {"targets": group, **result.to_json(), **info, "root_seconds": result.stats.get("root_seconds")}
        )
    return combine_outcome(upper, statuses, best, stats, times.start)


def _tighter(outcome: NodeOutcome, split: SplitResult | None, cls: int) -> NodeOutcome:
    """`outcome` with the splitting tier's bound where that is smaller (both are sound) and its
    leak where that is higher (`with_leak`: a leak above the solver's bound drops that bound)."""
    if split is None:
        return outcome
    outcome = with_leak(outcome, split.witness, cls)
    if not split.bound < outcome.upper:
        return outcome
    if outcome.lower is not None and outcome.lower > split.bound:
        log.error(
            "UNSOUND: the ReLU-splitting bound %.9g of class %d is below a replayed witness %.9g; ignoring it",
            split.bound,
            cls,
            outcome.lower,
        )
        return outcome
    return dataclasses.replace(outcome, upper=split.bound)


def _split_singleton(node: _Node, limits: SplitLimits, stats: dict) -> SplitResult:
    """The splitting branch and bound of a singleton before its MILP: of the input box for a network
    with few inputs (`lucid.bounds.input_split`), else of its ReLUs (`lucid.bounds.relu_split`), with
    the LP of the network's MILP as the second opinion on stalled domains (`lucid.analysis.domain_lp`);
    `settings.split_space` chooses. limits.extend: seconds the ReLU split may go on when its time
    runs out all but done (`lucid.bounds.relu_split.EXTEND_EXCESS`)."""
    t0 = time.perf_counter()
    problem, cls, position, cutoff = node.problem, node.cls, int(node.positions[0]), node.request.cutoff
    settings = node.settings
    space = split_space_for(settings.split_space, problem.stack.input_dim, sum(problem.stack.layer_sizes[1:-1]))
    lps = None
    options = SplitOptions(device=settings.device, search=settings.search)
    if space == "input":
        from lucid.bounds.input_split import input_split_singleton  # imports torch: only when the tier runs

        res = input_split_singleton(problem, cls, position, cutoff, limits, options)
    else:
        from lucid.bounds.relu_split import split_singleton

        lp = DomainLp(problem, cls, position, node.encoding)
        res = split_singleton(problem, cls, position, cutoff, limits, options, domain_bound=lp.bound)
        lps = lp.solved
    stats["split"] = {
        "space": space,
        "upper": encode_float(res.bound),
        "proved": res.proved,
        "gave_up": res.gave_up,
        "domains": res.domains,
        "seconds": res.seconds,
        "wall_seconds": time.perf_counter() - t0,
        "domain_lps": lps,
        "lower": None if res.witness is None else res.witness.confidence,
    }
    return res


def _continue_kept(node: _Node, kept: KeptTree, options: SolverOptions, t0: float) -> NodeOutcome:
    """The node's retry: its kept MILP runs on from where its last time limit stopped it."""
    info = dict(kept.info, resumed=True)
    context = SolveContext(node.problem, node.cls, node.positions, node.settings.solver)
    bound, result, witness, info = final_solve(
        context, FinalMilp(kept.model, kept.level, kept.bound, kept.witness), options, info, kept.key, tree=kept.tree
    )
    stats: dict = {
        "networks": int(node.positions.size),
        "solves": [{**result.to_json(), **info, "root_seconds": result.stats.get("root_seconds")}],
    }
    if "tree_seconds" in result.stats:
        stats["tree_seconds"] = result.stats["tree_seconds"]
    return combine_outcome(bound, [result.status], witness, stats, t0)
