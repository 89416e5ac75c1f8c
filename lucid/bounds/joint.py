"""The joint linear-bound system of N and K networks N' (z and the differences delta = z' - z as
linear functions of the input), batched over networks in torch: the backward pass through the
layers' relaxations (`lucid.bounds.relaxation`), its floating-point magnitude pass, and the
intermediate-bound tightening. The mathematics and the floating-point argument are in
`lucid.bounds.symbolic`'s docstring; this module is the machinery `symbolic.py`'s bounds are
computed with.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from lucid.adam import Adam
from lucid.bounds.difference import WeightIntervals, difference_bounds
from lucid.bounds.interval import FP_ABS, FP_REL, LayerBounds
from lucid.bounds.pair import PairProblem
from lucid.bounds.relaxation import DTYPE, Relaxation, consistent, difference_relaxation, relu_relaxation


def _t(x, device) -> torch.Tensor:
    a = np.ascontiguousarray(x, dtype=np.float64)
    if not a.flags.writeable:  # a memory-mapped network (lucid.network_cache): torch needs its own copy
        a = a.copy()
    return torch.as_tensor(a, dtype=DTYPE, device=device)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _bmm(E: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """E [K, m, out] times X [K, out, in] per network, or times one shared X [1, out, in]: then as a
    single matrix product, which reads X once instead of once per row of E."""
    if X.shape[0] == 1 and E.shape[0] != 1:
        return (E.reshape(-1, E.shape[-1]) @ X[0]).view(E.shape[0], E.shape[1], X.shape[-1])
    return torch.bmm(E, X)


def projected_adam_step(opt: Adam, loss: torch.Tensor, *, nonneg=(), unit=(), project=None) -> None:
    """One step of the bound optimisations: Adam on `loss`, then each tensor of `nonneg` clamped at
    0 (Lagrange multipliers), of `unit` into [0, 1] (ReLU slopes), and `project()` (e.g. onto a
    simplex). Any point of that set is a sound choice, so every iterate is a valid bound."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for x in nonneg:
            x.clamp_(min=0.0)
        for x in unit:
            x.clamp_(0.0, 1.0)
        if project is not None:
            project()


@dataclass
class SymbolicDifference:
    """Sound intervals per affine layer (every array [K, n_k]), for K networks N'."""

    pre: LayerBounds  # deltahat_k = zhat'_k - zhat_k (the last layer: score differences)
    hyper: LayerBounds  # zhat'_k, N''s own pre-activation bounds


