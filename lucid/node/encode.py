"""The iDP decision-bound MILP (paper Eq. 3) for class c and a hyper-network N#_S.

    max beta  s.t.  x in domain,  N(x) exactly (big-M ReLU, 3d/3f),
                    N#(x) relaxed over the weight intervals (3e/3g),
                    s_c - s_t >= beta for all t != c                 (N is confident by beta)
                    s#_t >= s#_c for some t != c                     (N# does not predict c, 3c)

Inputs are shifted to x' = x - lo >= 0 when the domain has negative lower bounds, so that the
interval-weight sums of 3e (two inequalities, W_lo z <= W z <= W_hi z) are valid: they need
non-negative inputs, which ReLU outputs are anyway. The shift's constant W lo is folded into
the bias (an interval for N#).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.interval import LayerBounds, widen
from lucid.milp.builder import ModelBuilder
from lucid.milp.matching import add_matching, add_relu_coupling, implied_post_rows
from lucid.milp.model import MilpModel
from lucid.milp.relax import relax_if_similar
from lucid.milp.relu import encode_relu, stability
from lucid.hyper import HyperNetwork


@dataclass
class EncodingOptions:
    """Switches of the encoder (every technique can be turned off for the ablation).

    md / md_pre: matching dependencies z + dl <= z# <= z + du after / before the ReLU.
    coupling: relational matching dependencies: z# - z tied to zhat# - zhat through ReLU's
      monotonicity and 1-Lipschitz continuity (lucid.milp.matching.add_relu_coupling).
    ris / tau: relax-if-similar: an unstable hyper neuron whose pre-activation difference
      interval is at most tau wide gets the triangle relaxation instead of a binary (never for a
      singleton, which stays exact).
    bounds: how N's pre-activation bounds are computed ("interval" or "lp").
    disjunction: the output disjunction "some class t beats c in N#" for C > 2: "bigm" (one
      binary per target class, paper 3c) or "split" (one sub-problem per target, max of bounds).
    search: look for a leaking input without a solver first; its replayed confidence LB is a
      true lower bound, so the MILP is restricted to beta >= LB (optimum unchanged).
    symbolic: the node's difference intervals are also bounded by the symbolic (input-dependent)
      pass of `lucid.bounds.symbolic` for each of its networks, hulled and intersected with the
      interval ones: tighter matching dependencies, smaller big-M constants, more relax-if-similar.
    obbt: node-specific bound tightening over the node's own LP relaxation (lucid.bounds.obbt),
      after a probe solve of `obbt_probe` seconds that supplies a replayed lower bound:
      True (every node), False (none) or "singletons" (nodes of one network, the default).
      Tighter neuron bounds mean smaller big-M constants and fewer unstable binaries, which is
      what lets a solver close a singleton's exact bound; on large hyper-networks the LPs cost
      more and move the loose interval weights' bounds little, so the time is better spent in
      the MILP (benchmarks/milp_core.py).
    """

    md: bool = True
    md_pre: bool = True
    coupling: bool = True
    ris: bool = True
    tau: float = 0.01
    bounds: str = "lp"
    symbolic: bool = False
    disjunction: str = "bigm"  # one tree shared by all targets; "split" solves one MILP per target
    obbt: bool | str = "singletons"
    search: bool = True  # solver-free witness search first (lucid.witness.search.search_node_witness)
    obbt_probe: float = 5.0
    obbt_share: float = 0.5  # at most this share of the node's time limit goes to tightening


def _affine_rows(b: ModelBuilder, out_cols: np.ndarray, in_cols: np.ndarray, w: np.ndarray, lo, hi,
                 name: str) -> np.ndarray:
    """Rows lo <= out - w @ in <= hi; returns their indices."""
    n = len(out_cols)
    cols = np.concatenate([out_cols[:, None], np.broadcast_to(in_cols, (n, len(in_cols)))], 1)
    return b.add_rows(cols, np.concatenate([np.ones((n, 1)), -w], 1), lo, hi, name)


def pre_row_implied(layer: int, exact: bool) -> bool:
    """Layer 0 of a single network: zhat# - zhat is affine in x through the two equality rows, and
    any sound interval of it holds over the whole box, so its matching row cannot cut anything."""
    return layer == 0 and exact


def possible_targets(cls: int, hyper_bounds: LayerBounds) -> list[int]:
    """Classes t that N# could rank at least as high as c somewhere in the domain."""
    lo, hi = hyper_bounds.lower[-1], hyper_bounds.upper[-1]
    return [t for t in range(len(lo)) if t != cls and hi[t] - lo[cls] >= 0]


