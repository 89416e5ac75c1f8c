"""Sound bounds for the ReLU-splitting tier's domains from the LP relaxation of the singleton's MILP.

The splitting tier (`lucid.bounds.relu_split`) bounds a domain (some pre-activations of N and N'
fixed in sign) by a Lagrangian backward pass: cheap, but on a hard network it can stall, its
children no better than itself, deep in the tree. On Adult 2x50's witness network such domains
had 0.0207 from the pass, where the LP relaxation of the encoded MILP (`lucid.analysis.encode`, with
the domain's neurons fixed: pre-activation bound cut at 0, binary fixed) gave 0.0178 and the MILP
found them empty. So a stalled domain gets this LP as a second opinion.

The LP is solved by the solver layer (`lucid.solvers.lp.BoundedLp`) and only its duals are used,
through `lucid.bounds.lp.dual_bound` (weak duality over the column bounds): an inaccurate LP can
loosen the bound, never make it unsound. An LP the solver finds infeasible closes the domain only
when its Farkas ray proves that by the same weak duality (`lucid.bounds.lp.proves_empty`).
"""

from __future__ import annotations

import copy
import math

import numpy as np

from lucid.analysis.encode import EncoderInputs, EncodingOptions, encode_idp
from lucid.analysis.problem import VerificationProblem, node_difference_bounds
from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.lp import dual_bound, proves_empty
from lucid.hyper import HyperNetwork, hyper_network


class DomainLp:
    """`bound(t, sn, sp)`: a sound upper bound on the domain's share of beta_t (N' ranks t >= c)
    for one network and class; the MILP of each rival t is encoded once, on first use."""

    def __init__(self, problem: VerificationProblem, cls: int, position: int, encoding: EncodingOptions) -> None:
        self.problem, self.cls, self.position, self.encoding = problem, cls, position, encoding
        self._lps: dict[int, tuple] = {}
        # (hyper-network, difference bounds), made on first use: most networks never ask
        self._bounds: tuple[HyperNetwork, DifferenceBounds] | None = None
        self.solved = 0

    def _lp(self, t: int):
        from lucid.solvers.lp import BoundedLp

        if t not in self._lps:
            p = self.problem
            if self._bounds is None:
                hyper = hyper_network(p.stack, np.array([self.position]))
                at = np.array([self.position]) if self.encoding.symbolic else None
                self._bounds = hyper, node_difference_bounds(p, hyper, at)
            hyper, diff = self._bounds
            model = encode_idp(EncoderInputs.for_node(p, hyper, diff), self.cls, self.encoding, targets=[t])
            self._lps[t] = (model, None if model is None else BoundedLp(model))
        return self._lps[t]

    def bound(self, t: int, sn: list[np.ndarray], sp: list[np.ndarray]) -> float:
        """sn[k], sp[k]: the split signs (+1: >= 0, -1: <= 0, 0: free) of N's and N''s neurons of
        hidden layer k. -inf: no input of the domain lets N' rank t >= c."""
        model, lp = self._lp(t)
        if model is None:  # N' can never rank t >= c
            return -math.inf
        cols = model.meta["_columns"]
        lower, upper = model.col_lower.copy(), model.col_upper.copy()
        for k in range(len(sn)):
            for pre, on, signs in (
                (cols["n_pre"][k], cols["n_on"][k], sn[k]),
                (cols["h_pre"][k], cols["h_on"][k], sp[k]),
            ):
                up, down = signs > 0, signs < 0
                lower[pre[up]] = np.maximum(lower[pre[up]], 0.0)
                upper[pre[down]] = np.minimum(upper[pre[down]], 0.0)
                # a = 1 is valid where zhat >= 0 (z = zhat), a = 0 where zhat <= 0 (z = 0)
                lower[on[up & (on >= 0)]] = 1.0
                upper[on[down & (on >= 0)]] = 0.0
        if np.any(lower > upper):  # a split against the encoder's own sound bounds: no input
            return -math.inf
        self.solved += 1
        answer = lp.duals(lower, upper)
        fixed = copy.copy(model)
        fixed.col_lower, fixed.col_upper = lower, upper
        if answer.optimum is None:  # infeasible (no input of the domain), if its ray proves it
            return -math.inf if answer.farkas is not None and proves_empty(fixed, answer.farkas) else math.inf
        value = dual_bound(fixed, model.objective, answer.optimum)
        return float(np.nextafter(value + model.objective_offset, math.inf)) * model.objective_scale
