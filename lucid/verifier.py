"""The node-analysis API: a sound upper bound (and a replayed lower bound) on beta*_{c,S}.

beta*_{c,S} = max beta  s.t.  exists x in the domain with C_N^c(x) >= beta and C_{N#_S}^c(x) <= 0,
C^c(x) = score_c - max_{c' != c} score_c'. `analyse_node` encodes Eq. 3 for the hyper-network
of S, solves it, adds the floating-point safety margin to the solver's dual bound, and replays
the solver's witness with the concrete networks to get a true lower bound. `screen_upper_bounds`
bounds every singleton at once by bound propagation, so most nodes never reach a solver.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lucid.bounds.difference import DifferenceBounds, difference_bounds
from lucid.bounds.interval import FP_REL, LayerBounds, interval_bounds
from lucid.node.encode import EncodingOptions
from lucid.node.encode import encode_idp, possible_targets
from lucid.milp.model import MilpModel
from lucid.errors import LucidError, UnsoundSolverResult
from lucid.hyper import HyperNetwork, hyper_network
from lucid.kept_trees import KEPT, KeptTree
from lucid.network import NetworkStack
from lucid.replay import LeakWitness, find_leak, search_node_witness
from lucid.settings import BOUND_METHODS, VerifySettings
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions

log = logging.getLogger(__name__)

# Safety margin added to every solver dual bound (see `safety_margin`).
MARGIN_ABS = 1e-6
MARGIN_REL = 1e-6
MARGIN_FEAS = 1e-7  # times the largest big-M constant of the model


def safety_margin(bound: float, model: MilpModel) -> float:
    """What the user-visible bound adds to a solver's dual bound, and why it suffices.

    The dual bound comes from LPs solved in floating point with primal/dual feasibility
    tolerances of ~1e-7 (HiGHS, Gurobi, SCIP defaults on our scaled models). A violation of
    size eps in a big-M row lets a neuron move by eps, and a neuron moves the objective by at
    most its (bounded) weight path, so the error is of order eps * (largest big-M); the
    absolute and relative terms cover rounding of the objective itself. The margin only ever
    loosens the bound (it is a few 1e-6 on bounds of order 1e-3..1).
    """
    finite = np.concatenate([model.col_lower, model.col_upper])
    finite = finite[np.isfinite(finite)]
    big_m = float(np.abs(finite).max()) if finite.size else 0.0
    return MARGIN_ABS + MARGIN_REL * abs(bound) + MARGIN_FEAS * big_m


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
    def from_stack(cls, stack: NetworkStack, lower: np.ndarray, upper: np.ndarray, bounds: str = "lp") -> "VerificationProblem":
        lower, upper = _check_domain(stack, lower, upper)
        n_bounds, margin = compute_n_bounds(stack, lower, upper, bounds)
        return cls(stack, lower, upper, n_bounds, margin, bounds)

    @classmethod
    def from_run(cls, run, bounds: str = "lp", with_points: bool = False) -> "VerificationProblem":
        """Load the run's networks and N's bounds (cached in RUN/cache/, keyed by content);
        `with_points`: also the training inputs, for the witness search."""
        points = None
        if with_points:
            try:
                points = run.data().get("X_train")
            except LucidError:
                points = None  # the search then samples the domain only
        stack = run.networks()
        lower, upper = _check_domain(stack, *run.domain)
        key = _cache_key(stack, lower, upper, bounds)
        path = Path(run.cache_dir) / f"n-bounds-{bounds}-{key}.npz"
        L = len(stack.weights)
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
                return cls(stack, lower, upper, LayerBounds.from_arrays(arrays, L), arrays["margin_upper"], bounds, points)
            except Exception:  # a corrupt cache is recomputed, never trusted
                log.warning("ignoring unreadable cache file %s", path)
        n_bounds, margin = compute_n_bounds(stack, lower, upper, bounds)
        try:
            from lucid.atomic import write_atomic

            def write(tmp: str) -> None:
                with open(tmp, "wb") as fh:
                    np.savez(fh, margin_upper=margin, **n_bounds.to_arrays())

            write_atomic(path, write)
        except OSError as exc:
            log.warning("cannot cache N's bounds in %s: %s", path, exc)
        return cls(stack, lower, upper, n_bounds, margin, bounds, points)


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


def compute_n_bounds(stack: NetworkStack, lower: np.ndarray, upper: np.ndarray, method: str = "lp") -> tuple[LayerBounds, np.ndarray]:
    """N's pre-activation bounds and the [C, C] margin bounds by `method` ("interval" | "lp")."""
    if method not in BOUND_METHODS:
        raise LucidError(f"unknown bound method {method!r}; valid: {', '.join(BOUND_METHODS)}")
    w = [x[0] for x in stack.weights]
    b = [x[0] for x in stack.biases]
    if method == "interval":
        nb = interval_bounds(w, b, lower, upper)
        margin = nb.upper[-1][:, None] - nb.lower[-1][None, :]
        margin = margin + FP_REL * (np.abs(nb.upper[-1][:, None]) + np.abs(nb.lower[-1][None, :]))
        np.fill_diagonal(margin, 0.0)
        return nb, margin
    from lucid.bounds.lp import lp_bounds, lp_margin_upper

    nb = lp_bounds(w, b, lower, upper)
    return nb, lp_margin_upper(w, b, lower, upper, nb)


