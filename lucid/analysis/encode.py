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

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lucid.bounds.difference import DifferenceBounds
from lucid.bounds.interval import LayerBounds, widen
from lucid.dynamic_range import outside_band
from lucid.hyper import HyperNetwork
from lucid.milp.builder import ModelBuilder
from lucid.milp.matching import ReluColumns, add_matching, add_relu_coupling, implied_post_rows
from lucid.milp.model import MilpModel
from lucid.milp.relax import relax_if_similar
from lucid.milp.relu import encode_relu, stability
from lucid.settings import EncodingOptions


@dataclass(frozen=True, eq=False)
class EncoderInputs:
    """What Eq. 3 is built from for one node (eq=False: arrays): N's layers and pre-activation
    bounds, the node's hyper-network N# and difference bounds, the input box and, optionally, sound
    upper bounds margin_upper[c, t] of N's s_c - s_t."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]
    n_bounds: LayerBounds
    hyper: HyperNetwork
    diff: DifferenceBounds
    lower: np.ndarray
    upper: np.ndarray
    margin_upper: np.ndarray | None = None

    @classmethod
    def for_node(
        cls, problem, hyper: HyperNetwork, diff: DifferenceBounds, n_bounds: LayerBounds | None = None
    ) -> EncoderInputs:
        """A `VerificationProblem`'s N, box and margin bounds with a node's hyper-network and
        difference bounds; n_bounds: N's bounds (tightened for the node), the problem's by default."""
        return cls(
            problem.n_weights,
            problem.n_biases,
            problem.n_bounds if n_bounds is None else n_bounds,
            hyper,
            diff,
            problem.lower,
            problem.upper,
            problem.margin_upper,
        )


@dataclass
class _Build:
    """One model under construction: the builder, what every block reads (the inputs, the switches)
    and what the layers record (their columns, for bound tightening and per-domain LPs; the
    statistics)."""

    b: ModelBuilder
    inputs: EncoderInputs
    options: EncodingOptions
    relax_all: bool
    stats: dict
    cols: dict = field(
        default_factory=lambda: {"n_pre": [], "h_pre": [], "n_post": [], "h_post": [], "n_on": [], "h_on": []}
    )


def _affine_rows(
    b: ModelBuilder, out_cols: np.ndarray, in_cols: np.ndarray, w: np.ndarray, lo, hi, name: str
) -> np.ndarray:
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
    inputs: EncoderInputs,
    cls: int,
    options: EncodingOptions,
    *,
    targets: list[int] | None = None,
    relax_all: bool = False,
    beta_lower: float = -np.inf,
) -> MilpModel | None:
    """The MILP of Eq. 3, or None when no target class is possible (beta* = -inf).

    `targets` restricts the disjunction to these classes of N# (one sub-problem per target when
    the caller splits). `relax_all` gives every ReLU the triangle relaxation (the LP used for bound
    tightening); `beta_lower` restricts beta to a known true lower bound of beta* (the optimum is
    unchanged). The blocks are added in a fixed order (columns and rows keep their positions and
    names), which bound tightening, per-domain LPs and the compact form rely on.
    """
    targets = possible_targets(cls, inputs.diff.hyper) if targets is None else list(targets)
    if not targets:
        return None
    scale = score_scale(inputs.n_bounds, inputs.diff)
    if scale != 1.0:
        inputs = _scaled_scores(inputs, scale)
        beta_lower = beta_lower / scale
    b = ModelBuilder()
    x, offset, shift = _input_domain(b, inputs.lower, inputs.upper)
    stats: dict[str, Any] = {
        "exact_hyper": inputs.hyper.exact,
        "shifted": shift,
        "binaries_n": 0,
        "binaries_hyper": 0,
        "relaxed": 0,
        "md_rows": 0,
    }
    build = _Build(b, inputs, options, relax_all, stats)
    scores, scores_h, defined = _layers(build, x, offset)
    beta = _objective(b, inputs.n_bounds, cls, inputs.margin_upper, beta_lower)
    cols = build.cols
    cols["beta"] = beta
    stats["_columns"] = cols  # not JSON: dropped from reported statistics
    if defined[0]:
        stats["_defined"] = (np.concatenate(defined[0]), np.concatenate(defined[1]))
    _confidence(b, beta, scores, cls)
    _leak_disjunction(b, scores_h, cls, targets, inputs.diff.hyper, stats)
    stats["targets"] = targets
    stats["binaries"] = stats["binaries_n"] + stats["binaries_hyper"] + stats.get("binaries_out", 0)
    model = b.build(x, offset if shift else np.zeros(0), stats)
    model.objective_scale = scale
    return model


def score_scale(n_bounds: LayerBounds, diff: DifferenceBounds) -> float:
    """The power of two the encoder divides the scores by (1.0 for ordinary networks).

    Hidden neurons arrive at magnitudes of order one (`lucid.analysis.scaling`), but the scores
    keep the network's scale: one factor for all classes leaves every confidence's sign and
    ratio, so it can be divided out of the model and multiplied back into its bound exactly. The
    solvers' tolerances are absolute on their scaled rows: at scores of 1e12 HiGHS declared
    infeasible a model with points 2e5 above its floor; at order one the margins cover them."""
    parts = [n_bounds.lower[-1], n_bounds.upper[-1], diff.hyper.lower[-1], diff.hyper.upper[-1]]
    with np.errstate(all="ignore"):
        magnitude = max(float(np.max(np.abs(p), initial=0.0)) for p in parts)
    if not np.isfinite(magnitude) or magnitude == 0.0 or not outside_band(magnitude):
        return 1.0
    return float(np.ldexp(1.0, int(np.frexp(magnitude)[1])))  # magnitude / scale in [0.5, 1)


def _scaled_last(bounds: LayerBounds, factor: float) -> LayerBounds:
    return LayerBounds(
        list(bounds.lower[:-1]) + [bounds.lower[-1] * factor], list(bounds.upper[:-1]) + [bounds.upper[-1] * factor]
    )


def _scaled_scores(inputs: EncoderInputs, scale: float) -> EncoderInputs:
    """The last layer and every bound on it divided by `scale`, a power of two: exact."""
    factor = 1.0 / scale
    weights, biases, hyper, diff = inputs.weights, inputs.biases, inputs.hyper, inputs.diff
    weights = list(weights[:-1]) + [weights[-1] * factor]
    biases = list(biases[:-1]) + [biases[-1] * factor]
    hyper = HyperNetwork(
        list(hyper.w_lo[:-1]) + [hyper.w_lo[-1] * factor],
        list(hyper.w_hi[:-1]) + [hyper.w_hi[-1] * factor],
        list(hyper.b_lo[:-1]) + [hyper.b_lo[-1] * factor],
        list(hyper.b_hi[:-1]) + [hyper.b_hi[-1] * factor],
        hyper.positions,
    )
    diff = DifferenceBounds(_scaled_last(diff.pre, factor), diff.post, _scaled_last(diff.hyper, factor))
    margin_upper = None if inputs.margin_upper is None else inputs.margin_upper / scale
    return replace(
        inputs,
        weights=weights,
        biases=biases,
        n_bounds=_scaled_last(inputs.n_bounds, factor),
        hyper=hyper,
        diff=diff,
        margin_upper=margin_upper,
    )


def _input_domain(b: ModelBuilder, lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """3b, x in the domain: the input columns, shifted to x' = x - lower when the domain has a
    negative lower bound (module docstring). Returns the columns, the offset and whether it shifts."""
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    shift = bool(np.any(lower < 0))
    offset = lower if shift else np.zeros_like(lower)
    return b.add_vars(len(lower), lower - offset, upper - offset, "x"), offset, shift


def _shifted_biases(
    weights: list[np.ndarray], biases: list[np.ndarray], hyper: HyperNetwork, offset: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Layer 0's biases after the shift x = offset + x': N's, and N#'s interval (one point when
    N# is a single network), widened by the rounding of the interval products."""
    n_b0 = biases[0] + weights[0] @ offset
    if hyper.exact:
        h_b0 = hyper.b_lo[0] + hyper.w_lo[0] @ offset
        return n_b0, (h_b0, h_b0)
    prods = np.stack([hyper.w_lo[0] * offset, hyper.w_hi[0] * offset])
    return n_b0, widen(
        hyper.b_lo[0] + prods.min(0).sum(1),
        hyper.b_hi[0] + prods.max(0).sum(1),
        np.abs(prods).max(0).sum(1) + np.maximum(np.abs(hyper.b_lo[0]), np.abs(hyper.b_hi[0])),
    )


