"""beta_c over an AGT parameter box: one MILP per class (`lucid verify --hyper agt:K`).

A box [theta_L, theta_U] from `lucid train --agt K` contains every parameter vector training can
produce from D with up to K rows removed (docs/agt.md). Encoded as the hyper-network N# of Eq. 3,
its MILP's dual bound plus the safety margin bounds beta*_c for every such data set at once:
group iDP for K removals. The box has no member networks, so nothing here splits it, screens it,
or takes a bound from them: only the leave-one-out networks a run may also hold (each lies in the
k = 1 box, hence in every box with k >= 1) give replayed leaks, which are true lower bounds.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from lucid.analysis.encode import EncoderInputs, encode_idp, possible_targets
from lucid.analysis.milp_tier import SolveContext, model_info, solve_once
from lucid.analysis.outcome import NodeOutcome, combine_outcome
from lucid.analysis.problem import VerificationProblem, node_difference_bounds
from lucid.analysis.soundness import slack
from lucid.errors import LucidError
from lucid.hyper import HyperNetwork
from lucid.settings import VerifySettings
from lucid.solvers.base import INFEASIBLE, SolverOptions
from lucid.witness.replay import LeakWitness


def check_parameter_box_holds_networks(problem: VerificationProblem, hyper: HyperNetwork, where: str) -> None:
    """The box must have the networks' shapes and contain every network of the run (N, and each
    N_-i for k >= 1): a box that misses one was not computed for these networks, and its bound
    would be about some other training."""
    for k, (w, b) in enumerate(zip(problem.stack.weights, problem.stack.biases, strict=True)):
        if hyper.w_lo[k].shape != w.shape[1:] or hyper.b_lo[k].shape != b.shape[1:]:
            raise LucidError(
                f"{where}: layer {k} of the box has shape {hyper.w_lo[k].shape}, the networks {w.shape[1:]}"
            )
        inside = (
            np.all(hyper.w_lo[k] <= w)
            and np.all(w <= hyper.w_hi[k])
            and np.all(hyper.b_lo[k] <= b)
            and np.all(b <= hyper.b_hi[k])
        )
        if not inside:
            raise LucidError(
                f"{where}: the box does not contain the run's networks (layer {k}); it was not trained with them"
            )


def analyse_parameter_box(
    problem: VerificationProblem,
    cls: int,
    hyper: HyperNetwork,
    settings: VerifySettings,
    solver_options: SolverOptions,
    *,
    loo_positions: np.ndarray | None = None,
    known: LeakWitness | None = None,
) -> NodeOutcome:
    """A sound upper bound on beta*_cls for every network in the box `hyper`.

    `loo_positions`: stack positions of leave-one-out networks inside the box, against which the
    solver's incumbent is replayed (a true lower bound); `known`: a replayed leak of one of them.
    The MILP is then restricted to beta >= that leak (slackened): max(dual bound, that level) is
    an upper bound whether or not the level is attained in the box."""
    t0 = time.perf_counter()
    # The symbolic hull of `node_difference_bounds` holds for member networks only, and OBBT's
    # probe would need one: plain interval propagation holds for every weight vector in the box.
    encoding = replace(settings.encoding_options(), symbolic=False, obbt=False)
    diff = node_difference_bounds(problem, hyper)
    targets = possible_targets(cls, diff.hyper)
    stats: dict = {"bounds_seconds": time.perf_counter() - t0, "targets": targets, "solves": []}
    floor = slack(known.confidence) if known is not None else -math.inf
    model = (
        encode_idp(EncoderInputs.for_node(problem, hyper, diff), cls, encoding, targets=targets, beta_lower=floor)
        if targets
        else None
    )
    if model is None:
        # no class can beat cls in any box network; a known leak would contradict that (-> ERROR)
        return combine_outcome(-math.inf, [INFEASIBLE], known, stats, t0)
    opts = replace(solver_options, focus="bound") if known is not None else solver_options
    positions = np.zeros(0, dtype=np.int64) if loo_positions is None else np.asarray(loo_positions, dtype=np.int64)
    bound, result, witness = solve_once(
        SolveContext(problem, cls, positions, settings.solver), model, opts, known=known, floor=floor
    )
    best = max((w for w in (witness, known) if w is not None), key=lambda w: w.confidence, default=None)
    stats["solves"].append({"targets": targets, **result.to_json(), **model_info(model)})
    return combine_outcome(bound, [result.status], best, stats, t0)