def encode_idp(
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    n_bounds: LayerBounds,
    hyper: HyperNetwork,
    diff: DifferenceBounds,
    lower: np.ndarray,
    upper: np.ndarray,
    cls: int,
    options: EncodingOptions,
    targets: list[int] | None = None,
    margin_upper: np.ndarray | None = None,
    relax_all: bool = False,
    beta_lower: float = -np.inf,
) -> MilpModel | None:
    """The MILP of Eq. 3, or None when no target class is possible (beta* = -inf).

    `targets` restricts the disjunction to these classes of N# (one sub-problem per target when
    the caller splits); `margin_upper[c, t]` are optional sound upper bounds of s_c - s_t for N.
    `relax_all` gives every ReLU the triangle relaxation (the LP used for bound tightening);
    `beta_lower` restricts beta to a known true lower bound of beta* (the optimum is unchanged).
    """
    L = len(weights)
    exact = hyper.exact
    targets = possible_targets(cls, diff.hyper) if targets is None else list(targets)
    if not targets:
        return None
    b = ModelBuilder()
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    shift = bool(np.any(lower < 0))
    offset = lower if shift else np.zeros_like(lower)
    x = b.add_vars(len(lower), lower - offset, upper - offset, "x")
    stats = {"exact_hyper": exact, "shifted": shift, "binaries_n": 0, "binaries_hyper": 0, "relaxed": 0, "md_rows": 0}

    # layer-0 biases after the shift x = offset + x'
    n_b0 = biases[0] + weights[0] @ offset
    if exact:
        h_b0_lo = h_b0_hi = hyper.b_lo[0] + hyper.w_lo[0] @ offset
    else:
        prods = np.stack([hyper.w_lo[0] * offset, hyper.w_hi[0] * offset])
        h_b0_lo, h_b0_hi = widen(
            hyper.b_lo[0] + prods.min(0).sum(1),
            hyper.b_hi[0] + prods.max(0).sum(1),
            np.abs(prods).max(0).sum(1) + np.maximum(np.abs(hyper.b_lo[0]), np.abs(hyper.b_hi[0])),
        )

    # columns per hidden layer, for bound tightening and per-domain LPs (n_on, h_on: binary per neuron or -1)
    cols: dict = {"n_pre": [], "h_pre": [], "n_post": [], "h_post": [], "n_on": [], "h_on": []}
    # layer-0 pre-activations a backend may substitute out (lucid.solvers.compact)
    defined: tuple[list, list] = ([], [])
    z, zh = x, x  # N's and N#'s current layer outputs
    for k in range(L):
        nl, nu = n_bounds.lower[k], n_bounds.upper[k]
        hl, hu = diff.hyper.lower[k], diff.hyper.upper[k]
        n_out = len(nl)
        zhat = b.add_vars(n_out, nl, nu, f"n{k}.zhat")
        bias = n_b0 if k == 0 else biases[k]
        n_rows = _affine_rows(b, zhat, z, weights[k], bias, bias, f"n{k}.aff")
        zhat_h = b.add_vars(n_out, hl, hu, f"h{k}.zhat")
        cols["n_pre"].append(zhat)
        cols["h_pre"].append(zhat_h)
        if exact:
            hb = h_b0_lo if k == 0 else hyper.b_lo[k]
            h_rows = _affine_rows(b, zhat_h, zh, hyper.w_lo[k], hb, hb, f"h{k}.aff")
        else:
            blo = h_b0_lo if k == 0 else hyper.b_lo[k]
            bhi = h_b0_hi if k == 0 else hyper.b_hi[k]
            _affine_rows(b, zhat_h, zh, hyper.w_lo[k], blo, np.inf, f"h{k}.wlo")
            _affine_rows(b, zhat_h, zh, hyper.w_hi[k], -np.inf, bhi, f"h{k}.whi")
        if options.md_pre and not pre_row_implied(k, exact):
            stats["md_rows"] += add_matching(b, zhat, zhat_h, diff.pre.lower[k], diff.pre.upper[k], f"md{k}.pre")
        if k == 0 and L > 1:
            unstable = stability(nl, nu)[2]
            defined[0].append(zhat[unstable])
            defined[1].append(n_rows[unstable])
            if exact:
                unstable = stability(hl, hu)[2]
                defined[0].append(zhat_h[unstable])
                defined[1].append(h_rows[unstable])
        if k == L - 1:
            z, zh = zhat, zhat_h
            break
        z, s_n = encode_relu(b, zhat, nl, nu, f"n{k}", relax=np.full(n_out, relax_all))
        relax = relax_if_similar(diff.pre.lower[k], diff.pre.upper[k], options.ris, options.tau, exact) | relax_all
        zh, s_h = encode_relu(b, zhat_h, hl, hu, f"h{k}", relax=relax)
        cols["n_post"].append(z)
        cols["h_post"].append(zh)
        cols["n_on"].append(s_n["indicator"])
        cols["h_on"].append(s_h["indicator"])
        stats["binaries_n"] += s_n["binaries"]
        stats["binaries_hyper"] += s_h["binaries"]
        stats["relaxed"] += s_h["relaxed"]
        coupled = np.zeros(n_out, dtype=bool)
        if options.coupling:
            rows, coupled = add_relu_coupling(
                b, zhat, zhat_h, z, zh, diff.pre.lower[k], diff.pre.upper[k], f"md{k}.relu"
            )
            stats["md_rows"] += rows
        if options.md:
            implied = None
            if options.md_pre:  # the coupling's implication needs dhat's interval as a row
                implied = implied_post_rows(diff.pre.lower[k], diff.pre.upper[k], diff.post.lower[k],
                                            diff.post.upper[k], coupled,
                                            stability(nl, nu)[1] & stability(hl, hu)[1])
            stats["md_rows"] += add_matching(b, z, zh, diff.post.lower[k], diff.post.upper[k], f"md{k}.post",
                                             implied=implied)

    s, sh = z, zh
    nl, nu = n_bounds.lower[-1], n_bounds.upper[-1]
    others = [t for t in range(len(nl)) if t != cls]
    def margin(t: int) -> float:
        interval = nu[cls] - nl[t] + 1e-12 * (abs(nu[cls]) + abs(nl[t]))
        return min(interval, margin_upper[cls, t]) if margin_upper is not None else interval

    beta_ub = min(margin(t) for t in others)
    # beta* >= min over the domain of C_N^c whenever the node is feasible, so this finite
    # lower bound never cuts off the optimum (and keeps every column bounded for rigorous duals)
    floor = min(nl[cls] - nu[t] for t in others)
    floor -= 1e-9 * (1 + abs(floor))
    beta = b.add_vars(1, min(max(beta_lower, floor), beta_ub), beta_ub, "beta")
    cols["beta"] = int(beta[0])
    stats["_columns"] = cols  # not JSON: dropped from reported statistics
    if defined[0]:
        stats["_defined"] = (np.concatenate(defined[0]), np.concatenate(defined[1]))
    b.objective[int(beta[0])] = 1.0
    # beta - s_c + s_t <= 0
    b.add_rows(
        np.stack([np.full(len(others), beta[0]), np.full(len(others), s[cls]), s[others]], 1),
        [1.0, -1.0, 1.0],
        -np.inf,
        0.0,
        "conf",
    )
    hl, hu = diff.hyper.lower[-1], diff.hyper.upper[-1]
    if len(targets) == 1:
        t = targets[0]
        b.add_rows(np.array([[sh[t], sh[cls]]]), [1.0, -1.0], 0.0, np.inf, "leak")
    else:
        gaps = np.array([hl[t] - hu[cls] for t in targets])  # lower bounds of s#_t - s#_c
        if np.all(gaps < 0):
            q = b.add_vars(len(targets), 0.0, 1.0, "q", integer=True)
            stats["binaries_out"] = len(targets)
            b.add_rows(q[None, :], np.ones((1, len(targets))), 1.0, np.inf, "leak.any")
            # s#_t - s#_c >= gap_t (1 - q_t)
            tcols = sh[targets]
            b.add_rows(np.stack([tcols, np.full(len(targets), sh[cls]), q], 1), np.stack([np.ones(len(targets)), -np.ones(len(targets)), gaps], 1), gaps, np.inf, "leak")
        # else some target always beats c in N#: the disjunction holds everywhere
    stats["targets"] = targets
    stats["binaries"] = stats["binaries_n"] + stats["binaries_hyper"] + stats.get("binaries_out", 0)
    return b.build(x, offset if shift else np.zeros(0), stats)