def _layers(build: _Build, x: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[list, list]]:
    """N's layers (3d, 3f) and N#'s (3e, 3g), layer by layer, with the matching dependencies and
    relax-if-similar (3b) that tie each layer of N# to N's. Returns the score columns of N and N#
    and layer 0's pre-activations a backend may substitute out with their rows
    (`lucid.solvers.compact`); the columns per hidden layer go to build.cols (n_on, h_on: the
    binary per neuron or -1)."""
    b, inputs, options, stats, cols = build.b, build.inputs, build.options, build.stats, build.cols
    weights, biases, n_bounds, hyper, diff = inputs.weights, inputs.biases, inputs.n_bounds, inputs.hyper, inputs.diff
    L = len(weights)
    n_b0, h_b0 = _shifted_biases(weights, biases, hyper, offset)
    defined: tuple[list, list] = ([], [])
    z, zh = x, x  # N's and N#'s current layer outputs
    for k in range(L):
        zhat, n_rows = _network_affine(b, k, z, weights[k], n_b0 if k == 0 else biases[k], n_bounds)
        zhat_h, h_rows = _hyper_affine(b, k, zh, hyper, h_b0 if k == 0 else (hyper.b_lo[k], hyper.b_hi[k]), diff)
        cols["n_pre"].append(zhat)
        cols["h_pre"].append(zhat_h)
        if options.md_pre and not pre_row_implied(k, hyper.exact):
            stats["md_rows"] += add_matching(b, zhat, zhat_h, diff.pre.lower[k], diff.pre.upper[k], f"md{k}.pre")
        if k == 0 and L > 1:
            _substitutable(inputs, defined, (zhat, n_rows), (zhat_h, h_rows))
        if k == L - 1:
            return zhat, zhat_h, defined
        z, zh = _relus(build, k, zhat, zhat_h)
        _post_matching(build, k, ReluColumns(zhat, zhat_h, z, zh))
    raise ValueError("a network needs at least one layer")


