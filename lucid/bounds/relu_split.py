"""ReLU-splitting branch and bound on one leave-one-out network's bound beta*_{c,{i}}, batched
over domains in torch: the tier between the symbolic screen and the singleton MILP.

The quantity (`lucid.bounds.symbolic`): for a rival t, beta_t = max { (s_c - s_t)(x) : x in the
box, (s'_c - s'_t)(x) <= 0 }, and beta*_{c,{i}} <= max_t beta_t. The symbolic bound relaxes every
unstable ReLU of N and of N' at once; what it leaves above beta_t is that relaxation's gap, which
only splitting closes. A *domain* fixes the sign of some pre-activations: of N's neurons
(zhat_j >= 0 or <= 0) and of N''s (zhat'_j = zhat_j + deltahat_j >= 0 or <= 0). The domains of a
split partition the box's trajectories, so beta_t is the maximum over the open domains, and a
domain whose bound is <= the cutoff is closed for good.

Bound of a domain (beta-CROWN's idea on the joint system of `lucid.bounds.joint`):
* the split neurons' intervals are cut at 0, and the intervals of zhat, zhat' and deltahat are
  made consistent through zhat' = zhat + deltahat (each derived bound padded outward by
  FP_REL times its operands, + FP_ABS; a domain whose intervals cross is empty, hence closed);
* the ReLU and ReLU-difference relaxations are rebuilt from those intervals (a split neuron is
  stable: its relaxation is exact);
* each split constraint enters the objective as a Lagrangian term beta_j * s_j * zhat_j (s_j = +1
  for ">= 0", -1 for "<= 0", beta_j >= 0), which is >= 0 on the domain and so never lowers the
  domain's maximum: max_dom f <= max_dom (f + terms) <= the backward pass of f + terms over the
  relaxation, a superset of the domain's trajectories;
* the objective (s_c - s_t) - lambda (s'_c - s'_t) (lambda >= 0, weak duality), N's lower slopes
  alpha and the betas are improved by projected Adam steps, warm-started from the parent; with
  more than two classes N's side is sum_u mu_u (s_c - s_u) with mu on the rivals' simplex (as in
  `lucid.bounds.symbolic`: C^c_N is at most any such mix), which a domain can adapt to the rival
  that is N's runner-up there. Every iterate is sound, and the domain keeps the smallest, further
  capped by its parent's bound (a subset's maximum is at most its superset's);
* a domain where N' cannot rank t >= c at all (the pass's bound of s'_t - s'_c is < 0) is empty;
* a domain with every neuron of N and N' stable uses delta's exact form where the two differ
  (`lucid.bounds.joint._diff_relax`): its Lagrangian is then exact at the optimal multipliers,
  which are those of an LP over the box (`_Brancher.lp_start`); an infeasible LP gives
  multipliers that prove the domain empty (`_certify_empty`). Either way the bound is still the
  backward pass with its margin, followed by more Adam steps (LEAF_STEPS): it is final.
Step sizes follow each parameter's units. N's slopes alpha and the mix mu are dimensionless
(in [0, 1], on a simplex): `alpha_lr` as is. A beta multiplies a pre-activation, so one unit of it
moves the bound by about |zhat_j|: `lr` times the root bound's magnitude keeps its steps a small
share of the bound. Lambda's is `lam_lr` times that magnitude over the range of N''s margin (the
bound moves by about that range per unit of lambda: on Adult 2x50's hardest network, steps of
0.05 instead of 0.0005 left the bound at 0.0277 after 30 s, where the small steps proved 0.0206 in
18 s). Children start from their parent's parameters, so a beta step that is large against the
bound throws a good start away, while alpha, on its own scale, may move fast: one step size for
all of them (0.0047 on that network) took 1.7x the domains there and left the next network open
(benchmarks/results/split_tier.md).
Floating point as in `lucid.bounds.symbolic`: the best iterate's value gets fp_rel times its
magnitude pass (the betas' absolute values included) + FP_ABS, and a mix mu that sums to 1 only up
to rounding adds |1 - sum mu| (+ C ulps) times a bound on |s_c - s_u| from N's margins.

Branching: the unsplit neuron (of N or of N') whose relaxation intercepts contribute most to
the domain's bound (BaBSR's score on the backward pass's chord terms; strong branching on the
best four candidates, each child bounded by one pass, took 2.2x the domains on Adult's top
network, so it is not used). The batch of open domains with the largest bounds is split each
round, then depth first beyond `max_domains` (`_search`). The result is always a sound upper
bound: the maximum of the open domains' bounds and of the closed ones'.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lucid.bounds.interval import FP_ABS
from lucid.bounds.joint import (DTYPE, JointSystem, _all_stable, _diff_relax, _np, _relu_relax, _Relax, consistent,
                                outward_pad, projected_adam_step)
from lucid.bounds.symbolic import _simplex


LEAF_STEPS = 200  # Adam steps for a domain with nothing left to split (its bound is then final)
LEAK_STARTS = 4  # leak searches from the highest open domains of an unproved network
TRACE_EVERY = 1.0  # seconds between two points of a search's recorded bound
# `split_singleton` checks once, after CHECK_SHARE of its time, whether the split is on track to
# prove the cutoff, and hands the rest of its time to the MILP when it is not: when its bound is
# still more than GIVE_UP_EXCESS (relative) above the cutoff, or when a leak at the cutoff is found
# (no relaxation proves a network below a level at which it leaks). Measured on the class's last
# networks (one thread, benchmarks/results/split_tier.md, "When the split gives up"): Adult 2x50's
# witness network 1941, which only the split proves, was 7.2 % above its cutoff after 60 s and 3.0 %
# after 240 s; Crypto 2x100's 1526 and 1387, which only the MILP proved, 39 % / 25 % and 14 % / 8.6 %.
CHECK_SHARE = 0.25
GIVE_UP_EXCESS = 0.05


@dataclass
class _Checkpoint:
    """`split_upper_bound`'s checkpoint: asked once per network, whichever rival's search passes
    its time first (the searches of one network share this object)."""

    at: float  # seconds since the network's split started
    hopeless: object  # (bound, xs) -> bool
    asked: bool = False


@dataclass
class SplitResult:
    """The outcome of `split_upper_bound` for one network and class."""

    bound: float  # sound upper bound on beta*_{c,{i}} (-inf: no input can leak)
    proved: bool  # bound <= cutoff
    domains: int  # domains bounded
    seconds: float
    per_target: dict[int, float]  # the bound per rival t that N' can reach
    starts: np.ndarray | None = None  # [n, d] where the highest open domains attain their bounds (unproved only)
    witness: object | None = None  # a replayed leak found from `starts` (`split_singleton`), or None
    trace: list[tuple[float, float]] = field(default_factory=list)  # (seconds, the searched rival's bound) as it fell
    gave_up: bool = False  # stopped at the checkpoint (`split_upper_bound`'s `checkpoint`), not at the time limit


@dataclass
class _Domains:
    """Open domains of one (network, rival) branch and bound; every tensor has the domain axis first."""

    sn: list[torch.Tensor]  # [D, n_k] split sign of N's neuron: +1 (>= 0), -1 (<= 0), 0 (free)
    sp: list[torch.Tensor]  # the same for N''s neuron zhat'_k
    lam: torch.Tensor  # [D]
    alpha: list[torch.Tensor]  # [D, n_k] N's lower slopes
    beta_n: list[torch.Tensor]  # [D, n_k] >= 0, the multipliers of N's splits
    beta_p: list[torch.Tensor]  # [D, n_k] >= 0, the multipliers of N''s splits
    mu: torch.Tensor  # [D, C] weights of N's objective over the rivals u (a point of the simplex, 0 at c)
    x: torch.Tensor  # [D, d] the box corner where the domain's bound is attained (a start for a leak search)
    bound: torch.Tensor  # [D] sound upper bound of the domain
    choice: torch.Tensor  # [D] the neuron to split next (flat index, -1: nothing left to split)

    def __len__(self) -> int:
        return len(self.bound)

    def take(self, idx: torch.Tensor) -> "_Domains":
        pick = lambda xs: [x[idx] for x in xs]  # noqa: E731
        return _Domains(pick(self.sn), pick(self.sp), self.lam[idx], pick(self.alpha), pick(self.beta_n),
                        pick(self.beta_p), self.mu[idx], self.x[idx], self.bound[idx], self.choice[idx])

    @staticmethod
    def cat(parts: list["_Domains"]) -> "_Domains":
        parts = [p for p in parts if len(p)] or parts[:1]
        join = lambda name: [torch.cat([getattr(p, name)[k] for p in parts]) for k in range(len(getattr(parts[0], name)))]  # noqa: E731
        flat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        return _Domains(join("sn"), join("sp"), flat("lam"), join("alpha"), join("beta_n"), join("beta_p"), flat("mu"),
                        flat("x"), flat("bound"), flat("choice"))


def _signs(d: _Domains) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The split signs of N's and N''s neurons as [D, 1, n] floats per hidden layer."""
    return [s.to(DTYPE)[:, None, :] for s in d.sn], [s.to(DTYPE)[:, None, :] for s in d.sp]


