"""Symbolic (input-dependent) difference bounds: sound upper bounds on beta*_{c,{i}} for thousands
of leave-one-out networks at once, without a solver.

Problem. For N (position 0 of a stack) and one network N' = N_{-i}, with scores s, s' and
C^c_M(x) = s_c(x) - max_{t != c} s_t(x),

    beta*_{c,{i}} = max { C^c_N(x) : x in [lower, upper], C^c_{N'}(x) <= 0 }      (-inf if infeasible).

If N' ranks t >= c at x then C^c_N(x) <= s_c(x) - s_t(x), so beta* <= max_t beta_t with
beta_t = max { s_c - s_t : s'_c - s'_t <= 0 }. Weak duality: for every lambda_t >= 0,

    beta_t <= max_x [ (s_c - s_t)(x) - lambda_t (s'_c - s'_t)(x) ]                 (Lagrangian)

and beta_t <= margin_upper[c, t] (a sound bound on max_x s_c - s_t). A rival t for which the
bound of max_x (s'_t - s'_c) is < 0 can never be preferred by N' and is dropped; no rival left
means -inf. lambda_t = 1 is the pure difference bound max_x -(d_c - d_t), d = s' - s.

Joint system. With z_k = relu(zhat_k) N's neurons (z_{-1} = x), delta_k = z'_k - z_k and
dW_k = W'_k - W_k, the pre-activation differences are exactly linear:

    zhat_k      = W_k z_{k-1} + b_k
    deltahat_k  = W'_k delta_{k-1} + dW_k z_{k-1} + (b'_k - b_k)              (delta_{-1} = 0)

Every objective above is linear in (zhat_{L-1}, deltahat_{L-1}) (s' = zhat + deltahat). It is
bounded by a CROWN-style backward pass, batched over networks (and objectives):

* N's ReLU (CROWN: a chord above, a free slope alpha in [0, 1] below) and the ReLU difference
  delta = relu(zhat + deltahat) - relu(zhat) (chords of max(0, dh) / min(0, dh), no free slopes),
  both from the layer's intervals: `lucid.bounds.relaxation`.
* The intermediate intervals: [dl, du] and [l', u'] start from the interval propagation of
  `lucid.bounds.difference.difference_bounds`; with `intermediate="symbolic"` (default) each
  hidden layer's deltahat_k (every neuron) and zhat'_k = zhat_k + deltahat_k (where N's neuron is
  stable: elsewhere l', u' hardly ever make N' stable, so the interval ones are kept) are bounded
  by the same backward pass over the already-relaxed layers below (one objective per neuron and
  sign), intersected with the interval ones and with deltahat in [l' - u, u' - l], zhat' in
  [l + dl, u + du].

Optimisation (`steps` > 0): lambda_t >= 0 and the alpha slopes of N's unstable neurons of every
hidden layer (one set per network and rival) are improved by Adam steps on the sum of the bounds,
each iterate projected (lambda clamped at 0, alpha clamped into [0, 1]). Only the (network, rival)
pairs that can still matter are optimised: rivals N' can reach, and with a `cutoff` (the class's
lower bound, for a screen) only pairs whose starting bound is above it. Every iterate is a sound
bound in its own right (any lambda >= 0 and alpha in [0, 1] are valid), so the result is the
minimum over all iterates, the starting point (lambda = 1, CROWN alphas) included.
With more than two classes (`mix`), N's side of branch t is also optimised: C^c_N <= s_c - s_u for
every u != c, hence C^c_N <= sum_u mu_u (s_c - s_u) for mu in the simplex; mu starts at e_t and
is projected back onto the simplex after each step. A computed mu sums to 1 only up to rounding:
sum_u mu_u a_u >= (sum mu) min_u a_u, so the bound also gets |1 - sum mu| (+ T ulps) times a
bound on |C^c_N| (the magnitude pass of s_c - s_u) added.

Floating point. Everything runs in float64. The relaxation intercepts are padded outward by
PAD_REL * (|l| + |u|) so a rounded chord slope can never cut under the ReLU. Every bound
produced by a backward pass (intermediate or final) is then increased by rel * M + FP_ABS,
where M is the same backward pass run on absolute values (|W|, |W'|, |dW|, |b|, |b' - b|, every
slope replaced by its bound 1, every intercept by its absolute value, the box by
max(|lower|, |upper|)), i.e. the sum of the absolute values of all terms of every dot product the
pass computes. By Higham's bound (|fl(sum) - sum| <= gamma_n sum |terms|, n the summation
length, for any summation order, FMA or not) the computed coefficients and constants of a pass
through layers of total inner width n differ from the exact ones by at most gamma_n times that
magnitude pass: rel = max(FP_REL, 2^-52 (6 * total width + 16)) with FP_REL = 1e-11 (as in
`lucid.bounds.interval`), since a pass chains at most ~6 sums per neuron of every layer. The pass is
linear in the absolute initial coefficients, so every iterate's margin is computed from magnitude
passes started at the unit vectors (one per class, for zhat and for deltahat), once per network. The
rounding of dW = fl(W' - W) and db (relative, one ulp) is covered the same way: their terms are in
M. The intersections of intervals are padded by FP_REL times the magnitudes of their operands.

Why not auto_LiRPA: the PyPI release (0.3) pins torch < 1.13 (this project runs torch 2.x), and it
bounds one network at a time, not the joint (z, delta) system of two networks with the
ReLU-difference relaxation, which is the point here; the pass above is ~60 lines of torch.

Limits (measured in benchmarks/results/screen.md): on the tabular workloads every hidden neuron of
N is unstable over the full domain and the deltahat intervals are ~1e-3 wide; there the chords
above are the tightest linear bounds of delta in (zhat, deltahat) jointly (any plane above
relu(zhat + dh) - relu(zhat) on the box must be flat in zhat when 0 is inside [l, u]), so what
is left between these bounds and beta* is the single-neuron relaxation gap, closed only by splitting
(the MILP / BaB).

Refinement (`refine_steps` > 0, off by default): the networks still above the cutoff are bounded
again with the intermediate bounds themselves alpha-optimised (N's lower slopes per intermediate
objective, Adam, minimum over iterates). Measured on digits 2x20 (classes 2 / 3): +1.8 / +1.4
points discarded for ~5x the time, so it is an option for a later tier, not the default.

Sets of networks: the quantity the BaB needs for a node S is an upper bound on
max_{i in S} beta*_{c,{i}}; `set_upper_bound` returns the max of the members' singleton bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from lucid.adam import Adam
from lucid.bounds.interval import FP_ABS
from lucid.bounds.joint import JointSystem, SymbolicDifference, _np, projected_adam_step
from lucid.bounds.pair import PairProblem
from lucid.bounds.relaxation import DTYPE
from lucid.deadline import paced, past

OPTIMISE_STEPS = 60  # Adam steps of the optimised screen (benchmarks/results/screen.md: 60 at lr 0.02)


@dataclass(frozen=True, eq=False)
class ScreenOptions:
    """How `singleton_upper_bounds` bounds its networks; the defaults are the plain symbolic screen
    (eq=False: `lam` may be an array).

    lam: the starting lambda, a scalar or [K, C] per network and rival; alpha: None = CROWN's
    default slopes, else one starting slope in [0, 1] for every unstable neuron of N; steps:
    projected Adam steps at rate lr (0 = just the starting point); mix: with more than two classes,
    also optimise the weights mu over rivals u of N's objective (module docstring); refine_steps:
    bound the networks still above the cutoff again with alpha-optimised intermediate bounds (that
    many Adam steps per layer), keeping per rival the smaller bound; intermediate: "symbolic" or
    "interval" intermediate intervals (`JointSystem`); device: where the tensors live; chunk: the
    networks bounded together (memory)."""

    lam: float | np.ndarray = 1.0
    alpha: float | None = None
    steps: int = 0
    lr: float = 0.02
    mix: bool = True
    refine_steps: int = 0
    intermediate: str = "symbolic"
    device: str = "cpu"
    chunk: int = 512

    @classmethod
    def optimised(cls, device: str = "cpu") -> ScreenOptions:
        """The optimised screen's: OPTIMISE_STEPS Adam steps from lambda = 1 and CROWN's slopes."""
        return cls(steps=OPTIMISE_STEPS, device=device)


@dataclass
class SingletonBounds:
    bound: np.ndarray  # [K] sound upper bound on beta*_{c,{i}} (-inf: no input can leak)
    per_target: np.ndarray  # [K, C] the bound per rival t (-inf: t dropped or t == c), margin cap applied
    lagrangian: np.ndarray  # [K, C] the best Lagrangian bound per rival (before the cap; nan for c)
    iterates: list[np.ndarray] = field(default_factory=list)  # [K, C] sound Lagrangian bound of every iterate


def difference_intervals(
    pair: PairProblem, *, intermediate: str = "symbolic", device: str = "cpu", intermediate_steps: int = 0
) -> SymbolicDifference:
    """Sound intervals of deltahat_k = zhat'_k - zhat_k and zhat'_k for every network N' of `pair`
    (all layers). The last layer's intervals come from the backward pass too.
    intermediate_steps: alpha-optimise N's lower slopes per bound (that many Adam steps)."""
    sys_ = JointSystem(pair, device=device, intermediate=intermediate, intermediate_steps=intermediate_steps)
    k = sys_.L - 1
    dl, du, hl, hu = sys_._tighten(k, sys_.dl[k], sys_.du[k], sys_.hl[k], sys_.hu[k], every=True)
    sys_.dl[k], sys_.du[k], sys_.hl[k], sys_.hu[k] = dl, du, hl, hu
    return sys_.differences()


