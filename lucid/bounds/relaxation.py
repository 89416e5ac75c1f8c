"""The linear relaxations of the joint system (`lucid.bounds.joint`), per hidden layer and network:

* N's ReLU with N's pre-activation bounds [l, u] (the LP-tightened `n_bounds`, or a domain's):
  stable neurons exactly; an unstable one above by the chord u (zhat - l) / (u - l), below by
  alpha * zhat with a free slope alpha in [0, 1] (CROWN's choice: 1 if u > -l else 0; optimised
  alpha-CROWN style).
* The ReLU difference delta = relu(zhat + deltahat) - relu(zhat), using N's interval [l, u], N''s
  interval [l', u'] and the interval [dl, du] of deltahat. Always min(0, dh) <= delta <= max(0, dh).
  Upper bound: 0 if N' is stably inactive (delta = -relu(zhat) <= 0); deltahat if N' is stably
  active (delta = dh + min(zhat, 0) <= dh); else the chord of max(0, dh) over [dl, du] (dh itself if
  dl >= 0, 0 if du <= 0). Lower bound: 0 if N is stably inactive (delta = relu(zhat') >= 0);
  deltahat if N is stably active (delta = max(dh, -zhat) >= dh); else the chord of min(0, dh) over
  [dl, du]. (Both stably active gives delta = dh, both inactive delta = 0: exact.) The chords are
  the tightest linear bounds of max(0, dh) / min(0, dh) over the interval, so this relaxation has
  no free slopes.

Both are built from intervals, which `consistent` keeps in step with zhat' = zhat + deltahat. The
symbolic bounds (`lucid.bounds.symbolic`) relax the whole box once; the ReLU split
(`lucid.bounds.split_lagrangian`) relaxes every domain again with its own, cut intervals. The
intercepts are padded outward by PAD_REL (`lucid.bounds.symbolic`'s floating-point argument).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lucid.bounds.interval import FP_ABS, FP_REL

PAD_REL = 1e-14
DTYPE = torch.float64


@dataclass
class Relaxation:
    """Linear relaxations of one hidden layer (every array [K, n] or broadcastable)."""

    su: torch.Tensor  # N: z <= su * zhat + tu
    tu: torch.Tensor
    sl: torch.Tensor  # N: z >= sl * zhat (default slopes; 1 / 0 for stable neurons)
    unstable: torch.Tensor  # N's unstable neurons (where alpha applies)
    pu: torch.Tensor  # delta <= pu * deltahat + qu
    qu: torch.Tensor
    pl: torch.Tensor  # delta >= pl * deltahat + ql
    ql: torch.Tensor
    pz: torch.Tensor | None = None  # delta's slope in zhat (both bounds; None: 0), where N and N' are stable but differ
    mag_t: torch.Tensor = field(init=False)  # max |intercept| for the magnitude pass

    def __post_init__(self) -> None:
        self.mag_t = torch.maximum(self.tu.abs(), torch.maximum(self.qu.abs(), self.ql.abs()))

    def take(self, ix: torch.Tensor) -> Relaxation:
        return Relaxation(
            self.su[ix],
            self.tu[ix],
            self.sl[ix],
            self.unstable[ix],
            self.pu[ix],
            self.qu[ix],
            self.pl[ix],
            self.ql[ix],
            None if self.pz is None else self.pz[ix],
        )


def relu_relaxation(l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """CROWN relaxation of relu over [l, u]: (su, tu, sl, unstable)."""
    active, inactive = l >= 0, u <= 0
    unstable = ~(active | inactive)
    width = torch.where(unstable, u - l, torch.ones_like(u))
    slope = torch.where(unstable, u / width, active.to(DTYPE))
    pad = PAD_REL * (l.abs() + u.abs())
    tu = torch.where(unstable, -slope * l + pad, torch.zeros_like(u))
    sl = torch.where(unstable, (u > -l).to(DTYPE), active.to(DTYPE))
    return slope, tu, sl, unstable


def difference_relaxation(l, u, lp, up, dl, du, exact_below=None):
    """Linear bounds of delta = relu(zhat + dh) - relu(zhat) in dh (see the module docstring).

    exact_below: None, or a bool [K] marking the networks (domains) whose layers below are exact
    (every neuron of N and N' stable): there, where N and N' are stable in different states, delta
    is given exactly in zhat (`_difference_slope_z`). Elsewhere the interval form [dh, 0] / [0, dh]
    is kept: the backward pass maximises over the whole box, where zhat, unlike dh (which depends on
    the layers below only through the small dW and delta), ranges widely, so -zhat in place of
    [dh, 0] loosens the bound of a domain whose split constraints are only Lagrangian terms
    (measured: 2.4x the domains to the same Adult bound). In a domain with every neuron stable
    the Lagrangian is exact at its optimum, and there the exact form closes the gap to beta*."""
    zero, one = torch.zeros_like(dl), torch.ones_like(dl)
    mixed = (dl < 0) & (du > 0)
    width = torch.where(mixed, du - dl, one)
    pad = PAD_REL * (dl.abs() + du.abs())
    # upper: chord of max(0, dh)
    cu_s = torch.where(mixed, du / width, torch.where(dl >= 0, one, zero))
    cu_q = torch.where(mixed, -cu_s * dl + pad, zero)
    pu = torch.where(up <= 0, zero, torch.where(lp >= 0, one, cu_s))
    qu = torch.where((up <= 0) | (lp >= 0), zero, cu_q)
    # lower: chord of min(0, dh)
    cl_s = torch.where(mixed, -dl / width, torch.where(du <= 0, one, zero))
    cl_q = torch.where(mixed, dl * du / width - pad, zero)
    pl = torch.where(u <= 0, zero, torch.where(l >= 0, one, cl_s))
    ql = torch.where((u <= 0) | (l >= 0), zero, cl_q)
    pz = None if exact_below is None else _difference_slope_z(l, u, lp, up, exact_below)
    if pz is not None:  # N active, N' inactive: delta = -zhat; N inactive, N' active: delta = zhat + dh
        on, off = pz < 0, pz > 0
        pu, pl = torch.where(on, zero, torch.where(off, one, pu)), torch.where(on, zero, torch.where(off, one, pl))
        qu, ql = torch.where(on | off, zero, qu), torch.where(on | off, zero, ql)
    return pu, qu, pl, ql, pz


def _difference_slope_z(l, u, lp, up, exact_below: torch.Tensor) -> torch.Tensor | None:
    """delta's exact slope in zhat where N and N' are stable in different states (-1: N active,
    N' inactive, delta = -zhat; +1: N inactive, N' active, delta = zhat + dh) and the layers below
    are exact; None if nowhere."""
    ok = exact_below[:, None]
    on, off = (l >= 0) & (up <= 0) & ok, (u <= 0) & (lp >= 0) & ok
    if not bool((on | off).any()):
        return None
    return on.to(DTYPE) * -1.0 + off.to(DTYPE)


def outward_pad(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Outward padding of a bound computed as a + b or a - b (FP_REL of the operands, + FP_ABS)."""
    return FP_REL * (a.abs() + b.abs()) + FP_ABS


def consistent(l, u, dl, du, hl, hu):
    """(dl, du, hl, hu) intersected with what zhat' = zhat + deltahat implies, given zhat in [l, u]:
    zhat' in [l + dl, u + du], deltahat in [hl - u, hu - l], each derived bound padded outward."""
    hl = torch.maximum(hl, l + dl - outward_pad(l, dl))
    hu = torch.minimum(hu, u + du + outward_pad(u, du))
    dl = torch.maximum(dl, hl - u - outward_pad(hl, u))
    du = torch.minimum(du, hu - l + outward_pad(hu, l))
    return dl, du, hl, hu


def all_stable(l, u, lp, up) -> torch.Tensor:
    """[K]: every neuron of the layer stable in N (l >= 0 or u <= 0) and in N' (lp, up)."""
    return (((l >= 0) | (u <= 0)) & ((lp >= 0) | (up <= 0))).all(-1)
