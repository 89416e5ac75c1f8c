"""A node's bound from its MILPs: per group of target classes, a probe, bound tightening and a final solve.

`NodeModels` holds what every model of one node shares; `GroupBound` bounds the node for one group
of target classes (`GroupPlan`: how). Every solve goes through `solve_once` (`SolveContext`: whose
solve it is), which adds the floating-point safety
margin, replays the solver's witness and sends a bound below a replayed witness to another backend
(`lucid.analysis.soundness`). How the group's time is divided among its solves: `lucid.analysis.time_shares`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

# solve and climb are looked up through their modules at call time, so a test can count them.
import lucid.solvers as solvers
import lucid.witness.replay as replay
from lucid.analysis.encode import EncoderInputs, encode_idp, possible_targets
from lucid.analysis.kept_trees import KEPT, KeptTree
from lucid.analysis.problem import VerificationProblem, node_difference_bounds
from lucid.analysis.soundness import contradicts, retry_other, slack, solve_checked, user_bound
from lucid.analysis.time_shares import NodeTimeShares
from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.interval import FP_REL, LayerBounds
from lucid.bounds.obbt import tighten_node_bounds
from lucid.hyper import HyperNetwork, hyper_network
from lucid.milp.model import MilpModel
from lucid.rundir import encode_float
from lucid.settings import EncodingOptions
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, KeptSolve, SolveResult, SolverOptions
from lucid.witness.replay import LeakWitness, find_leak

log = logging.getLogger(__name__)

# What one target group's solve returns: its bound, the solver's result, the best witness, its stats.
GroupResult = tuple[float, SolveResult, LeakWitness | None, dict]


@dataclass(frozen=True, eq=False)
class SolveContext:
    """Whose solve it is (eq=False: arrays): the problem and class, the networks a solver's witness
    is replayed on (none for a box verification), and the backend."""

    problem: VerificationProblem
    cls: int
    positions: np.ndarray
    solver: str


@dataclass(frozen=True, eq=False)
class FinalMilp:
    """A node's last MILP and what the node knew when it was built: the beta floor the model is
    restricted to (slackened), the other sound bounds of its attempt (OBBT's output interval) and
    the best replayed leak. A kept tree (`lucid.analysis.kept_trees`) stores the same."""

    model: MilpModel
    level: float
    bound: float
    witness: LeakWitness | None


@dataclass(frozen=True)
class GroupPlan:
    """How `GroupBound` bounds its group: `search` climbs from the LP relaxation's optimum for a
    leak; `plain` makes the first solve a bound-focused MILP for the whole time limit, with no
    tightening after it (a singleton's first attempt under a cutoff); with `keep_key` a final MILP
    stopped by its time limit is kept for the node's next attempt under that key."""

    search: bool
    plain: bool
    keep_key: tuple | None = None


@dataclass(frozen=True)
class NodeModels:
    """What every model of one node analysis shares: its networks' hyper-network and difference
    bounds, the class, the classes N# might pick instead, the cutoff, the encoder and the solver."""

    problem: VerificationProblem
    cls: int
    positions: np.ndarray
    hyper: HyperNetwork
    diff: DifferenceBounds
    targets: list[int]
    encoding: EncodingOptions
    solver: str
    cutoff: float

    @classmethod
    def build(
        cls,
        problem: VerificationProblem,
        c: int,
        positions: np.ndarray,
        encoding: EncodingOptions,
        solver: str,
        cutoff: float,
        deadline: float | None = None,
    ) -> NodeModels:
        """The node's shared pieces; the symbolic hull of its networks' difference bounds is given
        up at `deadline` (time.monotonic()), leaving the interval ones."""
        hyper = hyper_network(problem.stack, positions)
        diff = node_difference_bounds(problem, hyper, positions if encoding.symbolic else None, deadline)
        return cls(problem, c, positions, hyper, diff, possible_targets(c, diff.hyper), encoding, solver, cutoff)

    def encode(
        self,
        group: list[int],
        n_bounds: LayerBounds,
        diff: DifferenceBounds,
        *,
        relax_all: bool = False,
        beta_lower: float = -math.inf,
    ) -> MilpModel | None:
        """Eq. 3 for the targets `group` over the (tightened) bounds (None: N# can reach none of them)."""
        return encode_idp(
            EncoderInputs.for_node(self.problem, self.hyper, diff, n_bounds),
            self.cls,
            self.encoding,
            targets=group,
            relax_all=relax_all,
            beta_lower=beta_lower,
        )

    @property
    def context(self) -> SolveContext:
        return SolveContext(self.problem, self.cls, self.positions, self.solver)

    @property
    def tightens(self) -> bool:
        """Node bound tightening (OBBT) applies: always, or for exact (singleton) hyper-networks."""
        return self.encoding.obbt is True or (self.encoding.obbt == "singletons" and self.hyper.exact)


class GroupBound:
    """Bounds the node for the targets `group`, using a known replayed witness when there is one.

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

    def __init__(
        self,
        node: NodeModels,
        group: list[int],
        times: NodeTimeShares,
        options: SolverOptions,
        known: LeakWitness | None,
        plan: GroupPlan,
    ) -> None:
        self.node, self.group, self.times = node, group, times
        self.options = dataclasses.replace(options, time_limit=times.time_limit)
        self.witness = known  # the best replayed leak so far: the models are restricted above it
        self.search, self.plain, self.keep_key = plan.search, plan.plain, plan.keep_key
        self.bound = math.inf  # the smallest sound bound proved so far
        self.info: dict = {"cutoff": float(node.cutoff)} if math.isfinite(node.cutoff) else {}

    def solve(self) -> GroupResult | None:
        """The group's bound (None: N# can reach none of its targets, so it cannot leak)."""
        n_b, df = self.node.problem.n_bounds, self.node.diff
        if self.search:
            self._climb_from_relaxation(n_b, df)
        if self.node.tightens:
            if self.witness is None or self.node.cutoff > self._lower():
                probe_model = self._encode(n_b, df)
                if probe_model is None:
                    return no_targets(self.witness, self.info)
                finished = self._probe(probe_model)
                if finished is not None:
                    return finished
            t_obbt = time.perf_counter()
            tightened = tighten_node_bounds(
                lambda nb, d: self._encode(nb, d, relax_all=True),
                n_b,
                df,
                deadline=self.times.tightening_deadline,
                hyper_lp=not self.node.hyper.exact,
            )
            self.info["obbt_seconds"] = time.perf_counter() - t_obbt
            if tightened is not None:
                n_b, df = tightened
                self._use_tightened(n_b, df)
            elif self.witness is None or self.witness.confidence < self.level():
                return self._nothing_above_level()
            else:
                log.error("UNSOUND: bound tightening found no point although a witness replays; ignoring it")
        return self._final(n_b, df)

    def level(self) -> float:
        """The beta floor every model of this node is restricted to (slackened, so sound)."""
        return slack(max(self._lower(), self.node.cutoff))

    def _lower(self) -> float:
        return self.witness.confidence if self.witness is not None else -math.inf

    def _take(self, found: LeakWitness | None) -> bool:
        """Keep `found` if it is a better leak than the best so far."""
        if found is None or (self.witness is not None and found.confidence <= self.witness.confidence):
            return False
        self.witness = found
        return True

    def _encode(self, n_b: LayerBounds, df: DifferenceBounds, relax_all: bool = False) -> MilpModel | None:
        return self.node.encode(self.group, n_b, df, relax_all=relax_all, beta_lower=self.level())

    def _climb_from_relaxation(self, n_b: LayerBounds, df: DifferenceBounds) -> None:
        found = relaxation_witness(
            self.node,
            self.group,
            n_b,
            df,
            max(self._lower(), self.node.cutoff),
            self.times.climb_time(time.perf_counter()),
        )
        if self._take(found):
            self.info["relaxation_lower"] = found.confidence

    def _probe(self, model: MilpModel) -> GroupResult | None:
        """A first solve before tightening: the group's result when it proves the node (or is the
        plain attempt's only MILP, which gets the whole limit); None: tightening comes next."""
        if self.plain:  # no search ran, so nothing above the cutoff is known: only the dual bound counts
            options = dataclasses.replace(self.options, focus="bound")
            self.info["plain"] = True
        else:
            options = dataclasses.replace(self.options, time_limit=self.times.probe_time(time.perf_counter()))
        self.bound, result, found = solve_once(
            self.node.context, model, options, known=self.witness, floor=self.level()
        )
        self._take(found)
        self.info["probe_bound"] = encode_float(self.bound)
        if result.status in (OPTIMAL, INFEASIBLE) or self.plain:
            self.info.update(model_info(model))
            result.upper_bound = self.bound
            return self.bound, result, self.witness, self.info
        return None

    def _use_tightened(self, n_b: LayerBounds, df: DifferenceBounds) -> None:
        """After tightening: climb again from the tighter relaxation, and bound beta by the
        tightened output-difference interval."""
        if self.search:
            self._climb_from_relaxation(n_b, df)
        out_bound = max(df.pre.upper[-1][t] - df.pre.lower[-1][self.node.cls] for t in self.group)
        out_bound += FP_REL * 4 * (1 + abs(out_bound))
        self.info["obbt_output_bound"] = encode_float(out_bound)
        self.bound = min(self.bound, max(out_bound, self.level()))  # valid only above the relaxation's floor

    def _nothing_above_level(self) -> GroupResult:
        """Tightening found the relaxation empty: nothing lies above level() (impossible if a witness does)."""
        level = self.level()
        return level, SolveResult(status=INFEASIBLE, upper_bound=level, solver="obbt"), self.witness, self.info

    def _final(self, n_b: LayerBounds, df: DifferenceBounds) -> GroupResult | None:
        """The group's last MILP, over the (tightened) bounds, with the rest of the group's time."""
        t_enc = time.perf_counter()
        model = self._encode(n_b, df)
        self.info["encode_seconds"] = time.perf_counter() - t_enc
        if model is None:
            return no_targets(self.witness, self.info)
        self.info.update(model_info(model))
        options = self.options
        if self.witness is not None and self.witness.confidence >= self.node.cutoff:
            options = dataclasses.replace(
                options, focus="bound"
            )  # the lower bound is known: spend the time on the dual
        options = dataclasses.replace(options, time_limit=self.times.seconds_left(time.perf_counter()))
        if self.keep_key is not None:
            self.info["targets"] = list(self.group)
        return final_solve(
            self.node.context,
            FinalMilp(model, self.level(), self.bound, self.witness),
            options,
            self.info,
            self.keep_key,
        )


def solve_once(
    context: SolveContext,
    model: MilpModel,
    opts: SolverOptions,
    *,
    known: LeakWitness | None = None,
    floor: float = -math.inf,
    keep: bool = False,
    tree: KeptSolve | None = None,
) -> tuple[float, SolveResult, LeakWitness | None]:
    """Solve, add the safety margin, replay the witness; a bound below the replayed witness or a
    `known` one (HiGHS once fell 1.3e-5 below a searched witness after root cuts, with no
    incumbent of its own) is a solver failure and the model goes to another backend.
    `floor`: the model only has the points with beta >= floor, so its bound is max(dual, floor).
    `keep` / `tree`: ask for a continuable result / continue a kept one (`lucid.analysis.kept_trees`)."""
    problem, cls, positions, solver = context.problem, context.cls, context.positions, context.solver
    started = time.perf_counter()
    result = solve_checked(model, solver, opts, keep=keep, tree=tree)
    bound = max(user_bound(result, model), floor)
    witness = None
    if result.solution is not None and len(positions):  # a box verification may have no networks to replay on
        witness = find_leak(
            problem.stack, positions, model.witness_input(result.solution), cls, problem.lower, problem.upper
        )
    strongest = max((w for w in (witness, known) if w is not None), key=lambda w: w.confidence, default=None)
    if contradicts(bound, strongest):
        log.error(
            "UNSOUND: %s proved %.9g for class %d but a replayed witness reaches %.9g; retrying with other solvers",
            result.solver,
            bound,
            cls,
            strongest.confidence,
        )
        if result.tree is not None:
            result.tree.release()
        result = retry_other(model, solver, opts, strongest, started)
        bound = max(user_bound(result, model), floor)
    return bound, result, witness


def final_solve(
    context: SolveContext,
    final: FinalMilp,
    opts: SolverOptions,
    info: dict,
    keep_key: tuple | None,
    tree: KeptSolve | None = None,
) -> GroupResult:
    """The node's last MILP (or the continuation of its kept `tree`); with `keep_key` a time-limited
    one is kept in this process for the node's next retry."""
    model, level, bound, witness = final.model, final.level, final.bound, final.witness
    bound2, result2, witness2 = solve_once(
        context, model, opts, known=witness, floor=level, keep=keep_key is not None, tree=tree
    )
    if witness2 is not None and (witness is None or witness2.confidence > witness.confidence):
        witness = witness2
    best_bound = min(bound, bound2)
    if contradicts(best_bound, witness):
        log.error(
            "UNSOUND: bound %.9g is below a replayed witness %.9g; claiming nothing for this node",
            best_bound,
            witness.confidence,
        )
        result2.status, best_bound = ERROR, math.inf
    result2.upper_bound = best_bound
    if result2.tree is not None:
        if keep_key is not None and result2.status == TIME_LIMIT:
            KEPT.put(KeptTree(context.problem, keep_key, result2.tree, model, level, bound, witness, dict(info)))
            info["kept"] = True
        else:
            result2.tree.release()
        result2.tree = None
    return best_bound, result2, witness, info


def no_targets(witness: LeakWitness | None, info: dict) -> GroupResult | None:
    """The encoder found no target class N# can reach: the node cannot leak at all."""
    if witness is not None:
        log.error("UNSOUND: the encoder found no target class although a witness replays")
        return math.inf, SolveResult(status=ERROR, upper_bound=math.inf, solver="encoder"), witness, info
    return None


def relaxation_witness(
    node: NodeModels, group: list[int], n_b: LayerBounds, df: DifferenceBounds, lb: float, time_limit: float
) -> LeakWitness | None:
    """A leak found by climbing from the optimum of the node's LP relaxation, the LP and the climb
    within `time_limit` seconds together.

    The relaxation's maximiser of beta is a cheap, well-aimed start: it lies where the
    relaxation, and usually the true problem, is largest, so the climb from it tends to end
    higher than climbs from random starts, and a better LB prunes the MILP's tree (beta >= LB)
    and tightens OBBT."""
    end = time.monotonic() + time_limit
    model = node.encode(group, n_b, df, relax_all=True, beta_lower=slack(lb))
    if model is None:
        return None
    relaxed = dataclasses.replace(model, integrality=np.zeros_like(model.integrality))
    try:
        result = solvers.solve(relaxed, "highs", SolverOptions(time_limit=max(0.0, end - time.monotonic())))
    except Exception as exc:  # noqa: BLE001 (only a heuristic: never let it fail the node)
        log.info("relaxation witness skipped: %s", exc)
        return None
    if result.solution is None:
        return None
    problem = node.problem
    query = replay.LeakQuery(problem.stack, node.positions, node.cls, problem.lower, problem.upper)
    return replay.climb(query, model.witness_input(result.solution), deadline=end)


def model_info(model: MilpModel) -> dict:
    """The model's size and the encoder's counts, for the node's stats."""
    return {
        "cols": model.num_cols,
        "rows": model.num_rows,
        **{k: v for k, v in model.meta.items() if k != "targets" and not k.startswith("_")},
    }