def singleton_upper_bounds(
    pair: PairProblem,
    cls: int,
    margin_upper: np.ndarray | None = None,
    options: ScreenOptions = ScreenOptions(),
    *,
    cutoff: float | None = None,
    keep_iterates: bool = False,
    deadline: float | None = None,
) -> SingletonBounds:
    """Sound upper bounds on beta*_{cls,{i}} for the K networks N' of `pair` against N (module docstring).

    margin_upper [C, C]: sound bounds on max_x s_c - s_t (optional cap). cutoff: only networks
    whose starting bound is above it are optimised (the others keep their starting bound, already
    <= cutoff: a screen needs nothing more of them), and only those still above it are refined
    (all, without one). keep_iterates: the result's `iterates` (those of the first pass).
    deadline (time.monotonic()): the networks are bounded in chunks sized to end near it, the
    optimisation stops there with the best iterate so far (each is sound), and the networks no
    chunk reached by then get +inf (nothing proved) in `bound` and `per_target`."""
    K = pair.count
    C = pair.n_weights[-1].shape[0]
    lam, alpha = options.lam, options.alpha
    lam_arr = (
        np.broadcast_to(np.asarray(lam, dtype=np.float64), (K, C)) if np.ndim(lam) else np.full((K, C), float(lam))
    )
    if np.any(lam_arr < 0) or (alpha is not None and not 0 <= alpha <= 1):
        raise ValueError("lambda must be >= 0 and alpha in [0, 1]")
    bound = np.full(K, np.inf)
    per_target = np.full((K, C), np.inf)
    lagr = np.full((K, C), np.nan)
    iterates: list[np.ndarray] = []
    for sl in paced(K, options.chunk, deadline):
        part = pair.networks(sl)
        res = _chunk_bounds(
            _system(part, options), cls, margin_upper, lam_arr[sl], options, cutoff, keep_iterates, deadline
        )
        if options.refine_steps > 0 and options.intermediate == "symbolic":
            # the networks still above the cutoff again, with alpha-optimised intermediate bounds
            idx = np.flatnonzero(res.bound > (-np.inf if cutoff is None else cutoff))
            if len(idx):
                refined = _system(part.networks(idx), options, options.refine_steps)
                ref = _chunk_bounds(refined, cls, margin_upper, lam_arr[sl][idx], options, None, False, deadline)
                res.per_target[idx] = np.minimum(res.per_target[idx], ref.per_target)
                res.lagrangian[idx] = np.fmin(res.lagrangian[idx], ref.lagrangian)
                res.bound[idx] = res.per_target[idx].max(axis=1)
        bound[sl], per_target[sl], lagr[sl] = res.bound, res.per_target, res.lagrangian
        for i, it in enumerate(res.iterates):
            if len(iterates) <= i:
                iterates.append(np.full((K, C), np.nan))
            iterates[i][sl] = it
    return SingletonBounds(bound, per_target, lagr, iterates)


