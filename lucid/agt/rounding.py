"""Floating-point accounting of Abstract Gradient Training.

Two kinds of rounding must be inside the box:

1. The concrete training (algorithm T) runs in float32. A float32 network N_-i is *not* the
   exact-arithmetic trajectory of its parameters: every matmul, the softmax, the sample weights
   and the SGD update round. AGT models every float32 operation of T as an explicit interval
   widening: an operation that sums n products is widened by gamma_n * (sum of the magnitudes
   of its terms), the classical a-priori bound |fl(sum) - sum| <= gamma_n * sum|terms| that
   holds for every summation order (blocked BLAS, FMA), with gamma_n = n u / (1 - n u).
2. AGT itself runs in float64. Its own rounding is covered the same way: the unit roundoff used
   in gamma is U = 2^-24 (float32) + 2^-52 (twice float64's), and every bound that has been
   widened is then moved one more float64 ulp outward (`nextafter`), so the rounding of the
   widening itself cannot move a bound inward.

Underflow (float32 subnormals, possibly flushed to zero) is covered by a small absolute term
ETA per summed term. Transcendentals (exp in the softmax) get an explicit per-class margin, see
`SOFTMAX_ULPS`. The containment tests (tests/training/test_agt.py) check the result on real float32
networks trained by `lucid.training`.
"""

from __future__ import annotations

import torch

U = 2.0**-24 + 2.0**-52  # float32 unit roundoff (the training) + 2x float64's (this computation)
ETA = 2.0**-100  # absolute allowance per summed term for underflow (float32 tiny is 2^-126)
SOFTMAX_ULPS = 12  # float32 softmax: exp (<= 2 ulp incl. the rounded shift), C-term sum, division, -onehot


def gamma(n: int) -> float:
    """gamma_n = n U / (1 - n U): the relative error bound of an n-term float sum of products."""
    nu = n * U
    if nu >= 0.5:
        raise ValueError(f"a sum of {n} terms is too long for the a-priori rounding bound")
    return nu / (1.0 - nu)


def outward(lo: torch.Tensor, hi: torch.Tensor, radius: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """[lo - radius, hi + radius], rounded outward by one float64 ulp."""
    neg_inf = torch.tensor(-float("inf"), dtype=lo.dtype, device=lo.device)
    pos_inf = torch.tensor(float("inf"), dtype=hi.dtype, device=hi.device)
    return torch.nextafter(lo - radius, neg_inf), torch.nextafter(hi + radius, pos_inf)


def widen_sum(lo: torch.Tensor, hi: torch.Tensor, mag: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Widen the interval of an n-term sum whose terms have total magnitude <= mag."""
    return outward(lo, hi, gamma(n) * mag + n * ETA)


def update_radius(
    decay: float, lr: float, weight_decay: float, pmax: torch.Tensor, gmax: torch.Tensor, newmax: torch.Tensor
) -> torch.Tensor:
    """The rounding of T's float32 update d = g + wd p, p' = p - lr d (wd, lr rounded to float32),
    plus this float64 evaluation: |p' - exact| <= u |p'| + gamma_5 lr (|g| + wd |p|), with margin.
    pmax, gmax, newmax bound |p|, |g| and |p'|."""
    return gamma(2) * newmax + gamma(8) * (abs(decay) * pmax + lr * gmax + lr * weight_decay * pmax) + ETA
