"""The node-analysis API: a sound upper bound (and a replayed lower bound) on beta*_{c,S}.

beta*_{c,S} = max beta  s.t.  exists x in the domain with C_N^c(x) >= beta and C_{N#_S}^c(x) <= 0,
C^c(x) = score_c - max_{c' != c} score_c'. `analyse_node` encodes Eq. 3 for the hyper-network
of S, solves it, adds the floating-point safety margin to the solver's dual bound, and replays
the solver's witness with the concrete networks to get a true lower bound. The soundness rules it applies live in
`lucid.node.soundness`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.interval import FP_REL, LayerBounds
from lucid.hyper import HyperNetwork, hyper_network
from lucid.milp.model import MilpModel
from lucid.node.encode import EncodingOptions, encode_idp, possible_targets
from lucid.node.kept_trees import KEPT, KeptTree
from lucid.node.outcome import NodeOutcome, combine_outcome, with_leak
from lucid.node.problem import VerificationProblem, node_difference_bounds
from lucid.node.soundness import contradicts, retry_other, slack, solve_checked, user_bound
from lucid.witness.replay import LeakWitness, find_leak
from lucid.witness.search import search_node_witness
from lucid.rundir import encode_float
from lucid.settings import VerifySettings
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions

log = logging.getLogger(__name__)


def analyse_node(
    problem: VerificationProblem,
    cls: int,
    positions: np.ndarray,
    *,
    settings: VerifySettings | None = None,
    solver_options: SolverOptions | None = None,
    encoding: EncodingOptions | None = None,
    cutoff: float = -math.inf,
    attempt: int = 1,
    keep_trees: bool = False,
) -> NodeOutcome:
    """Sound bounds on beta*_{cls,S} for the networks S at `positions` (>= 1) of the stack.

    `settings`: the verification's options (solver, encoder switches, search); `solver_options`:
    this solve's time limit and threads; `encoding` overrides `settings.encoding_options()` for
    ablation experiments that switch the encoder's parts one by one.

    `cutoff`: the caller only needs to know whether beta*_{cls,S} exceeds this level (the
    class's best replayed leak, plus the gap it tolerates). The MILP is then restricted to
    beta >= cutoff (minus a slack), which proves most nodes below it at the root; such a node
    is returned INFEASIBLE with `upper` = the slackened cutoff, still a sound bound on
    beta*_{cls,S}. Without it the bound is as tight as the solver gets it.

    `attempt`: how often the caller has asked for this node (1 = first). Under a cutoff the first
    attempt is a plain bound-focused MILP (see `_solve_group`); later ones add bound tightening.

    `keep_trees`: a singleton retry that stops at its time limit keeps its solver tree in this
    process, and the next retry of the same node continues it (`lucid.node.kept_trees`)."""
    t0 = time.perf_counter()
    settings = settings or VerifySettings()
    solver = settings.solver
    encoding = encoding or settings.encoding_options()
    solver_options = solver_options or settings.solver_options(None)
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0 or positions.min() < 1 or positions.max() >= len(problem.stack):
        raise ValueError(f"positions must index leave-one-out networks 1..{len(problem.stack) - 1}")
    # A singleton's retries keep their time-limited MILP (lucid.node.kept_trees); the next retry continues it.
    keep_key = (int(cls), tuple(int(p) for p in positions)) if keep_trees and positions.size == 1 and attempt > 1 else None
    # A singleton under a cutoff first gets the ReLU-splitting branch and bound (every attempt, with
    # a budget growing like the node limit): it proves most networks without any MILP.
    split, split_stats = None, {}
    if positions.size == 1 and math.isfinite(cutoff) and settings.split_time > 0 and not settings.naive:
        budget = settings.split_budget(attempt, solver_options.time_limit)
        split = _split_singleton(problem, cls, int(positions[0]), cutoff, budget, settings.device, encoding, split_stats)
        if split.proved:  # every domain is below the cutoff: no MILP needed
            kept = KEPT.take(problem, keep_key) if keep_key is not None else None
            if kept is not None:
                kept.release()
            return NodeOutcome(split.bound, None, None, None, INFEASIBLE, time.perf_counter() - t0,
                               {"networks": 1, **split_stats})
        # The MILP gets as long as the split had, not the rest of the node's limit: an unproved node
        # comes back sooner (retried with both budgets grown) instead of holding its worker while
        # easier networks wait (Adult 2x50: a 60-s split, then a 390-s MILP that ended unproved too).
        # A split that gave up early leaves the MILP the rest of its budget too.
        if solver_options.time_limit is not None:
            solver_options = SolverOptions(**vars(solver_options))
            solver_options.time_limit = max(time.perf_counter() - t0, budget) + budget
    if keep_key is not None:
        kept = KEPT.take(problem, keep_key)
        if kept is not None and kept.level >= slack(cutoff):
            out = _continue_kept(problem, kept, cls, positions, solver, solver_options, t0)
            out.stats.update(split_stats)
            return _tighter(out, split, cls)
        if kept is not None:  # the cutoff rose since: that model answers a weaker question
            kept.release()
    hyper = hyper_network(problem.stack, positions)
    diff = node_difference_bounds(problem, hyper, positions if encoding.symbolic else None)
    targets = possible_targets(cls, diff.hyper)
    stats: dict = {"networks": int(positions.size), "bounds_seconds": time.perf_counter() - t0, "targets": targets,
                   **split_stats}
    if not targets:
        return NodeOutcome(-math.inf, None, None, None, INFEASIBLE, time.perf_counter() - t0, stats)
    groups = [[t] for t in targets] if (encoding.disjunction == "split" and len(targets) > 1) else [targets]
    known = None
    # Under a cutoff a solver-free leak only matters if it beats the class's best leak, which a
    # search over a large set (the root's) can do but one over a single low-ranked network
    # practically never does. So a singleton's first attempt skips it; retries (the top-ranked
    # networks, where such a leak may exist) search again.
    first_cut = math.isfinite(cutoff) and attempt <= 1 and positions.size == 1
    if encoding.search and not first_cut:
        t_search = time.perf_counter()
        known = search_node_witness(problem.stack, positions, cls, problem.lower, problem.upper)
        stats["search_seconds"] = time.perf_counter() - t_search
        stats["search_lower"] = None if known is None else known.confidence
    if split is not None and split.witness is not None and (known is None or split.witness.confidence > known.confidence):
        known = split.witness  # the MILP then only has to look above it

    upper, statuses, best = -math.inf, [], None
    deadline = None if solver_options.time_limit is None else t0 + solver_options.time_limit
    stats["solves"] = []
    for group in groups:
        opts = SolverOptions(**vars(solver_options))
        if deadline is not None:
            opts.time_limit = max(deadline - time.perf_counter(), 0.1)
        # a witness found for all targets may not leak towards this group's targets
        usable = known if known is not None and len(groups) == 1 else None
        solved = _solve_group(problem, hyper, diff, cls, group, encoding, solver, opts, positions, usable,
                              search=encoding.search and len(groups) == 1 and not first_cut, cutoff=cutoff,
                              plain=first_cut, keep_key=keep_key if len(groups) == 1 else None)
        if solved is None:
            continue
        bound, result, witness, info = solved
        upper = max(upper, bound)
        statuses.append(result.status)
        if witness is not None and (best is None or witness.confidence > best.confidence):
            best = witness
        stats["solves"].append({"targets": group, **result.to_json(), **info})
    return _tighter(combine_outcome(upper, statuses, best, stats, t0), split, cls)


def _tighter(outcome: NodeOutcome, split, cls: int) -> NodeOutcome:
    """`outcome` with the splitting tier's bound where that is smaller (both are sound) and its
    leak where that is higher (`with_leak`: a leak above the solver's bound drops that bound)."""
    if split is None:
        return outcome
    outcome = with_leak(outcome, split.witness, cls)
    if not split.bound < outcome.upper:
        return outcome
    if outcome.lower is not None and outcome.lower > split.bound:
        log.error("UNSOUND: the ReLU-splitting bound %.9g of class %d is below a replayed witness %.9g; ignoring it",
                  split.bound, cls, outcome.lower)
        return outcome
    return dataclasses.replace(outcome, upper=split.bound)


def _split_singleton(problem: VerificationProblem, cls: int, position: int, cutoff: float, budget: float,
                     device: str, encoding: EncodingOptions, stats: dict):
    """The ReLU-splitting branch and bound of one network before its MILP (`lucid.bounds.relu_split`),
    with the LP of the network's MILP as the second opinion on stalled domains (`lucid.node.domain_lp`)."""
    from lucid.bounds.relu_split import split_singleton
    from lucid.node.domain_lp import DomainLp

    lp = DomainLp(problem, cls, position, encoding)
    res = split_singleton(problem, cls, position, cutoff, time_limit=budget, device=device, domain_bound=lp.bound)
    stats["split"] = {"upper": encode_float(res.bound), "proved": res.proved, "gave_up": res.gave_up, "domains": res.domains,
                      "seconds": res.seconds, "domain_lps": lp.solved,
                      "lower": None if res.witness is None else res.witness.confidence}
    return res

def _encode(problem: VerificationProblem, hyper: HyperNetwork, cls: int, group: list[int], encoding: EncodingOptions,
            n_bounds: LayerBounds, diff: DifferenceBounds, relax_all: bool = False, beta_lower: float = -math.inf):
    return encode_idp(
        problem.n_weights, problem.n_biases, n_bounds, hyper, diff, problem.lower, problem.upper, cls, encoding,
        targets=group, margin_upper=problem.margin_upper, relax_all=relax_all, beta_lower=beta_lower,
    )

def _solve_once(problem, model: MilpModel, cls: int, solver: str, opts: SolverOptions, positions: np.ndarray,
                known: LeakWitness | None = None, floor: float = -math.inf, keep: bool = False,
                tree: object | None = None):
    """Solve, add the safety margin, replay the witness; a bound below the replayed witness or a
    `known` one (HiGHS once fell 1.3e-5 below a searched witness after root cuts, with no
    incumbent of its own) is a solver failure and the model goes to another backend.
    `floor`: the model only has the points with beta >= floor, so its bound is max(dual, floor).
    `keep` / `tree`: ask for a continuable result / continue a kept one (`lucid.node.kept_trees`)."""
    result = solve_checked(model, solver, opts, keep=keep, tree=tree)
    bound = max(user_bound(result, model), floor)
    witness = None
    if result.solution is not None and len(positions):  # a box verification may have no networks to replay on
        witness = find_leak(problem.stack, positions, model.witness_input(result.solution), cls, problem.lower, problem.upper)
    strongest = max((w for w in (witness, known) if w is not None), key=lambda w: w.confidence, default=None)
    if contradicts(bound, strongest):
        log.error(
            "UNSOUND: %s proved %.9g for class %d but a replayed witness reaches %.9g; retrying with other solvers",
            result.solver, bound, cls, strongest.confidence,
        )
        if result.tree is not None:
            result.tree.release()
        result = retry_other(model, solver, opts, strongest)
        bound = max(user_bound(result, model), floor)
    return bound, result, witness

def _solve_group(problem, hyper, diff, cls, group, encoding: EncodingOptions, solver, opts: SolverOptions, positions,
                 known: LeakWitness | None = None, search: bool = False, cutoff: float = -math.inf,
                 plain: bool = False, keep_key: tuple | None = None):
    """Bound the node for the targets `group`, using a known replayed witness when there is one.

    A known witness gives a true lower bound LB, so the MILP may be restricted to beta >= LB
    (minus a slack, so solver tolerances can never make it look infeasible) without changing
    its optimum. With `encoding.obbt` the node's bounds are first tightened over its LP
    relaxation restricted the same way (a short probe solve supplies LB when none is known),
    and the tightened output-difference interval is itself a bound: beta <= s_c - s_t <=
    du_t - dl_c when N# prefers t. Every bound computed is sound, so the smallest is reported.

    A `cutoff` above the witness raises that restriction to beta >= cutoff (slackened): every
    model then only describes the points above it, so "infeasible" or a dual bound d means
    beta* <= max(d, floor) with floor the slackened level — never -inf while a floor applies.
    Such a model is first tried briefly without tightening: below the cutoff most singletons are
    proved at the root in well under a second, while tightening costs seconds per node.
    `plain` (a singleton's first attempt under a cutoff) makes that try a bound-focused MILP for
    the whole time limit, with no tightening after it: most singletons are proved by the plain
    MILP faster than tightening alone would take, so tightening is spent only on the few hardest
    singletons, which get it on their retry (figures in benchmarks/results/idle_machine.md).
    """
    t_start = time.perf_counter()
    info: dict = {}
    witness = known
    lb = witness.confidence if witness is not None else -math.inf
    bound = math.inf
    result = None
    n_b, df = problem.n_bounds, diff
    if math.isfinite(cutoff):
        info["cutoff"] = float(cutoff)

    def level() -> float:
        """The beta floor every model of this node is restricted to (slackened, so sound)."""
        return slack(max(lb, cutoff))

    def climb_from_relaxation(n_b: LayerBounds, df: DifferenceBounds) -> None:
        nonlocal witness, lb
        cap = 5.0 if opts.time_limit is None else min(5.0, 0.05 * opts.time_limit)
        found = _relaxation_witness(problem, hyper, cls, group, encoding, n_b, df, max(lb, cutoff), positions, cap)
        if found is not None and (witness is None or found.confidence > witness.confidence):
            witness, lb = found, found.confidence
            info["relaxation_lower"] = found.confidence

    if search:
        climb_from_relaxation(n_b, df)
    if encoding.obbt is True or (encoding.obbt == "singletons" and hyper.exact):
        from lucid.bounds.obbt import tighten_node_bounds

        if witness is None or cutoff > lb:
            probe_model = _encode(problem, hyper, cls, group, encoding, n_b, df, beta_lower=level())
            if probe_model is None:
                return _empty(witness, info)
            first = SolverOptions(**vars(opts))
            if plain:  # no search ran, so nothing above the cutoff is known: only the dual bound counts
                first.focus = "bound"
                info["plain"] = True
            else:
                first.time_limit = encoding.obbt_probe if opts.time_limit is None else min(encoding.obbt_probe, opts.time_limit / 4)
            bound, result, found = _solve_once(problem, probe_model, cls, solver, first, positions, known=witness,
                                               floor=level())
            if found is not None and (witness is None or found.confidence > witness.confidence):
                witness = found
            info["probe_bound"] = encode_float(bound)
            if result.status in (OPTIMAL, INFEASIBLE) or plain:
                info.update(_model_info(probe_model))
                result.upper_bound = bound
                return bound, result, witness, info
            lb = witness.confidence if witness is not None else -math.inf
        t_obbt = time.perf_counter()
        tightened = tighten_node_bounds(
            lambda nb, d: _encode(problem, hyper, cls, group, encoding, nb, d, relax_all=True, beta_lower=level()),
            n_b, df,
            deadline=None if opts.time_limit is None else t_start + opts.time_limit * encoding.obbt_share,
            hyper_lp=not hyper.exact,
        )
        info["obbt_seconds"] = time.perf_counter() - t_obbt
        if tightened is None:  # empty relaxation: nothing above level(); impossible if a witness is
            if witness is None or witness.confidence < level():
                return level(), SolveResult(status=INFEASIBLE, upper_bound=level(), solver="obbt"), witness, info
            log.error("UNSOUND: bound tightening found no point although a witness replays; ignoring it")
        else:
            n_b, df = tightened
            if search:
                climb_from_relaxation(n_b, df)
            out_bound = max(df.pre.upper[-1][t] - df.pre.lower[-1][cls] for t in group)
            out_bound += FP_REL * 4 * (1 + abs(out_bound))
            info["obbt_output_bound"] = encode_float(out_bound)
            bound = min(bound, max(out_bound, level()))  # valid only above the relaxation's floor
    t_enc = time.perf_counter()
    model = _encode(problem, hyper, cls, group, encoding, n_b, df, beta_lower=level())
    info["encode_seconds"] = time.perf_counter() - t_enc
    if model is None:
        return _empty(witness, info)
    info.update(_model_info(model))
    rest = SolverOptions(**vars(opts))
    if witness is not None and witness.confidence >= cutoff:
        rest.focus = "bound"  # the lower bound is the witness's: spend the time on the dual bound
    if opts.time_limit is not None:
        rest.time_limit = max(opts.time_limit - (time.perf_counter() - t_start), 0.1)
    if keep_key is not None:
        info["targets"] = list(group)
    return _final_solve(problem, model, cls, solver, rest, positions, witness, bound, level(), info, keep_key)

def _final_solve(problem, model: MilpModel, cls: int, solver: str, opts: SolverOptions, positions: np.ndarray,
                 witness: LeakWitness | None, bound: float, level: float, info: dict, keep_key: tuple | None,
                 tree: object | None = None):
    """The node's last MILP (or the continuation of its kept `tree`); with `keep_key` a time-limited
    one is kept in this process for the node's next retry."""
    bound2, result2, witness2 = _solve_once(problem, model, cls, solver, opts, positions, known=witness,
                                            floor=level, keep=keep_key is not None, tree=tree)
    if witness2 is not None and (witness is None or witness2.confidence > witness.confidence):
        witness = witness2
    best_bound = min(bound, bound2)
    if contradicts(best_bound, witness):
        log.error("UNSOUND: bound %.9g is below a replayed witness %.9g; claiming nothing for this node", best_bound, witness.confidence)
        result2.status, best_bound = ERROR, math.inf
    result2.upper_bound = best_bound
    if result2.tree is not None:
        if keep_key is not None and result2.status == TIME_LIMIT:
            KEPT.put(KeptTree(problem, keep_key, result2.tree, model, level, bound, witness, dict(info)))
            info["kept"] = True
        else:
            result2.tree.release()
        result2.tree = None
    return best_bound, result2, witness, info

def _continue_kept(problem, kept: KeptTree, cls: int, positions: np.ndarray, solver: str, options: SolverOptions,
                   t0: float) -> NodeOutcome:
    """The node's retry: its kept MILP runs on from where its last time limit stopped it."""
    info = dict(kept.info, resumed=True)
    bound, result, witness, info = _final_solve(problem, kept.model, cls, solver, SolverOptions(**vars(options)),
                                                positions, kept.witness, kept.bound, kept.level, info, kept.key,
                                                tree=kept.tree)
    stats: dict = {"networks": int(positions.size), "solves": [{**result.to_json(), **info}]}
    if "tree_seconds" in result.stats:
        stats["tree_seconds"] = result.stats["tree_seconds"]
    return combine_outcome(bound, [result.status], witness, stats, t0)

def _empty(witness: LeakWitness | None, info: dict):
    """The encoder found no target class N# can reach: the node cannot leak at all."""
    if witness is not None:
        log.error("UNSOUND: the encoder found no target class although a witness replays")
        return math.inf, SolveResult(status=ERROR, upper_bound=math.inf, solver="encoder"), witness, info
    return None

def _relaxation_witness(problem, hyper, cls, group, encoding, n_b, df, lb: float, positions,
                        time_limit: float = 5.0) -> LeakWitness | None:
    """A leak found by climbing from the optimum of the node's LP relaxation.

    The relaxation's maximiser of beta is a cheap, well-aimed start: it lies where the
    relaxation, and usually the true problem, is largest, so the climb from it tends to end
    higher than climbs from random starts, and a better LB prunes the MILP's tree (beta >= LB)
    and tightens OBBT."""
    from dataclasses import replace

    from lucid.witness.replay import climb
    from lucid.solvers import solve

    model = _encode(problem, hyper, cls, group, encoding, n_b, df, relax_all=True, beta_lower=slack(lb))
    if model is None:
        return None
    relaxed = replace(model, integrality=np.zeros_like(model.integrality))
    try:
        result = solve(relaxed, "highs", SolverOptions(time_limit=time_limit))
    except Exception as exc:  # only a heuristic: never let it fail the node
        log.info("relaxation witness skipped: %s", exc)
        return None
    if result.solution is None:
        return None
    return climb(problem.stack, positions, model.witness_input(result.solution), cls, problem.lower, problem.upper)

def _model_info(model: MilpModel) -> dict:
    return {"cols": model.num_cols, "rows": model.num_rows,
            **{k: v for k, v in model.meta.items() if k != "targets" and not k.startswith("_")}}