def _system(pair: PairProblem, options: ScreenOptions, intermediate_steps: int = 0) -> JointSystem:
    """The joint system of a chunk, with the intermediate bounds `options` ask for."""
    return JointSystem(
        pair, device=options.device, intermediate=options.intermediate, intermediate_steps=intermediate_steps
    )


def class_screens(
    pair: PairProblem,
    classes: list[int],
    margin_upper: np.ndarray | None = None,
    *,
    device: str = "cpu",
    chunk: int = 512,
    deadline: float | None = None,
) -> np.ndarray:
    """`singleton_upper_bounds(pair, c, margin_upper).bound` (lambda = 1, no steps: the symbolic
    screen) for every class c of `classes`, [len(classes), K]. Only the objective depends on the
    class, so each chunk's joint system (its intermediate bounds: most of a screen's time) is
    built once for all the classes. deadline (time.monotonic()): chunks sized to end near it, and
    +inf for the networks none reached by then."""
    K, C = pair.count, pair.n_weights[-1].shape[0]
    out = np.full((len(classes), K), np.inf)
    for sl in paced(K, chunk, deadline):
        part = pair.networks(sl)
        plain = ScreenOptions(device=device)
        system = _system(part, plain)
        ones = np.ones((part.count, C))
        for j, c in enumerate(classes):
            out[j, sl] = _chunk_bounds(system, c, margin_upper, ones, plain, None, False).bound
    return out