class JointSystem:
    """N (shared) and K networks N' in one batched backward linear-bound pass."""

    def __init__(
        self,
        pair: PairProblem,
        *,
        device: str | torch.device = "cpu",
        intermediate: str = "symbolic",
        intermediate_steps: int = 0,
        intermediate_lr: float = 0.05,
    ):
        if intermediate not in ("symbolic", "interval"):
            raise ValueError(f"intermediate must be 'symbolic' or 'interval', not {intermediate!r}")
        dev = torch.device(device)
        self.device = dev
        self.intermediate_steps, self.intermediate_lr = int(intermediate_steps), float(intermediate_lr)
        self.L = len(pair.n_weights)
        self.K = pair.count
        self.W = [_t(w, dev) for w in pair.n_weights]
        self.b = [_t(b, dev) for b in pair.n_biases]
        self.Wp = [_t(w, dev) for w in pair.weights]
        self.dW = [wp - w for wp, w in zip(self.Wp, self.W, strict=True)]
        self.db = [_t(bp, dev) - b for bp, b in zip(pair.biases, self.b, strict=True)]
        self.aW = [w.abs() for w in self.W]
        self.aWp = [w.abs() for w in self.Wp]
        self.adW = [w.abs() for w in self.dW]
        self.ab = [b.abs() for b in self.b]
        self.adb = [b.abs() for b in self.db]
        self.nl = [_t(x, dev) for x in pair.n_lower]
        self.nu = [_t(x, dev) for x in pair.n_upper]
        self.lo = _t(pair.lower, dev)
        self.hi = _t(pair.upper, dev)
        self.amax = torch.maximum(self.lo.abs(), self.hi.abs())
        # gamma_n for the longest chain of additions of a pass (about 6 sums per width and layer)
        self.fp_rel = max(FP_REL, 2.0**-52 * (6 * (sum(w.shape[0] for w in self.W) + self.W[0].shape[1]) + 16))
        # interval start: the existing propagation (numpy)
        nb = LayerBounds([np.asarray(x) for x in pair.n_lower], [np.asarray(x) for x in pair.n_upper])
        ws = [np.asarray(w, dtype=np.float64) for w in pair.weights]
        bs = [np.asarray(b, dtype=np.float64) for b in pair.biases]
        diff = difference_bounds(
            list(pair.n_weights), list(pair.n_biases), WeightIntervals.points(ws, bs), nb, pair.lower, pair.upper
        )
        self.dl, self.du, self.hl, self.hu = [], [], [], []
        self.relax: list[Relaxation] = []
        for k in range(self.L):
            dl, du = _t(diff.pre.lower[k], dev), _t(diff.pre.upper[k], dev)
            hl, hu = _t(diff.hyper.lower[k], dev), _t(diff.hyper.upper[k], dev)
            # The first layer's intervals are exact already (an affine map of the box, with no
            # difference in the inputs): a backward pass there would only cost time.
            if intermediate == "symbolic" and 0 < k < self.L - 1:
                dl, du, hl, hu = self._tighten(k, dl, du, hl, hu)
            self.dl.append(dl)
            self.du.append(du)
            self.hl.append(hl)
            self.hu.append(hu)
            if k < self.L - 1:
                su, tu, sl, unst = relu_relaxation(self.nl[k], self.nu[k])
                pu, qu, pl, ql, pz = difference_relaxation(self.nl[k], self.nu[k], hl, hu, dl, du)
                K = self.K
                self.relax.append(
                    Relaxation(
                        su.expand(K, -1), tu.expand(K, -1), sl.expand(K, -1), unst.expand(K, -1), pu, qu, pl, ql, pz
                    )
                )

    # ------------------------------------------------------------------ passes
    def backward(
        self,
        A: torch.Tensor,
        E: torch.Tensor,
        top: int,
        alphas=None,
        splits=None,
        trace: list | None = None,
        first: tuple | None = None,
    ) -> torch.Tensor:
        """Upper bound (no FP margin) of A . zhat_top + E . deltahat_top over the box.

        A, E: [K, m, n_top]. alphas: None or a list (hidden layers < top) of [K, m, n] lower slopes
        used for N's unstable neurons. splits: None or a list (hidden layers < top) of pairs
        (bn, bp), [K, m, n] each: Lagrangian terms of split constraints (`lucid.bounds.split_lagrangian`):
        bn . zhat_k and bp . zhat'_k are added at layer k, which never lowers the maximum where
        the signs were chosen so that each term is >= 0 on the domain. trace: a list to which the
        pass appends, per hidden layer from the top down, the coefficients (of z_k, of delta_k)
        that meet the layer's relaxation, [K, m, n] each (the split heuristic reads them), and
        last the coefficients of the input x, [K, m, d] (the bound is attained at the box corner
        they point to). first: the top layer's (Az, Ed, const) when the caller has them without
        the products (`_rows_step`). Returns [K, m]."""
        const = torch.zeros(A.shape[:2], dtype=DTYPE, device=self.device)
        for k in range(top, -1, -1):
            if k == top and first is not None:
                Az, Ed, top_const = first
                const = const + top_const
            else:
                Az, Ed, const = self._affine_step(A, E, k, const)
            if k == 0:
                if trace is not None:
                    trace.append(Az)
                break
            r = self.relax[k - 1]
            sl = r.sl[:, None, :]
            if alphas is not None:
                sl = torch.where(r.unstable[:, None, :], alphas[k - 1], sl)
            Azp, Azn = Az.clamp(min=0), Az.clamp(max=0)
            A = Azp * r.su[:, None, :] + Azn * sl
            const = const + (Azp * r.tu[:, None, :]).sum(-1)
            Edp, Edn = Ed.clamp(min=0), Ed.clamp(max=0)
            E = Edp * r.pu[:, None, :] + Edn * r.pl[:, None, :]
            if r.pz is not None:  # exact there: the same slope bounds delta from both sides
                A = A + Ed * r.pz[:, None, :]
            const = const + (Edp * r.qu[:, None, :]).sum(-1) + (Edn * r.ql[:, None, :]).sum(-1)
            if trace is not None:
                trace.append((Az, Ed))
            if splits is not None:
                bn, bp = splits[k - 1]
                A, E = A + bn + bp, E + bp  # zhat' = zhat + deltahat
        return const + (Az.clamp(min=0) * self.hi + Az.clamp(max=0) * self.lo).sum(-1)

    @torch.no_grad()
    def magnitude(
        self, A: torch.Tensor, E: torch.Tensor, top: int, splits=None, first: tuple | None = None
    ) -> torch.Tensor:
        """The backward pass on absolute values (module docstring): sum of |terms|, [K, m].
        first: as in `backward`, of the absolute values."""
        A, E = A.abs(), E.abs()
        const = torch.zeros(A.shape[:2], dtype=DTYPE, device=self.device)
        for k in range(top, -1, -1):
            if k == top and first is not None:
                Az, Ed, top_const = first
                const = const + top_const
            else:
                Az, Ed, const = self._affine_step(A, E, k, const, absolute=True)
            if k == 0:
                break
            mt = self.relax[k - 1].mag_t[:, None, :]
            const = const + ((Az + Ed) * mt).sum(-1)
            A, E = Az, Ed  # every slope is in [0, 1]
            if self.relax[k - 1].pz is not None:  # |pz| <= 1
                A = A + Ed * self.relax[k - 1].pz.abs()[:, None, :]
            if splits is not None:
                bn, bp = splits[k - 1]
                A, E = A + bn.abs() + bp.abs(), E + bp.abs()
        return const + (Az * self.amax).sum(-1)

    def sound_max(self, A, E, top, alphas=None) -> torch.Tensor:
        """Sound upper bound (FP margin added) of A . zhat_top + E . deltahat_top."""
        return self.backward(A, E, top, alphas) + self.fp_rel * self.magnitude(A, E, top) + FP_ABS

    def _optimised_max(self, A, E, top) -> torch.Tensor:
        """`backward` (no FP margin: it does not depend on the slopes) with N's lower slopes
        optimised per objective (alpha-CROWN for intermediate bounds): projected Adam steps, the
        minimum over all iterates (each one a valid bound)."""
        m = A.shape[1]
        alphas = [r.sl[:, None, :].expand(-1, m, -1).clone().requires_grad_(True) for r in self.relax[:top]]
        opt = Adam(alphas, lr=self.intermediate_lr)
        best = None
        for step in range(self.intermediate_steps + 1):
            last = step == self.intermediate_steps
            with torch.set_grad_enabled(not last):  # (called under no_grad: the loss too)
                val = self.backward(A, E, top, alphas)
                loss = val.sum()
            v = val.detach()
            v = torch.where(torch.isnan(v), torch.full_like(v, math.inf), v)
            best = v if best is None else torch.minimum(best, v)
            if last:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for a in alphas:
                    a.clamp_(0.0, 1.0)
        return best

    @torch.no_grad()
    def _tighten(self, k, dl, du, hl, hu, every: bool = False):
        """Bound deltahat_k (every neuron) and zhat'_k by the backward pass over the layers below.

        zhat'_k is bounded symbolically only where N's neuron is stable: where N's is unstable,
        N' (close to N) is unstable too in practice, and l', u' only decide N''s stability, so there
        the interval bounds (with l + dl, u + du) are kept and the pass is half as wide.
        every: bound zhat'_k symbolically for every neuron (the output layer's scores)."""
        n = self.W[k].shape[0]
        eye = torch.eye(n, dtype=DTYPE, device=self.device)
        stable = ((self.nl[k] >= 0) | (self.nu[k] <= 0) | every).nonzero().flatten()
        m = len(stable)
        es = eye[stable]
        # objectives: +dh, -dh (every neuron), +zhat', -zhat' (N's stable neurons)
        A = torch.cat([torch.zeros(2 * n, n, dtype=DTYPE, device=self.device), es, -es]).expand(self.K, -1, -1)
        E = torch.cat([eye, -eye, es, -es]).expand(self.K, -1, -1)
        # the FP margin: the magnitude pass sees |A|, |E| only, the same for +row and -row
        half = self.magnitude(
            torch.cat([A[:, :n], A[:, 2 * n : 2 * n + m]], 1),
            torch.cat([E[:, :n], E[:, 2 * n : 2 * n + m]], 1),
            k,
            first=self._rows_step(k, stable, absolute=True),
        )
        margin = self.fp_rel * torch.cat([half[:, :n], half[:, :n], half[:, n:], half[:, n:]], 1) + FP_ABS
        if self.intermediate_steps > 0 and k > 0:
            ub = self._optimised_max(A, E, k) + margin
        else:
            ub = self.backward(A, E, k, first=self._rows_step(k, stable)) + margin
        dl, du = torch.maximum(dl, -ub[:, n : 2 * n]), torch.minimum(du, ub[:, :n])
        if m:
            hl, hu = hl.clone(), hu.clone()
            hl[:, stable] = torch.maximum(hl[:, stable], -ub[:, 2 * n + m :])
            hu[:, stable] = torch.minimum(hu[:, stable], ub[:, 2 * n : 2 * n + m])
        return consistent(self.nl[k], self.nu[k], dl, du, hl, hu)

    def _rows_step(self, k: int, stable: torch.Tensor, absolute: bool = False) -> tuple:
        """`backward`'s (or with `absolute`, `magnitude`'s half pass's) affine step at layer k for
        `_tighten`'s objectives, whose A and E select neurons: rows of the layer's matrices instead
        of products with [K, rows, n] selection matrices. The same values bit for bit (a product
        with a selection row adds only exact zeros to the one term it picks)."""
        K = self.K
        W, dW, Wp, b, db = self._layer(k, absolute)
        dW, Wp = dW.expand(K, -1, -1), Wp.expand(K, -1, -1)
        db = db.expand(K, -1)
        z_rows = W[stable] + dW[:, stable]  # A's row e_j times W plus E's row e_j times dW
        z_const = b[stable] + db[:, stable]
        if absolute:
            return torch.cat([dW, z_rows], 1), torch.cat([Wp, Wp[:, stable]], 1), torch.cat([db, z_const], 1)
        Az = torch.cat([dW, -dW, z_rows, -z_rows], 1)
        Ed = torch.cat([Wp, -Wp, Wp[:, stable], -Wp[:, stable]], 1)
        return Az, Ed, torch.cat([db, -db, z_const, -z_const], 1)

    def _affine_step(
        self, A: torch.Tensor, E: torch.Tensor, k: int, const: torch.Tensor, absolute: bool = False
    ) -> tuple:
        """`backward`'s (with `absolute`, `magnitude`'s) affine step at layer k: the coefficients
        of zhat_{k-1} and deltahat_{k-1} (None below the first layer) and `const` plus what the
        layer's biases add."""
        W, dW, Wp, b, db = self._layer(k, absolute)
        const = const + A @ b + (E * db[:, None, :]).sum(-1)
        return A @ W + _bmm(E, dW), None if k == 0 else _bmm(E, Wp), const

    def _layer(self, k: int, absolute: bool = False) -> tuple:
        """Layer k's (W, dW, Wp, b, db), or their absolute values for the magnitude pass."""
        if absolute:
            return self.aW[k], self.adW[k], self.aWp[k], self.ab[k], self.adb[k]
        return self.W[k], self.dW[k], self.Wp[k], self.b[k], self.db[k]

    def select(self, idx, light: bool = False) -> JointSystem:
        """The same system for the networks idx (repeats allowed; a shallow copy sharing N's tensors).
        light: only what `backward` needs (no magnitude passes, no intervals)."""
        ix = torch.as_tensor(np.asarray(idx, dtype=np.int64), device=self.device)
        sub = copy.copy(self)
        sub.K = len(ix)
        # One network repeated (the domains of a ReLU split): its matrices stay one copy, [1, out, in],
        # and `backward` multiplies all the rows by it at once (`_bmm`). A system that already holds
        # one copy for all its rows keeps it, whatever rows are selected.
        shared = self.K > 1 and self.Wp[0].shape[0] == 1
        one = len(ix) > 0 and bool((ix == ix[0]).all())
        for name in ("Wp", "dW") if light else ("Wp", "dW", "aWp", "adW"):
            setattr(sub, name, [x if shared else x[ix[:1]] if one else x[ix] for x in getattr(self, name)])
        for name in ("db",) if light else ("db", "adb", "dl", "du", "hl", "hu"):
            setattr(sub, name, [x[ix] for x in getattr(self, name)])
        sub.relax = [r.take(ix) for r in self.relax]
        return sub

    def differences(self) -> SymbolicDifference:
        return SymbolicDifference(
            LayerBounds([_np(x) for x in self.dl], [_np(x) for x in self.du]),
            LayerBounds([_np(x) for x in self.hl], [_np(x) for x in self.hu]),
        )