@dataclass
class NodeOutcome:
    upper: float  # sound upper bound on beta*_{c,S} (-inf: no input can leak)
    lower: float | None  # N's confidence at a replayed, truly leaking witness
    witness: np.ndarray | None
    leaking_row: int | None
    status: str
    seconds: float
    stats: dict = field(default_factory=dict)


def node_difference_bounds(problem: VerificationProblem, hyper: HyperNetwork) -> DifferenceBounds:
    return difference_bounds(
        problem.n_weights, problem.n_biases, hyper.w_lo, hyper.w_hi, hyper.b_lo, hyper.b_hi,
        problem.n_bounds, problem.lower, problem.upper,
    )


def _fallback_solvers(solver: str) -> list[str]:
    from lucid.solvers import available_solvers

    avail = available_solvers()
    order = [s for s in ("scip", "gurobi", "highs") if s != solver and avail.get(s)]
    return order


def _solve_checked(model: MilpModel, solver: str, options: SolverOptions, keep: bool = False,
                   tree: object | None = None) -> SolveResult:
    """Solve (or continue the kept `tree` of this model); a result the solver layer proves unsound
    is retried from scratch with other backends."""
    from lucid.solvers import resume, solve

    try:
        return resume(tree, options) if tree is not None else solve(model, solver, options, keep=keep)
    except UnsoundSolverResult as exc:
        log.error("UNSOUND solver result, falling back: %s", exc)
    for other in _fallback_solvers(solver):
        try:
            return solve(model, other, options)
        except UnsoundSolverResult as exc:
            log.error("UNSOUND solver result from fallback %s: %s", other, exc)
        except Exception as exc:  # e.g. licence too small: try the next one
            log.warning("fallback solver %s failed: %s", other, exc)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="every solver was unsound")


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
    process, and the next retry of the same node continues it (`lucid.kept_trees`)."""
    t0 = time.perf_counter()
    settings = settings or VerifySettings()
    solver = settings.solver
    encoding = encoding or settings.encoding_options()
    solver_options = solver_options or settings.solver_options(None)
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0 or positions.min() < 1 or positions.max() >= len(problem.stack):
        raise ValueError(f"positions must index leave-one-out networks 1..{len(problem.stack) - 1}")
    # A singleton's retries keep their time-limited MILP (lucid.kept_trees); the next retry continues it.
    keep_key = (int(cls), tuple(int(p) for p in positions)) if keep_trees and positions.size == 1 and attempt > 1 else None
    if keep_key is not None:
        kept = KEPT.take(problem, keep_key)
        if kept is not None and kept.level >= _slack(cutoff):
            return _continue_kept(problem, kept, cls, positions, solver, solver_options, t0)
        if kept is not None:  # the cutoff rose since: that model answers a weaker question
            kept.release()
    hyper = hyper_network(problem.stack, positions)
    diff = node_difference_bounds(problem, hyper)
    targets = possible_targets(cls, diff.hyper)
    stats: dict = {"networks": int(positions.size), "bounds_seconds": time.perf_counter() - t0, "targets": targets}
    if not targets:
        return NodeOutcome(-math.inf, None, None, None, INFEASIBLE, time.perf_counter() - t0, stats)
    groups = [[t] for t in targets] if (encoding.disjunction == "split" and len(targets) > 1) else [targets]
    known = None
    # Under a cutoff a solver-free leak only matters if it beats the class's best leak: on the
    # Adult run the root's search (over 1517 networks) did, the searches of 1018 singletons never
    # did. So a singleton's first attempt skips it; retries (the top-ranked networks, where such a
    # leak may exist) search again.
    first_cut = math.isfinite(cutoff) and attempt <= 1 and positions.size == 1
    if encoding.search and not first_cut:
        t_search = time.perf_counter()
        known = search_node_witness(problem.stack, positions, cls, problem.lower, problem.upper)
        stats["search_seconds"] = time.perf_counter() - t_search
        stats["search_lower"] = None if known is None else known.confidence

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
    return _outcome(upper, statuses, best, stats, t0)


def _outcome(upper: float, statuses: list[str], best: LeakWitness | None, stats: dict, t0: float) -> NodeOutcome:
    if not statuses:
        return NodeOutcome(-math.inf, None, None, None, INFEASIBLE, time.perf_counter() - t0, stats)
    status = ERROR if ERROR in statuses else TIME_LIMIT if TIME_LIMIT in statuses else OPTIMAL if OPTIMAL in statuses else INFEASIBLE
    if best is not None and best.confidence > upper:
        # every retry failed to produce a consistent bound: claim nothing for this node
        upper, status = math.inf, ERROR
    for key in ("binaries", "relaxed", "binaries_n", "binaries_hyper", "md_rows"):
        stats[key] = sum(s.get(key, 0) for s in stats["solves"])
    if any(s.get("kept") for s in stats["solves"]):
        stats["kept"] = True  # the executor sends the node's next retry to this worker
    return NodeOutcome(
        upper=upper,
        lower=None if best is None else best.confidence,
        witness=None if best is None else best.x,
        leaking_row=None if best is None else best.leaking_row,
        status=status,
        seconds=time.perf_counter() - t0,
        stats=stats,
    )


def _encode(problem: VerificationProblem, hyper: HyperNetwork, cls: int, group: list[int], encoding: EncodingOptions,
            n_bounds: LayerBounds, diff: DifferenceBounds, relax_all: bool = False, beta_lower: float = -math.inf):
    return encode_idp(
        problem.n_weights, problem.n_biases, n_bounds, hyper, diff, problem.lower, problem.upper, cls, encoding,
        targets=group, margin_upper=problem.margin_upper, relax_all=relax_all, beta_lower=beta_lower,
    )


def _user_bound(result: SolveResult, model: MilpModel) -> float:
    """The solver's dual bound plus the safety margin; +inf when the solve proved nothing."""
    if result.status == ERROR:
        return math.inf
    ub = result.upper_bound
    return ub + safety_margin(ub, model) if math.isfinite(ub) else ub