def _split_terms(signs: tuple[list, list], beta_n: list[torch.Tensor], beta_p: list[torch.Tensor]) -> list:
    """Per hidden layer, the Lagrangian coefficients (s_j beta_j of zhat_j, s_j beta'_j of zhat'_j),
    [D, 1, n] each, for `JointSystem.backward`'s `splits` (signs: `_signs`; beta_n, beta_p: [D, 1, n]
    per layer)."""
    return [(sn * b1, sp * b2) for sn, sp, b1, b2 in zip(*signs, beta_n, beta_p)]


def _peaks(parts: list[_Domains]) -> np.ndarray:
    """[<= LEAK_STARTS, d]: where the highest open domains of `parts` attain their bounds (where a
    leak above the cutoff would most likely be)."""
    top = _Domains.cat([d.take(torch.argsort(d.bound, descending=True)[:LEAK_STARTS]) for d in parts if len(d)])
    return top.x[torch.argsort(top.bound, descending=True)[:LEAK_STARTS]].cpu().numpy()


class _Brancher:
    """The branch and bound of one network N' and one rival t."""

    def __init__(self, root: JointSystem, cls: int, rival: int, steps: int, lr: float, lam_lr: float,
                 alpha_lr: float, mix_bound: float | None = None) -> None:
        """mix_bound: a bound on |s_c - s_u| over the box for every u (more than two classes):
        N's side of the objective then mixes the rivals (module docstring); None: it does not."""
        self.root, self.steps, self.lr, self.lam_lr, self.alpha_lr = root, steps, lr, lam_lr, alpha_lr
        self.cls, self.rival, self.mix_bound = cls, rival, mix_bound
        self.L = root.L
        self.sizes = [w.shape[0] for w in root.W[:-1]]
        self.offsets = np.cumsum([0] + [2 * n for n in self.sizes])
        C = root.W[-1].shape[0]
        g = torch.zeros(C, dtype=DTYPE, device=root.device)
        g[cls], g[rival] = 1.0, -1.0
        self.g = g
        self.rival_idx = torch.tensor([u for u in range(C) if u != cls], device=root.device)  # mu's simplex
        self.evaluated = 0

    # -------------------------------------------------------------- one batch of domains
    def _system(self, d: _Domains, leaves: bool = False) -> tuple[JointSystem, torch.Tensor, list]:
        """The root system repeated over the domains, with each domain's intervals and
        relaxations; a mask [D] of the domains found empty; per hidden layer the domain's
        intervals (l, u, hl, hu) of zhat and zhat'. leaves: the domains have every neuron stable,
        so delta takes its exact form where N and N' differ (`lucid.bounds.joint._diff_relax`)."""
        D = len(d)
        sys_ = self.root.select(np.zeros(D, dtype=np.int64))
        empty = torch.zeros(D, dtype=torch.bool, device=self.root.device)
        relax, intervals = [], []
        exact_below = torch.ones(D, dtype=torch.bool, device=self.root.device) if leaves else None
        for k in range(self.L - 1):
            l = self.root.nl[k].expand(D, -1)
            u = self.root.nu[k].expand(D, -1)
            dl, du = self.root.dl[k].expand(D, -1), self.root.du[k].expand(D, -1)
            hl, hu = self.root.hl[k].expand(D, -1), self.root.hu[k].expand(D, -1)
            sn, sp = d.sn[k], d.sp[k]
            l = torch.where(sn > 0, l.clamp(min=0), l)
            u = torch.where(sn < 0, u.clamp(max=0), u)
            hl = torch.where(sp > 0, hl.clamp(min=0), hl)
            hu = torch.where(sp < 0, hu.clamp(max=0), hu)
            # zhat' = zhat + deltahat, each derived bound padded outward
            dl, du, hl, hu = consistent(l, u, dl, du, hl, hu)
            l = torch.maximum(l, hl - du - outward_pad(hl, du))
            u = torch.minimum(u, hu - dl + outward_pad(hu, dl))
            empty |= ((l > u) | (hl > hu) | (dl > du)).any(-1)
            su, tu, sl, unst = _relu_relax(l, u)
            pu, qu, pl, ql, pz = _diff_relax(l, u, hl, hu, dl, du, exact_below)
            if exact_below is not None:
                exact_below = exact_below & _all_stable(l, u, hl, hu)
            relax.append(_Relax(su, tu, sl, unst, pu, qu, pl, ql, pz))
            intervals.append((l, u, hl, hu))
        sys_.relax = relax
        return sys_, empty, intervals

    def bound(self, d: _Domains, steps: int | None = None, leaves: bool = False) -> _Domains:
        """Bound every domain of `d` (in place: parameters, bound, choice) and return it.
        leaves: the domains have nothing left to split (`_system`)."""
        steps = self.steps if steps is None else steps
        D = len(d)
        self.evaluated += D
        sys_, empty, intervals = self._system(d, leaves)
        g = self.g.expand(D, 1, -1)
        lam = d.lam.clone().requires_grad_(True)
        mix = self.mix_bound is not None
        mu = d.mu.clone().requires_grad_(mix)
        e_c = torch.zeros_like(self.g)
        e_c[self.cls] = 1.0
        alphas = [a.clone()[:, None, :].requires_grad_(True) for a in d.alpha]
        bn = [b.clone()[:, None, :].requires_grad_(True) for b in d.beta_n]
        bp = [b.clone()[:, None, :].requires_grad_(True) for b in d.beta_p]
        signs = _signs(d)  # once: every step's objective needs them
        opt = torch.optim.Adam([{"params": [lam], "lr": self.lam_lr}, {"params": [*bn, *bp], "lr": self.lr},
                                {"params": [*alphas, *([mu] if mix else [])], "lr": self.alpha_lr}])
        best = torch.full((D,), math.inf, dtype=DTYPE, device=g.device)
        keep = [lam.detach().clone(), [a.detach().clone() for a in alphas], [b.detach().clone() for b in bn],
                [b.detach().clone() for b in bp], mu.detach().clone()]

        def objective():
            lam3 = lam[:, None, None]
            # sum_u mu_u (e_c - e_u) - lambda (e_c - e_t): N's side mixes the rivals (mu = e_t: plain)
            A = (mu.sum(1)[:, None, None] * e_c - mu[:, None, :]) - lam3 * g
            E = -lam3 * g
            return A, E, _split_terms(signs, bn, bp)

        for step in range(steps + 1):
            last = step == steps
            with torch.set_grad_enabled(not last):
                A, E, splits = objective()
                val = sys_.backward(A, E, self.L - 1, alphas, splits)[:, 0]
            v = val.detach()
            v = torch.where(torch.isnan(v), torch.full_like(v, math.inf), v)
            better = v < best
            best = torch.where(better, v, best)
            keep[0] = torch.where(better, lam.detach(), keep[0])
            keep[4] = torch.where(better[:, None], mu.detach(), keep[4])
            for group, cur in zip(keep[1:4], (alphas, bn, bp)):
                for i, p in enumerate(cur):
                    group[i] = torch.where(better[:, None, None], p.detach(), group[i])
            if last:
                break
            projected_adam_step(opt, val.sum(), nonneg=[lam, *bn, *bp], unit=alphas,
                                project=self._project_mu(mu) if mix else None)
        # the best iterate, again, with its floating-point margin and the branching scores
        with torch.no_grad():
            lam[:], alphas, bn, bp = keep[0], keep[1], keep[2], keep[3]
            mu = keep[4]
            A, E, splits = objective()
            trace: list = []
            val = sys_.backward(A, E, self.L - 1, alphas, splits, trace=trace)[:, 0]
            mag = sys_.magnitude(A, E, self.L - 1, splits)[:, 0]
            sound = val + sys_.fp_rel * mag + FP_ABS
            if mix:  # sum(mu) is 1 only up to rounding: C^c_N <= sum mu_u a_u + |1 - sum mu| |C^c_N|
                total = mu.sum(1)
                sound = sound + ((1 - total).abs() + len(self.g) * 2.0 ** -52 * total) * self.mix_bound
            sound = torch.where(torch.isnan(sound), torch.full_like(sound, math.inf), sound)
            # a domain where N' cannot rank t >= c (CROWN bound of s'_t - s'_c below 0) is empty too
            reach = sys_.backward(-g, -g, self.L - 1, alphas, splits)[:, 0]
            reach = reach + sys_.fp_rel * sys_.magnitude(-g, -g, self.L - 1, splits)[:, 0] + FP_ABS
            sound = torch.where(empty | (reach < 0), torch.full_like(sound, -math.inf), sound)
            d.bound = torch.minimum(d.bound, sound)
            d.lam = keep[0]
            d.mu = keep[4]
            d.alpha = [a[:, 0] for a in alphas]
            d.beta_n = [b[:, 0] for b in bn]
            d.beta_p = [b[:, 0] for b in bp]
            coef = trace.pop()[:, 0]  # of the input
            d.x = torch.where(coef > 0, sys_.hi, sys_.lo)
            d.choice = self._choose(d, sys_.relax, intervals, alphas, trace[::-1])
        return d

    @torch.no_grad()
    def lp_start(self, d: _Domains) -> _Domains:
        """Start each domain of `d` (leaves: every neuron stable) from the optimal multipliers of
        its exact problem, and return it.

        With every neuron's state fixed, N's and N''s scores are affine in x on the domain, so
        beta_t there is an LP over the box: max (s_c - s_t)(x) (with mixing: max y, y <= (s_c -
        s_u)(x) for each rival u) s.t. s_j zhat_j(x) >= 0 for N's split neurons, the same for
        N''s, and (s'_c - s'_t)(x) <= 0 (the other neurons' states hold on the whole domain, so
        their constraints are implied). Its dual multipliers are exactly this module's lambda,
        betas and mu, and the Lagrangian's maximum over the box is the LP's optimum: Adam steps
        alone only approach it (Adult 2x50's witness network: leaves ended 20 % above beta*).
        Only the multipliers are taken from the LP solver (`lucid.solvers.lp`); the bound is
        still the backward pass with its floating-point margin, so a wrong LP answer can only
        loosen it."""
        from lucid.solvers.lp import inequality_multipliers

        root, D = self.root, len(d)
        sys_, empty, intervals = self._system(d, leaves=True)
        certified: list[int] = []  # domains whose LP is infeasible, with the multipliers proving it
        n_form, p_form = (root.W[0].expand(D, -1, -1), root.b[0].expand(D, -1)), (root.Wp[0][0].expand(D, -1, -1),
                                                                                     (root.b[0] + root.db[0][0]).expand(D, -1))
        forms = []
        for k in range(self.L - 1):  # zhat_k, zhat'_k = M x + c under each domain's states
            forms.append((n_form, p_form))
            l, _, hl, _ = intervals[k]
            w_n, b_n, w_p, b_p = root.W[k + 1], root.b[k + 1], root.Wp[k + 1][0], root.b[k + 1] + root.db[k + 1][0]
            n_form = (w_n @ ((l >= 0).to(DTYPE)[..., None] * n_form[0]), ((l >= 0) * n_form[1]) @ w_n.T + b_n)
            p_form = (w_p @ ((hl >= 0).to(DTYPE)[..., None] * p_form[0]), ((hl >= 0) * p_form[1]) @ w_p.T + b_p)
        (mn, cn), (mp, cp) = n_form, p_form
        c, t, dim = self.cls, self.rival, root.lo.shape[0]
        mix = self.mix_bound is not None
        rivals = self.rival_idx.tolist()
        lo, hi = _np(root.lo), _np(root.hi)
        for i in torch.nonzero(~empty).flatten().tolist():
            rows, rhs, where = [], [], []  # where: ("n" | "p", layer, neuron) of each split row
            for k, ((fm, fc), (gm, gc)) in enumerate(forms):
                for side, signs, (m_, c_) in (("n", d.sn[k][i], (fm[i], fc[i])), ("p", d.sp[k][i], (gm[i], gc[i]))):
                    for j in torch.nonzero(signs).flatten().tolist():
                        s_ = float(signs[j])
                        rows.append(-s_ * m_[j])
                        rhs.append(s_ * float(c_[j]))
                        where.append((side, k, j))
            rows.append(mp[i, c] - mp[i, t])  # N' does not pick c over t
            rhs.append(-float(cp[i, c] - cp[i, t]))
            a = torch.stack(rows).cpu().numpy()
            b = np.array(rhs)
            if mix:  # x and y; y <= (s_c - s_u)(x) for every rival u
                mix_rows = np.stack([np.append(-_np(mn[i, c] - mn[i, u]), 1.0) for u in rivals])
                a = np.vstack([np.hstack([a, np.zeros((len(a), 1))]), mix_rows])
                b = np.concatenate([b, [float(cn[i, c] - cn[i, u]) for u in rivals]])
                obj = np.append(np.zeros(dim), 1.0)
                bounds = (np.append(lo, -np.inf), np.append(hi, np.inf))
            else:
                obj, bounds = _np(mn[i, c] - mn[i, t]), (lo, hi)
            y = inequality_multipliers(obj, a, b, *bounds)
            if y is None:  # perhaps no input reaches the domain: min over x of max_r (a x - b)_r > 0?
                rows_ = len(where) + 1
                y = inequality_multipliers(np.append(np.zeros(dim), -1.0), np.hstack([a[:rows_, :dim], -np.ones((rows_, 1))]),
                                           b[:rows_], np.append(lo, -np.inf), np.append(hi, np.inf))
                if y is not None:
                    certified.append(i)
                else:
                    continue  # the Adam steps alone
            for (side, k, j), v in zip(where, y):
                (d.beta_n if side == "n" else d.beta_p)[k][i, j] = v
            split = len(where)
            d.lam[i] = float(y[split])
            if mix and i not in certified:
                d.mu[i] = 0.0
                d.mu[i, self.rival_idx] = torch.as_tensor(y[split + 1:], dtype=DTYPE, device=d.mu.device)
        if certified:
            self._certify_empty(d, torch.tensor(certified, device=d.bound.device), sys_)
        return d

    def _certify_empty(self, d: _Domains, idx: torch.Tensor, sys_: JointSystem) -> None:
        """Close the domains `idx` of `d` whose constraints cannot all hold (bound -inf) where the
        multipliers they carry prove it: on the domain every constraint term (lambda (s'_t - s'_c),
        beta_j s_j zhat_j, beta'_j s_j zhat'_j) is >= 0, so if the backward pass of their sum over
        the box, with its floating-point margin, is < 0, the domain has no input."""
        g = self.g.expand(len(d), 1, -1)
        lam3 = d.lam[:, None, None]
        splits = _split_terms(_signs(d), [b[:, None, :] for b in d.beta_n], [b[:, None, :] for b in d.beta_p])
        alphas = [a[:, None, :] for a in d.alpha]
        val = sys_.backward(-lam3 * g, -lam3 * g, self.L - 1, alphas, splits)[:, 0]
        val = val + sys_.fp_rel * sys_.magnitude(-lam3 * g, -lam3 * g, self.L - 1, splits)[:, 0] + FP_ABS
        hit = idx[val[idx] < 0]
        d.bound[hit] = -math.inf

    def _project_mu(self, mu: torch.Tensor):
        def project() -> None:
            mu[:, self.rival_idx] = _simplex(mu[:, self.rival_idx])
        return project

    @staticmethod
    def _choose(d: _Domains, relax: list[_Relax], intervals: list, alphas: list, trace: list) -> torch.Tensor:
        """Per domain, the flat index of the neuron to split next (-1: none is unstable).

        The score of a neuron is what its relaxation's intercepts add to the bound (BaBSR's
        estimate): N's upper chord where the coefficient is positive, and delta's chords (the
        lower one goes with N's neuron, the upper one with N''s). A domain whose scores all
        vanish, yet has unstable neurons left (e.g. only negative coefficients, met by N's lower
        slope alpha), splits the one whose relaxation is loosest instead: the gap of alpha
        (max(-alpha l, (1 - alpha) u)) times the coefficient, plus |coefficient| times width.
        (Scoring alpha's gap in the first rank doubled the domains Adult's top network needed.)"""
        primary, fallback = [], []
        for k, (r, (l, u, hl, hu), a, (az, ed)) in enumerate(zip(relax, intervals, alphas, trace)):
            az, ed = az[:, 0], ed[:, 0]
            un = r.unstable & (d.sn[k] == 0)
            up = (hl < 0) & (hu > 0) & (d.sp[k] == 0)
            alpha = a[:, 0]
            low_gap = torch.maximum(-alpha * l, (1 - alpha) * u)
            sn = az.clamp(min=0) * r.tu + ed.clamp(max=0) * r.ql
            sp = ed.clamp(min=0) * r.qu
            primary.append(torch.cat([torch.where(un, sn, 0.0), torch.where(up, sp, 0.0)], 1))
            fallback.append(torch.cat([torch.where(un, (-az.clamp(max=0)) * low_gap + ed.abs() * (u - l), -1.0),
                                       torch.where(up, ed.abs() * (hu - hl), -1.0)], 1))
        primary, fallback = torch.cat(primary, 1), torch.cat(fallback, 1)
        first, second = primary.max(1), fallback.max(1)
        none = torch.full_like(first.indices, -1)
        return torch.where(first.values > 1e-12, first.indices, torch.where(second.values >= 0, second.indices, none))

    def children(self, d: _Domains) -> _Domains:
        """Split every domain of `d` at its chosen neuron (each domain has a choice >= 0)."""
        D = len(d)
        both = d.take(torch.cat([torch.arange(D, device=d.bound.device)] * 2))
        sign = torch.cat([torch.ones(D, dtype=torch.int8), -torch.ones(D, dtype=torch.int8)]).to(d.bound.device)
        choice = torch.cat([d.choice, d.choice])
        rows = torch.arange(2 * D, device=d.bound.device)
        for k, n in enumerate(self.sizes):
            lo = int(self.offsets[k])
            for target, col0 in ((both.sn, lo), (both.sp, lo + n)):  # `take` copied them
                hit = (choice >= col0) & (choice < col0 + n)
                target[k][rows[hit], choice[hit] - col0] = sign[hit]
        return both

    def root_domains(self, start_bound: float) -> _Domains:
        dev = self.root.device
        zeros8 = [torch.zeros(1, n, dtype=torch.int8, device=dev) for n in self.sizes]
        zeros = [torch.zeros(1, n, dtype=DTYPE, device=dev) for n in self.sizes]
        alpha = [r.sl[:1].clone() for r in self.root.relax]
        mu = torch.zeros(1, len(self.g), dtype=DTYPE, device=dev)
        mu[0, self.rival] = 1.0
        return _Domains(zeros8, [z.clone() for z in zeros8], torch.ones(1, dtype=DTYPE, device=dev), alpha,
                        zeros, [z.clone() for z in zeros], mu, self.root.lo[None].clone(),
                        torch.full((1,), start_bound, dtype=DTYPE, device=dev),
                        torch.full((1,), -1, dtype=torch.int64, device=dev))


