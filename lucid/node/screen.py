"""The screen: a sound upper bound on beta*_{c,{i}} for every single network at once, without a
solver (bound propagation of the difference intervals), so most networks never reach a MILP."""

from __future__ import annotations

import numpy as np

from lucid.bounds.difference import difference_bounds
from lucid.bounds.interval import FP_REL
from lucid.node.problem import VerificationProblem


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
