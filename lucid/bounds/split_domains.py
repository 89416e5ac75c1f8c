"""The open domains of the ReLU-splitting branch and bound (`lucid.bounds.relu_split`) and the
choice of the neuron each one is split at next.

A domain fixes the sign of some pre-activations: of N's neurons (zhat_j >= 0 or <= 0) and of N''s
(zhat'_j = zhat_j + deltahat_j >= 0 or <= 0). Splitting a domain at one neuron gives two children,
one per sign; together they cover the parent's trajectories.

Branching: the unsplit neuron (of N or of N') whose relaxation intercepts contribute most to
the domain's bound (BaBSR's score on the backward pass's chord terms; strong branching on the
best four candidates, each child bounded by one pass, took 2.2x the domains on Adult's top
network, so it is not used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lucid.bounds.joint import JointSystem
from lucid.bounds.relaxation import DTYPE, Relaxation


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

    def take(self, idx: torch.Tensor) -> _Domains:
        def pick(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [x[idx] for x in xs]

        return _Domains(
            pick(self.sn),
            pick(self.sp),
            self.lam[idx],
            pick(self.alpha),
            pick(self.beta_n),
            pick(self.beta_p),
            self.mu[idx],
            self.x[idx],
            self.bound[idx],
            self.choice[idx],
        )

    @staticmethod
    def cat(parts: list[_Domains]) -> _Domains:
        parts = [p for p in parts if len(p)] or parts[:1]

        def join(name: str) -> list[torch.Tensor]:
            return [torch.cat([getattr(p, name)[k] for p in parts]) for k in range(len(getattr(parts[0], name)))]

        def flat(name: str) -> torch.Tensor:
            return torch.cat([getattr(p, name) for p in parts])

        return _Domains(
            join("sn"),
            join("sp"),
            flat("lam"),
            join("alpha"),
            join("beta_n"),
            join("beta_p"),
            flat("mu"),
            flat("x"),
            flat("bound"),
            flat("choice"),
        )


def _signs(d: _Domains) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The split signs of N's and N''s neurons as [D, 1, n] floats per hidden layer."""
    return [s.to(DTYPE)[:, None, :] for s in d.sn], [s.to(DTYPE)[:, None, :] for s in d.sp]


def root_domain(root: JointSystem, rival: int, start_bound: float) -> _Domains:
    """The one domain with nothing split, bounded by `start_bound` so far, starting from CROWN's
    slopes, lambda = 1, no split multipliers and N's side aimed at `rival` alone."""
    dev = root.device
    sizes = [w.shape[0] for w in root.W[:-1]]
    zeros8 = [torch.zeros(1, n, dtype=torch.int8, device=dev) for n in sizes]
    zeros = [torch.zeros(1, n, dtype=DTYPE, device=dev) for n in sizes]
    alpha = [r.sl[:1].clone() for r in root.relax]
    mu = torch.zeros(1, root.W[-1].shape[0], dtype=DTYPE, device=dev)
    mu[0, rival] = 1.0
    return _Domains(
        zeros8,
        [z.clone() for z in zeros8],
        torch.ones(1, dtype=DTYPE, device=dev),
        alpha,
        zeros,
        [z.clone() for z in zeros],
        mu,
        root.lo[None].clone(),
        torch.full((1,), start_bound, dtype=DTYPE, device=dev),
        torch.full((1,), -1, dtype=torch.int64, device=dev),
    )


def choose_neuron(d: _Domains, relax: list[Relaxation], intervals: list, alphas: list, trace: list) -> torch.Tensor:
    """Per domain, the flat index of the neuron to split next (-1: none is unstable).

    The score of a neuron is what its relaxation's intercepts add to the bound (BaBSR's
    estimate): N's upper chord where the coefficient is positive, and delta's chords (the
    lower one goes with N's neuron, the upper one with N''s). A domain whose scores all
    vanish, yet has unstable neurons left (e.g. only negative coefficients, met by N's lower
    slope alpha), splits the one whose relaxation is loosest instead: the gap of alpha
    (max(-alpha l, (1 - alpha) u)) times the coefficient, plus |coefficient| times width.
    (Scoring alpha's gap in the first rank doubled the domains Adult's top network needed.)"""
    primary, fallback = [], []
    for k, (r, (l, u, hl, hu), a, (az, ed)) in enumerate(zip(relax, intervals, alphas, trace, strict=False)):
        az, ed = az[:, 0], ed[:, 0]
        un = r.unstable & (d.sn[k] == 0)
        up = (hl < 0) & (hu > 0) & (d.sp[k] == 0)
        alpha = a[:, 0]
        low_gap = torch.maximum(-alpha * l, (1 - alpha) * u)
        sn = az.clamp(min=0) * r.tu + ed.clamp(max=0) * r.ql
        sp = ed.clamp(min=0) * r.qu
        primary.append(torch.cat([torch.where(un, sn, 0.0), torch.where(up, sp, 0.0)], 1))
        fallback.append(
            torch.cat(
                [
                    torch.where(un, (-az.clamp(max=0)) * low_gap + ed.abs() * (u - l), -1.0),
                    torch.where(up, ed.abs() * (hu - hl), -1.0),
                ],
                1,
            )
        )
    first, second = torch.cat(primary, 1).max(1), torch.cat(fallback, 1).max(1)
    none = torch.full_like(first.indices, -1)
    return torch.where(first.values > 1e-12, first.indices, torch.where(second.values >= 0, second.indices, none))


def children(d: _Domains, sizes: list[int]) -> _Domains:
    """Split every domain of `d` at its chosen neuron (each domain has a choice >= 0). A flat index
    runs over the hidden layers, each N's `sizes[k]` neurons and then N''s (`choose_neuron`)."""
    offsets = np.cumsum([0] + [2 * n for n in sizes])
    D = len(d)
    both = d.take(torch.cat([torch.arange(D, device=d.bound.device)] * 2))
    sign = torch.cat([torch.ones(D, dtype=torch.int8), -torch.ones(D, dtype=torch.int8)]).to(d.bound.device)
    choice = torch.cat([d.choice, d.choice])
    rows = torch.arange(2 * D, device=d.bound.device)
    for k, n in enumerate(sizes):
        lo = int(offsets[k])
        for target, col0 in ((both.sn, lo), (both.sp, lo + n)):  # `take` copied them
            hit = (choice >= col0) & (choice < col0 + n)
            target[k][rows[hit], choice[hit] - col0] = sign[hit]
    return both