def split_upper_bound(n_weights, n_biases, weights, biases, n_lower, n_upper, lower, upper, cls: int,
                      cutoff: float, *, margin_upper: np.ndarray | None = None, time_limit: float = 10.0,
                      batch: int = 1024, steps: int = 20, lr: float = 0.0125, lam_lr: float = 0.1, alpha_lr: float = 0.1,
                      max_domains: int = 300_000,
                      start: np.ndarray | None = None, device: str = "cpu", domain_bound=None,
                      checkpoint: tuple[float, object] | None = None) -> SplitResult:
    """Sound upper bound on beta*_{cls,{i}} for one network N' (weights[k] [out, in]) against N, by
    ReLU-splitting branch and bound until every domain is <= `cutoff` or `time_limit` seconds have
    passed (module docstring); best first while at most `max_domains` are open, then depth first
    (`_search`).

    start: optional [C] sound bounds per rival (e.g. the optimised screen's `per_target`); rivals
    at -inf (N' can never prefer them) or already <= cutoff are skipped. domain_bound: see
    `_search`. checkpoint: None, or (seconds from this call's start, hopeless), asked once for the
    network by the first rival's search to pass that time (`_Checkpoint`, `_search`)."""
    t0 = time.perf_counter()
    root = JointSystem(n_weights, n_biases, [np.asarray(w)[None] for w in weights], [np.asarray(b)[None] for b in biases],
                       n_lower, n_upper, lower, upper, device=device)
    C = root.W[-1].shape[0]
    cap = np.full((C, C), np.inf) if margin_upper is None else np.asarray(margin_upper, dtype=np.float64)
    per_target: dict[int, float] = {}
    evaluated, gave_up = 0, False
    once = None if checkpoint is None else _Checkpoint(*checkpoint)
    starts: list[np.ndarray] = []
    trace: list[tuple[float, float]] = []
    # |s_c - s_u| <= max(margin_upper[c, u], margin_upper[u, c]): what mixing the rivals needs
    mix_bound = float(max(np.max(cap[cls]), np.max(cap[:, cls]))) if C > 2 and margin_upper is not None else None
    for t in range(C):
        if t == cls:
            continue
        first = min(math.inf if start is None else float(start[t]), cap[cls, t])
        if first <= cutoff:  # unreachable (-inf) or already below the cutoff
            per_target[t] = first
            continue
        b = _Brancher(root, cls, t, steps, lr, lam_lr, alpha_lr, mix_bound)
        open_ = b.bound(b.root_domains(first), steps=0)
        # beta's and lambda's step sizes relative to the bound's scale, lambda's also to N''s margin range
        scale = abs(float(open_.bound[0]))
        scale = max(scale, 1e-6) if math.isfinite(scale) else 1.0
        hl, hu = root.hl[-1][0], root.hu[-1][0]
        spread = max(float(hu[cls] - hl[t]), float(hu[t] - hl[cls]), 1e-6)
        b.lr, b.lam_lr = lr * scale, lam_lr * scale / spread
        open_ = b.bound(open_)
        per_target[t], open_, gave_up = _search(b, open_, cutoff, t0 + time_limit, batch, max_domains, domain_bound,
                                                trace, t0, once)
        evaluated += b.evaluated
        if per_target[t] > cutoff and len(open_):
            starts.append(_peaks([open_]))
        if per_target[t] > cutoff > -math.inf:
            break  # this rival alone already keeps the network above the cutoff: nothing to prove
    for t in range(C):  # rivals not reached (an earlier one already failed): their start bound
        if t != cls and t not in per_target:
            per_target[t] = min(math.inf if start is None else float(start[t]), cap[cls, t])
    bound = max(per_target.values(), default=-math.inf)
    return SplitResult(bound, bound <= cutoff, evaluated, time.perf_counter() - t0, per_target,
                       np.concatenate(starts) if starts else None, trace=trace, gave_up=gave_up)