def set_upper_bound(
    pair: PairProblem, cls: int, margin_upper: np.ndarray | None = None, options: ScreenOptions = ScreenOptions()
) -> float:
    """Upper bound on max_{i in S} beta*_{cls,{i}} for the set S of networks N' of `pair` (max of singletons)."""
    res = singleton_upper_bounds(pair, cls, margin_upper, options)
    return float(res.bound.max()) if len(res.bound) else -math.inf


def _simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of every row (last axis) onto the probability simplex."""
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    ind = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    rho = ((u - css / ind) > 0).sum(-1, keepdim=True).clamp(min=1)
    theta = css.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp(min=0)


def _chunk_bounds(
    sys_: JointSystem,
    cls: int,
    margin_upper: np.ndarray | None,
    lam0: np.ndarray,
    options: ScreenOptions,
    cutoff: float | None,
    keep_iterates: bool,
    deadline: float | None = None,
) -> SingletonBounds:
    """`singleton_upper_bounds` of one chunk, from its joint system `sys_` (built once for every
    class: it does not depend on the class); lam0: the starting lambda [K, C]; the optimisation
    stops at `deadline` (time.monotonic()) with the iterates it has, every one of them sound."""
    alpha0, steps, lr, mix = options.alpha, options.steps, options.lr, options.mix
    K, L, dev = sys_.K, sys_.L, sys_.device
    C = sys_.W[-1].shape[0]
    rivals = [t for t in range(C) if t != cls]
    T = len(rivals)
    g = torch.zeros(T, C, dtype=DTYPE, device=dev)  # rows: e_c - e_t
    for j, t in enumerate(rivals):
        g[j, cls], g[j, t] = 1.0, -1.0
    G = g.expand(K, -1, -1)
    # magnitude passes from the unit vectors: the pass is linear in |A|, |E|, so every objective's
    # FP margin is a combination of these
    unit = torch.eye(C, dtype=DTYPE, device=dev).expand(K, C, C)
    mz = sys_.magnitude(unit, torch.zeros_like(unit), L - 1)  # [K, C]: the pass from A = e_j
    md = sys_.magnitude(torch.zeros_like(unit), unit, L - 1)  # [K, C]: the pass from E = e_j
    mag_a = mz[:, [cls]] + mz[:, rivals]  # [K, T]: |s_c - s_t| <= this (bounds |C^c_N| too)
    # feasibility of each rival: can N' rank t >= c? (bound of s'_t - s'_c, and the interval one)
    with torch.no_grad():
        reach = sys_.backward(-G, -G, L - 1) + sys_.fp_rel * (mag_a + md[:, [cls]] + md[:, rivals]) + FP_ABS
    hl, hu = sys_.hl[L - 1], sys_.hu[L - 1]
    # written as 'not provably negative', so a NaN (a diverged network) counts as reachable
    feasible = _np(~((reach < 0) | (hu[:, rivals] - hl[:, [cls]] < 0)))
    cap = np.full(T, np.inf) if margin_upper is None else np.asarray(margin_upper, dtype=np.float64)[cls, rivals]
    lam_start = torch.tensor(lam0[:, rivals], dtype=DTYPE, device=dev)

    def run(pn: np.ndarray, pj: np.ndarray, n_steps: int) -> list[torch.Tensor]:
        """Sound Lagrangian bounds [P] of every iterate for the (network, rival) pairs (pn, pj)."""
        P, grad = len(pn), n_steps > 0
        sub = sys_.select(pn, light=True)
        pn_t, pj_t = torch.as_tensor(pn, device=dev), torch.as_tensor(pj, device=dev)
        Gp = G[pn_t, pj_t][:, None, :]  # [P, 1, C]
        lam = lam_start[pn_t, pj_t].clone().requires_grad_(grad)
        alphas = []
        for k in range(L - 1):
            r = sub.relax[k]
            a = (
                r.sl[:, None, :].clone()
                if alpha0 is None
                else torch.full((P, 1, r.sl.shape[1]), float(alpha0), dtype=DTYPE, device=dev)
            )
            alphas.append(a.requires_grad_(grad))
        params = [lam, *alphas]
        mu = None
        if mix and T > 1 and grad:  # weights of N's objective over the rivals u, starting at e_t
            Gall = G[pn_t]  # [P, T, C]
            mu = torch.nn.functional.one_hot(pj_t, T).to(DTYPE)[:, None, :].requires_grad_(True)
            params.append(mu)
            bound_c = mag_a[pn_t].max(-1).values  # bounds |C^c_N| over the box
        mzp, mdp = mz[pn_t][:, None, :], md[pn_t][:, None, :]
        opt = Adam(params, lr=lr) if grad else None
        out = []
        for step in range(n_steps + 1):
            last = step == n_steps
            plain = mu is None or step == 0  # mu starts at exactly e_t: the plain objective
            with torch.set_grad_enabled(not last):
                lam3 = lam[:, None, None]
                A = (1 - lam3) * Gp if plain else torch.bmm(mu, Gall) - lam3 * Gp
                E = -lam3 * Gp
                val = sub.backward(A, E, L - 1, alphas)[:, 0]
            with torch.no_grad():  # the magnitude pass is linear in |A|, |E|: per-class unit passes
                mag = (A.abs() * mzp).sum(-1)[:, 0] + (E.abs() * mdp).sum(-1)[:, 0]
                if not plain:  # sum(mu) is 1 only up to rounding (docstring)
                    total = mu.sum(-1)[:, 0]
                    mag = mag + ((1 - total).abs() + T * 2.0**-52 * total) * bound_c
                sound = val.detach() + sys_.fp_rel * mag + FP_ABS
            out.append(torch.where(torch.isnan(sound), torch.full_like(sound, math.inf), sound))
            if last or past(deadline):
                break
            projected_adam_step(
                opt,
                val.sum(),
                nonneg=[lam],
                unit=alphas,
                project=None if mu is None else lambda: mu.copy_(_simplex(mu)),
            )
        return out

    # every pair at the starting point, then the optimisation on the pairs that can still matter:
    # rivals N' can reach, and with a cutoff only those whose (capped) start is above it
    with torch.no_grad():  # batched: T objectives per network
        alphas0 = (
            None
            if alpha0 is None
            else [torch.full((K, T, r.sl.shape[1]), float(alpha0), dtype=DTYPE, device=dev) for r in sys_.relax]
        )
        A, E = (1 - lam_start)[..., None] * G, -lam_start[..., None] * G
        val = sys_.backward(A, E, L - 1, alphas0)
        mag = (A.abs() * mz[:, None, :]).sum(-1) + (E.abs() * md[:, None, :]).sum(-1)
        start = val + sys_.fp_rel * mag + FP_ABS
        start = torch.where(torch.isnan(start), torch.full_like(start, math.inf), start)
    its = [start]
    if steps > 0 and T:
        capped = np.minimum(_np(start), cap[None, :])
        keep = feasible & ((capped > cutoff) if cutoff is not None else True)
        pn, pj = np.nonzero(keep)
        its = [start.clone() for _ in range(steps + 1)]
        if len(pn):
            ix = (torch.as_tensor(pn, device=dev), torch.as_tensor(pj, device=dev))
            for i, it in enumerate(run(pn, pj, steps)):
                its[i][ix] = it
    best_np = _np(torch.stack(its).min(dim=0).values)
    cand = np.where(feasible, np.minimum(best_np, cap[None, :]), -np.inf)
    per_target = np.full((K, C), -np.inf)
    per_target[:, rivals] = cand
    lagr = np.full((K, C), np.nan)
    lagr[:, rivals] = best_np
    iterates = []
    for it in its if keep_iterates else []:
        full = np.full((K, C), np.nan)
        full[:, rivals] = _np(it)
        iterates.append(full)
    return SingletonBounds(cand.max(axis=1) if T else np.full(K, -np.inf), per_target, lagr, iterates)