def _solve_once(problem, model: MilpModel, cls: int, solver: str, opts: SolverOptions, positions: np.ndarray,
                known: LeakWitness | None = None, floor: float = -math.inf, keep: bool = False,
                tree: object | None = None):
    """Solve, add the safety margin, replay the witness; a bound below the replayed witness or a
    `known` one (HiGHS once fell 1.3e-5 below a searched witness after root cuts, with no
    incumbent of its own) is a solver failure and the model goes to another backend.
    `floor`: the model only has the points with beta >= floor, so its bound is max(dual, floor).
    `keep` / `tree`: ask for a continuable result / continue a kept one (`lucid.kept_trees`)."""
    result = _solve_checked(model, solver, opts, keep=keep, tree=tree)
    bound = max(_user_bound(result, model), floor)
    witness = None
    if result.solution is not None:
        witness = find_leak(problem.stack, positions, model.witness_input(result.solution), cls, problem.lower, problem.upper)
    strongest = max((w for w in (witness, known) if w is not None), key=lambda w: w.confidence, default=None)
    if strongest is not None and strongest.confidence > bound:
        log.error(
            "UNSOUND: %s proved %.9g for class %d but a replayed witness reaches %.9g; retrying with other solvers",
            result.solver, bound, cls, strongest.confidence,
        )
        if result.tree is not None:
            result.tree.release()
        result = _retry_other(model, solver, opts, strongest)
        bound = max(_user_bound(result, model), floor)
    return bound, result, witness


def _json_num(v: float) -> float | str:
    v = float(v)
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


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
    the whole time limit, with no tightening after it: on 16 Adult 2x50 singletons ranked 0-900
    the first attempts took 267 s where search + probe + tightening + MILP took 408 s; the few
    hardest singletons need tightening and get it on their retry
    (benchmarks/results/idle_machine.md, session 6).
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
        return _slack(max(lb, cutoff))

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
            info["probe_bound"] = _json_num(bound)
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
            info["obbt_output_bound"] = _json_num(out_bound)
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
    if witness is not None and best_bound < witness.confidence:
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
    return _outcome(bound, [result.status], witness, stats, t0)