def _search(b: _Brancher, open_: _Domains, cutoff: float, deadline: float, batch: int, pool: int,
            domain_bound=None, trace: list | None = None, t0: float = 0.0,
            checkpoint: _Checkpoint | None = None) -> tuple[float, _Domains, bool]:
    """Branch and bound from the bounded domains `open_` until every domain is closed (<= cutoff,
    or nothing left to split), a closed one is above the cutoff, or the deadline passes. Returns
    the sound bound (the maximum over closed and open domains), the domains left open and whether
    the checkpoint stopped it.

    Best first (the batch of highest bounds is split each round) while at most `pool` domains
    are open: that lowers the anytime bound fastest. Beyond that, each round's reordering of the
    whole open set would cost more than the bounding, and memory grows with it, so the search
    goes depth first: it takes the best batch off the pool and finishes that subtree (a stack of
    batches, the newest children first) before the next. Which domains must be split to prove a
    cutoff does not depend on the order, only the anytime bound does.

    domain_bound: None, or a second sound bound for a domain, (rival, N's split signs per layer,
    N''s) -> float, asked in the depth-first phase for the children whose own bound did not
    improve on their parent's (`lucid.node.domain_lp`: the LP of the singleton's MILP, about 6 ms
    against the pass's 0.3, but tighter where the pass stalls: on Adult's witness network, deep
    domains stuck at 0.0207 by the pass had 0.0178 by the LP).

    trace: where to append (seconds since t0, bound) when the bound falls (at most every
    TRACE_EVERY seconds) and at the end.

    checkpoint: None, or a `_Checkpoint` not yet asked: once its time (seconds since t0) has
    passed, the search asks hopeless(bound, xs) (xs: where the highest open domains attain their
    bounds) and stops if it answers True. Stopping early changes only how long the search runs: the bound is sound."""
    closed = -math.inf
    stack: list[_Domains] = []
    stopped = False

    def settle(d: _Domains) -> _Domains:
        # closed: below the cutoff, or nothing left to split (the relaxation is then as tight as
        # it gets: the domain keeps its bound, after a longer optimisation)
        nonlocal closed
        leaf = (d.choice < 0) & (d.bound > cutoff)
        if leaf.any():  # (those the LP's multipliers proved empty need no polishing)
            started = b.lp_start(d.take(torch.nonzero(leaf).flatten()))
            empty = started.bound == -math.inf
            parts = [d.take(torch.nonzero(~leaf).flatten()), started.take(torch.nonzero(empty).flatten())]
            if not empty.all():
                parts.append(b.bound(started.take(torch.nonzero(~empty).flatten()), steps=LEAF_STEPS, leaves=True))
            d = _Domains.cat(parts)
        done = (d.bound <= cutoff) | (d.choice < 0)
        if done.any():
            closed = max(closed, float(d.bound[done].max()))
            d = d.take(torch.nonzero(~done).flatten())
        return d

    def split(d: _Domains, deep: bool) -> _Domains:
        # the children, bounded; in the depth-first phase those no better than their parent get
        # the second opinion (best first, where the pass still makes progress, it only cost time:
        # Adult's top network took 22 s instead of 11)
        kids = b.children(d)
        inherited = kids.bound.clone()
        kids = b.bound(kids)
        if deep and domain_bound is not None:
            stalled = torch.nonzero((kids.bound >= inherited) & (kids.bound > cutoff)).flatten().tolist()
            for i in stalled:
                if time.perf_counter() > deadline:
                    break
                other = domain_bound(b.rival, [s[i].cpu().numpy() for s in kids.sn], [s[i].cpu().numpy() for s in kids.sp])
                kids.bound[i] = min(float(kids.bound[i]), other)
        return kids

    def best_first(d: _Domains) -> tuple[_Domains, _Domains]:
        order = torch.argsort(d.bound, descending=True)
        return d.take(order[:batch]), d.take(order[batch:])

    open_ = settle(open_)
    while True:
        highest = max([float(d.bound.max()) for d in (open_, *stack) if len(d)], default=-math.inf)
        now = time.perf_counter()
        if trace is not None and (not trace or (max(closed, highest) < trace[-1][1] and now - t0 >= trace[-1][0] + TRACE_EVERY)):
            trace.append((now - t0, max(closed, highest)))
        if highest == -math.inf or closed >= highest or closed > cutoff > -math.inf or now > deadline:
            break
        if checkpoint is not None and not checkpoint.asked and now - t0 >= checkpoint.at:
            checkpoint.asked = True
            if checkpoint.hopeless(max(closed, highest), _peaks([open_, *stack])):
                stopped = True
                break
        if not stack and len(open_) <= pool:
            pick, rest = best_first(open_)
            open_ = _Domains.cat([rest, settle(split(pick, False))])
            continue
        if not stack:
            pick, open_ = best_first(open_)
            stack.append(pick)
        cur = stack.pop()
        if len(cur) > batch:
            cur, later = best_first(cur)
            stack.append(later)
        kids = settle(split(cur, True))
        if len(kids):
            stack.append(kids)
    open_ = _Domains.cat([open_, *stack]) if stack else open_
    final = max(closed, float(open_.bound.max()) if len(open_) else -math.inf)
    if trace is not None:
        trace.append((time.perf_counter() - t0, final))
    return final, open_, stopped


