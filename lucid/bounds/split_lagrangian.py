"""The Lagrangian bound of a batch of domains of the ReLU-splitting branch and bound
(`lucid.bounds.relu_split`) for one network N' and one rival t, batched over domains in torch.

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
  (`lucid.bounds.relaxation.difference_relaxation`): its Lagrangian is then exact at the optimal
  multipliers, which are those of an LP over the box (`_Brancher.lp_start`); an infeasible LP gives
  multipliers that prove the domain empty (`_certify_empty`). Either way the bound is still the
  backward pass with its margin, followed by more Adam steps (`relu_split.LEAF_STEPS`): it is final.
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
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lucid.adam import Adam
from lucid.bounds.interval import FP_ABS
from lucid.bounds.joint import JointSystem, _np, projected_adam_step
from lucid.bounds.relaxation import (
    DTYPE,
    Relaxation,
    all_stable,
    consistent,
    difference_relaxation,
    outward_pad,
    relu_relaxation,
)
from lucid.bounds.split_domains import _Domains, _signs, children, choose_neuron, root_domain
from lucid.bounds.split_options import SplitOptions
from lucid.bounds.symbolic import _simplex
from lucid.solvers.lp import inequality_multipliers


def _split_terms(signs: tuple[list, list], beta_n: list[torch.Tensor], beta_p: list[torch.Tensor]) -> list:
    """Per hidden layer, the Lagrangian coefficients (s_j beta_j of zhat_j, s_j beta'_j of zhat'_j),
    [D, 1, n] each, for `JointSystem.backward`'s `splits` (signs: `_signs`; beta_n, beta_p: [D, 1, n]
    per layer)."""
    return [(sn * b1, sp * b2) for sn, sp, b1, b2 in zip(*signs, beta_n, beta_p, strict=False)]


class _Brancher:
    """One network N' and one rival t: bounds batches of their domains (`bound`, `lp_start`) and
    splits them (`children`); the search that decides which to split is `relu_split._search`."""

    def __init__(
        self, root: JointSystem, cls: int, rival: int, options: SplitOptions, mix_bound: float | None = None
    ) -> None:
        """options: the Adam steps per bound and the step sizes (`SplitOptions`; the search may rescale
        lr and lam_lr to the bound's units). mix_bound: a bound on |s_c - s_u| over the box for every
        u (more than two classes): N's side of the objective then mixes the rivals (module
        docstring); None: it does not."""
        self.root, self.steps, self.lr = root, options.steps, options.lr
        self.lam_lr, self.alpha_lr = options.lam_lr, options.alpha_lr
        self.cls, self.rival, self.mix_bound = cls, rival, mix_bound
        self.L = root.L
        self.sizes = [w.shape[0] for w in root.W[:-1]]
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
        so delta takes its exact form where N and N' differ
        (`lucid.bounds.relaxation.difference_relaxation`)."""
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
            su, tu, sl, unst = relu_relaxation(l, u)
            pu, qu, pl, ql, pz = difference_relaxation(l, u, hl, hu, dl, du, exact_below)
            if exact_below is not None:
                exact_below = exact_below & all_stable(l, u, hl, hu)
            relax.append(Relaxation(su, tu, sl, unst, pu, qu, pl, ql, pz))
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
        opt = Adam(
            [
                {"params": [lam], "lr": self.lam_lr},
                {"params": [*bn, *bp], "lr": self.lr},
                {"params": [*alphas, *([mu] if mix else [])], "lr": self.alpha_lr},
            ]
        )
        best = torch.full((D,), math.inf, dtype=DTYPE, device=g.device)
        keep = [
            lam.detach().clone(),
            [a.detach().clone() for a in alphas],
            [b.detach().clone() for b in bn],
            [b.detach().clone() for b in bp],
            mu.detach().clone(),
        ]

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
            for group, cur in zip(keep[1:4], (alphas, bn, bp), strict=True):
                for i, p in enumerate(cur):
                    group[i] = torch.where(better[:, None, None], p.detach(), group[i])
            if last:
                break
            projected_adam_step(
                opt, val.sum(), nonneg=[lam, *bn, *bp], unit=alphas, project=self._project_mu(mu) if mix else None
            )
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
                sound = sound + ((1 - total).abs() + len(self.g) * 2.0**-52 * total) * self.mix_bound
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
            d.choice = choose_neuron(d, sys_.relax, intervals, alphas, trace[::-1])
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
        root, D = self.root, len(d)
        sys_, empty, intervals = self._system(d, leaves=True)
        certified: list[int] = []  # domains whose LP is infeasible, with the multipliers proving it
        n_form, p_form = (
            (root.W[0].expand(D, -1, -1), root.b[0].expand(D, -1)),
            (root.Wp[0][0].expand(D, -1, -1), (root.b[0] + root.db[0][0]).expand(D, -1)),
        )
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
                y = inequality_multipliers(
                    np.append(np.zeros(dim), -1.0),
                    np.hstack([a[:rows_, :dim], -np.ones((rows_, 1))]),
                    b[:rows_],
                    np.append(lo, -np.inf),
                    np.append(hi, np.inf),
                )
                if y is not None:
                    certified.append(i)
                else:
                    continue  # the Adam steps alone
            for (side, k, j), v in zip(where, y, strict=False):
                (d.beta_n if side == "n" else d.beta_p)[k][i, j] = v
            split = len(where)
            d.lam[i] = float(y[split])
            if mix and i not in certified:
                d.mu[i] = 0.0
                d.mu[i, self.rival_idx] = torch.as_tensor(y[split + 1 :], dtype=DTYPE, device=d.mu.device)
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

    def children(self, d: _Domains) -> _Domains:
        """Split every domain of `d` at its chosen neuron (`lucid.bounds.split_domains.children`)."""
        return children(d, self.sizes)

    def root_domains(self, start_bound: float) -> _Domains:
        """The unsplit domain, bounded by `start_bound` so far (`lucid.bounds.split_domains.root_domain`)."""
        return root_domain(self.root, self.rival, start_bound)