def _empty(witness: LeakWitness | None, info: dict):
    """The encoder found no target class N# can reach: the node cannot leak at all."""
    if witness is not None:
        log.error("UNSOUND: the encoder found no target class although a witness replays")
        return math.inf, SolveResult(status=ERROR, upper_bound=math.inf, solver="encoder"), witness, info
    return None


def _relaxation_witness(problem, hyper, cls, group, encoding, n_b, df, lb: float, positions,
                        time_limit: float = 5.0) -> LeakWitness | None:
    """A leak found by climbing from the optimum of the node's LP relaxation.

    The relaxation's maximiser of beta is a cheap, well-aimed start: on a Crypto 2x50 singleton
    the climb from it reached 0.00240 (exact 0.00261) where random starts stopped at 0.00195,
    and a better LB prunes the MILP's tree (beta >= LB) and tightens OBBT."""
    from dataclasses import replace

    from lucid.replay import climb
    from lucid.solvers import solve

    model = _encode(problem, hyper, cls, group, encoding, n_b, df, relax_all=True, beta_lower=_slack(lb))
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


def _slack(lb: float) -> float:
    """LB loosened so that solver tolerances never turn beta >= LB into a false infeasibility.

    The relative part keeps the slab beta in [LB - slack, beta*] from being numerically thin:
    HiGHS once cut a slab 1.3e-5 thick away at the root (see `_solve_once`)."""
    return lb - 1e-5 * (1 + abs(lb)) - 1e-2 * abs(lb) if math.isfinite(lb) else -math.inf


def _model_info(model: MilpModel) -> dict:
    return {"cols": model.num_cols, "rows": model.num_rows,
            **{k: v for k, v in model.meta.items() if k != "targets" and not k.startswith("_")}}


def _retry_other(model: MilpModel, solver: str, options: SolverOptions, witness: LeakWitness) -> SolveResult:
    from lucid.solvers import solve

    for other in _fallback_solvers(solver):
        try:
            result = solve(model, other, options)
        except Exception as exc:
            log.warning("fallback solver %s failed: %s", other, exc)
            continue
        if _user_bound(result, model) >= witness.confidence:
            return result
        log.error("fallback solver %s is also below the replayed witness", other)
    return SolveResult(status=ERROR, upper_bound=math.inf, solver=solver, message="bound below a replayed witness")


def screen_upper_bounds(problem: VerificationProblem, cls: int, positions: np.ndarray, chunk: int = 128) -> np.ndarray:
    """Cheap sound upper bounds on beta*_{cls,{i}} for each single network (bound propagation).

    If N' prefers t over c somewhere, then beta <= s_c - s_t = (s#_c - s#_t) + (d_t - d_c)
    <= du_t - dl_c with d = s# - s, and also beta <= max(s_c - s_t) over the domain; a class t
    that N' can never rank above c contributes nothing, and no such t at all means -inf.
    """
    positions = np.asarray(positions, dtype=np.int64)
    out = np.empty(len(positions))
    C = problem.num_classes
    others = [t for t in range(C) if t != cls]
    for start in range(0, len(positions), chunk):
        pos = positions[start : start + chunk]
        ws = [w[pos] for w in problem.stack.weights]
        bs = [b[pos] for b in problem.stack.biases]
        diff = difference_bounds(problem.n_weights, problem.n_biases, ws, ws, bs, bs, problem.n_bounds, problem.lower, problem.upper)
        dl, du = diff.pre.lower[-1], diff.pre.upper[-1]  # [k, C]
        hl, hu = diff.hyper.lower[-1], diff.hyper.upper[-1]
        best = np.full(len(pos), -np.inf)
        for t in others:
            feasible = hu[:, t] - hl[:, cls] >= 0
            via_diff = du[:, t] - dl[:, cls]
            via_diff = via_diff + FP_REL * (np.abs(du[:, t]) + np.abs(dl[:, cls])) + 1e-300
            cand = np.minimum(via_diff, problem.margin_upper[cls, t])
            best = np.where(feasible, np.maximum(best, cand), best)
        out[start : start + len(pos)] = best
    return out