def _network_affine(
    b: ModelBuilder, k: int, z: np.ndarray, w: np.ndarray, bias: np.ndarray, n_bounds: LayerBounds
) -> tuple[np.ndarray, np.ndarray]:
    """3d: N's pre-activations zhat_k = W_k z_{k-1} + b_k (equality rows), bounded by N's bounds."""
    zhat = b.add_vars(len(n_bounds.lower[k]), n_bounds.lower[k], n_bounds.upper[k], f"n{k}.zhat")
    return zhat, _affine_rows(b, zhat, z, w, bias, bias, f"n{k}.aff")


def _hyper_affine(
    b: ModelBuilder,
    k: int,
    zh: np.ndarray,
    hyper: HyperNetwork,
    bias: tuple[np.ndarray, np.ndarray],
    diff: DifferenceBounds,
) -> tuple[np.ndarray, np.ndarray | None]:
    """3e: N#'s pre-activations between the interval weights' sums (two inequalities), or one
    equality row per neuron when N# is a single network; bias: (lower, upper). Returns the columns
    and, for a single network, its equality rows."""
    n_out = len(diff.hyper.lower[k])
    zhat_h = b.add_vars(n_out, diff.hyper.lower[k], diff.hyper.upper[k], f"h{k}.zhat")
    if hyper.exact:
        return zhat_h, _affine_rows(b, zhat_h, zh, hyper.w_lo[k], bias[0], bias[0], f"h{k}.aff")
    _affine_rows(b, zhat_h, zh, hyper.w_lo[k], bias[0], np.inf, f"h{k}.wlo")
    _affine_rows(b, zhat_h, zh, hyper.w_hi[k], -np.inf, bias[1], f"h{k}.whi")
    return zhat_h, None


def _substitutable(
    inputs: EncoderInputs,
    defined: tuple[list, list],
    n_pre: tuple[np.ndarray, np.ndarray],
    h_pre: tuple[np.ndarray, np.ndarray | None],
) -> None:
    """Layer 0's unstable pre-activations of N (and of N# when it is a single network) with the
    equality rows that define them (n_pre, h_pre: the columns and their rows): a backend may
    substitute them out (`lucid.solvers.compact`)."""
    (zhat, n_rows), (zhat_h, h_rows) = n_pre, h_pre
    unstable = stability(inputs.n_bounds.lower[0], inputs.n_bounds.upper[0])[2]
    defined[0].append(zhat[unstable])
    defined[1].append(n_rows[unstable])
    if inputs.hyper.exact:
        unstable = stability(inputs.diff.hyper.lower[0], inputs.diff.hyper.upper[0])[2]
        defined[0].append(zhat_h[unstable])
        defined[1].append(h_rows[unstable])