# ---------------------------------------------------------------------- adapter for the verifier
def split_singleton(problem, cls: int, position: int, cutoff: float, *, time_limit: float,
                    device: str = "cpu", domain_bound=None, give_up: bool = True) -> SplitResult:
    """`split_upper_bound` for the network at `position` of problem.stack (a `VerificationProblem`),
    started from its optimised symbolic bound per rival (`lucid.bounds.symbolic`): rivals N' cannot
    reach, or already below the cutoff there, are not branched on. domain_bound: see `_search`
    (the verifier passes `lucid.node.domain_lp.DomainLp(...).bound`). give_up: stop after
    CHECK_SHARE of `time_limit` if the split is not on track (GIVE_UP_EXCESS; `gave_up` in the result)."""
    from lucid.bounds.symbolic import singleton_upper_bounds
    from lucid.node.screen import OPTIMISE_STEPS
    from lucid.witness.replay import climb

    stack = problem.stack
    n_w, n_b = [w[0] for w in stack.weights], [b[0] for b in stack.biases]
    ws, bs = [w[position] for w in stack.weights], [b[position] for b in stack.biases]
    leaks = []

    def leak_from(xs: np.ndarray) -> None:
        for x in xs:
            found = climb(stack, np.array([position]), x, cls, problem.lower, problem.upper)
            if found is not None:
                leaks.append(found)

    def hopeless(bound: float, xs: np.ndarray) -> bool:
        if bound > cutoff + GIVE_UP_EXCESS * abs(cutoff):
            return True
        leak_from(xs)
        return any(found.confidence >= cutoff for found in leaks)

    start = singleton_upper_bounds(n_w, n_b, [w[None] for w in ws], [b[None] for b in bs], problem.n_bounds.lower,
                                   problem.n_bounds.upper, problem.lower, problem.upper, cls, problem.margin_upper,
                                   steps=OPTIMISE_STEPS, cutoff=cutoff, device=device).per_target[0]
    res = split_upper_bound(n_w, n_b, ws, bs, problem.n_bounds.lower, problem.n_bounds.upper, problem.lower,
                            problem.upper, cls, cutoff, margin_upper=problem.margin_upper, time_limit=time_limit,
                            start=start, device=device, domain_bound=domain_bound,
                            checkpoint=(CHECK_SHARE * time_limit, hopeless) if give_up else None)
    # unproved: climb to a real leak from where the open domains peak (unless the checkpoint just
    # climbed from those same domains and stopped on the leak it found)
    if res.starts is not None and not (res.gave_up and leaks):
        leak_from(res.starts)
    res.witness = max(leaks, key=lambda found: found.confidence, default=None)
    return res