def _relus(build: _Build, k: int, zhat: np.ndarray, zhat_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """3f / 3g: the ReLUs of N (big-M, exact unless `relax_all`) and of N# (big-M, or the triangle
    relaxation where relax-if-similar, 3b's phi_RiS, applies; never for a single network). Returns
    both post-activations."""
    b, inputs, options, relax_all = build.b, build.inputs, build.options, build.relax_all
    stats, cols = build.stats, build.cols
    diff, exact = inputs.diff, inputs.hyper.exact
    nl, nu = inputs.n_bounds.lower[k], inputs.n_bounds.upper[k]
    z, s_n = encode_relu(b, zhat, nl, nu, f"n{k}", relax=np.full(len(nl), relax_all))
    relax = relax_if_similar(diff.pre.lower[k], diff.pre.upper[k], options.ris, options.tau, exact) | relax_all
    zh, s_h = encode_relu(b, zhat_h, diff.hyper.lower[k], diff.hyper.upper[k], f"h{k}", relax=relax)
    cols["n_post"].append(z)
    cols["h_post"].append(zh)
    cols["n_on"].append(s_n["indicator"])
    cols["h_on"].append(s_h["indicator"])
    stats["binaries_n"] += s_n["binaries"]
    stats["binaries_hyper"] += s_h["binaries"]
    stats["relaxed"] += s_h["relaxed"]
    return z, zh


def _post_matching(build: _Build, k: int, layer: ReluColumns) -> None:
    """3b's phi_MD after the ReLU: the relational coupling of z# - z to zhat# - zhat, then the
    matching rows z + dl <= z# <= z + du that the coupling does not already imply."""
    b, options, stats, diff, n_bounds = build.b, build.options, build.stats, build.inputs.diff, build.inputs.n_bounds
    hl, hu = diff.hyper.lower[k], diff.hyper.upper[k]
    coupled = np.zeros(len(layer.zhat), dtype=bool)
    if options.coupling:
        rows, coupled = add_relu_coupling(b, layer, diff.pre.lower[k], diff.pre.upper[k], f"md{k}.relu")
        stats["md_rows"] += rows
    if options.md:
        implied = None
        if options.md_pre:  # the coupling's implication needs dhat's interval as a row
            both_off = stability(n_bounds.lower[k], n_bounds.upper[k])[1] & stability(hl, hu)[1]
            implied = implied_post_rows(
                diff.pre.lower[k], diff.pre.upper[k], diff.post.lower[k], diff.post.upper[k], coupled, both_off
            )
        stats["md_rows"] += add_matching(
            b, layer.z, layer.z_hyper, diff.post.lower[k], diff.post.upper[k], f"md{k}.post", implied=implied
        )


def _objective(
    b: ModelBuilder, n_bounds: LayerBounds, cls: int, margin_upper: np.ndarray | None, beta_lower: float
) -> int:
    """3a: maximise beta. Its column is bounded above by N's smallest margin bound and below by
    the larger of `beta_lower` and the smallest value C_N^c can take: beta* >= min over the
    domain of C_N^c whenever the node is feasible, so that finite floor never cuts off the
    optimum (and keeps every column bounded for rigorous duals). Returns beta's column."""
    nl, nu = n_bounds.lower[-1], n_bounds.upper[-1]
    others = [t for t in range(len(nl)) if t != cls]

    def margin(t: int) -> float:
        interval = nu[cls] - nl[t] + 1e-12 * (abs(nu[cls]) + abs(nl[t]))
        return min(interval, margin_upper[cls, t]) if margin_upper is not None else interval

    beta_ub = min(margin(t) for t in others)
    floor = min(nl[cls] - nu[t] for t in others)
    floor -= 1e-9 * (1 + abs(floor))
    beta = int(b.add_vars(1, min(max(beta_lower, floor), beta_ub), beta_ub, "beta")[0])
    b.objective[beta] = 1.0
    return beta


def _confidence(b: ModelBuilder, beta: int, scores: np.ndarray, cls: int) -> None:
    """3c, N is confident by beta: s_c - s_t >= beta for every t != c (rows beta - s_c + s_t <= 0)."""
    others = [t for t in range(len(scores)) if t != cls]
    b.add_rows(
        np.stack([np.full(len(others), beta), np.full(len(others), scores[cls]), scores[others]], 1),
        [1.0, -1.0, 1.0],
        -np.inf,
        0.0,
        "conf",
    )


def _leak_disjunction(
    b: ModelBuilder, scores_h: np.ndarray, cls: int, targets: list[int], hyper_bounds: LayerBounds, stats: dict
) -> None:
    """3c, N# does not predict c: s#_t >= s#_c for some target t. One row for a single target;
    otherwise one binary q_t per target, sum q >= 1 and s#_t - s#_c >= gap_t (1 - q_t), gap_t < 0
    a lower bound of s#_t - s#_c. When some target always beats c in N#, the disjunction holds
    everywhere and needs no row."""
    hl, hu = hyper_bounds.lower[-1], hyper_bounds.upper[-1]
    if len(targets) == 1:
        t = targets[0]
        b.add_rows(np.array([[scores_h[t], scores_h[cls]]]), [1.0, -1.0], 0.0, np.inf, "leak")
        return
    gaps = np.array([hl[t] - hu[cls] for t in targets])  # lower bounds of s#_t - s#_c
    if np.all(gaps < 0):
        q = b.add_vars(len(targets), 0.0, 1.0, "q", integer=True)
        stats["binaries_out"] = len(targets)
        b.add_rows(q[None, :], np.ones((1, len(targets))), 1.0, np.inf, "leak.any")
        tcols = scores_h[targets]
        b.add_rows(
            np.stack([tcols, np.full(len(targets), scores_h[cls]), q], 1),
            np.stack([np.ones(len(targets)), -np.ones(len(targets)), gaps], 1),
            gaps,
            np.inf,
            "leak",
        )
