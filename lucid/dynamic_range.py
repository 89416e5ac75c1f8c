"""The entry guard on magnitudes: networks and domains whose scale LUCID's float64 margins cannot cover.

Every tier's rounding and solver margins are relative to the magnitudes involved, with small
absolute parts (docs/guarantee.md). Hidden neurons of any magnitude are brought to order one by an
exact power-of-two rescaling before verification (`lucid.analysis.scaling`), but two magnitudes
cannot be rescaled away, and past a limit they are refused in one line, never verified:

- the scores: the confidence is a difference of scores, and the verifier, the solvers and the
  access layer's float64 evaluation all work to a precision relative to the scores' magnitude.
  A bound on |score| over the domain (interval arithmetic over the hull of every network) above
  2^SCORE_EXPONENT is refused, naming the first layer whose activations pass the limit;
- the parameters and the domain: each must be finite and at most 2^PARAMETER_EXPONENT /
  2^DOMAIN_EXPONENT in magnitude, so that the rescaling's powers of two stay exact in float64.

The limits lie well inside what the extreme-scale soundness tests cover (weights up to 1e6 per
layer, scores to ~1e20, checked against exact rational arithmetic): `tests/test_extreme_scale.py`.
"""

from __future__ import annotations

import numpy as np

from lucid.errors import LucidError
from lucid.hyper import HyperNetwork

SCORE_EXPONENT = 70  # |scores| <= 2^70 ~ 1.2e21
PARAMETER_EXPONENT = 64  # |parameter| <= 2^64 ~ 1.8e19
DOMAIN_EXPONENT = 32  # |domain bound| <= 2^32 ~ 4.3e9


def check_dynamic_range(hull: HyperNetwork, lower, upper, where: str) -> None:
    """Raise one line if the networks inside `hull` (the interval hull of a stack: every network is
    checked at once) or the domain [lower, upper] lie beyond the limits above; `where` names what
    is checked."""
    check_domain_range(lower, upper, where)
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    size = np.maximum(np.abs(lo), np.abs(hi))
    last = hull.num_layers - 1
    for k in range(hull.num_layers):
        w_abs = np.maximum(np.abs(hull.w_lo[k]), np.abs(hull.w_hi[k]))
        b_abs = np.maximum(np.abs(hull.b_lo[k]), np.abs(hull.b_hi[k]))
        largest = max(float(w_abs.max(initial=0.0)), float(b_abs.max(initial=0.0)))
        if not np.isfinite(largest) or largest > 2.0**PARAMETER_EXPONENT:
            raise LucidError(f"{where}: layer {k} has a parameter of magnitude {largest:.3g}, beyond the limit "
                             f"2^{PARAMETER_EXPONENT} (~{2.0**PARAMETER_EXPONENT:.1e}) that LUCID's float64 "
                             "margins cover (docs/guarantee.md#magnitudes)")
        with np.errstate(all="ignore"):
            size = w_abs @ size + b_abs  # a bound on |pre-activation| of every network in the hull
        reach = float(size.max(initial=0.0))
        if not np.isfinite(reach) or reach > 2.0**SCORE_EXPONENT:
            what = "the scores" if k == last else "the activations"
            raise LucidError(f"{where}: {what} of layer {k} may reach {reach:.3g} over the domain, beyond the "
                             f"limit 2^{SCORE_EXPONENT} (~{2.0**SCORE_EXPONENT:.1e}) that LUCID's float64 "
                             "margins cover (docs/guarantee.md#magnitudes)")


def check_network_range(weights: list[np.ndarray], biases: list[np.ndarray], lower, upper, where: str) -> None:
    """The same limits for one network (weights[k]: [out, in])."""
    w = [np.asarray(a, dtype=np.float64) for a in weights]
    b = [np.asarray(a, dtype=np.float64) for a in biases]
    check_dynamic_range(HyperNetwork(w, w, b, b, np.zeros(1, dtype=np.int64)), lower, upper, where)


def check_domain_range(lower, upper, where: str) -> None:
    """Finite domain bounds of magnitude at most 2^DOMAIN_EXPONENT."""
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    with np.errstate(all="ignore"):
        size = np.maximum(np.abs(lo), np.abs(hi))
    if size.size and not (np.all(np.isfinite(size)) and size.max() <= 2.0**DOMAIN_EXPONENT):
        f = int(np.argmax(np.where(np.isfinite(size), size, np.inf)))
        raise LucidError(f"{where}: the domain bound {size[f]:.3g} of feature {f} exceeds the limit "
                         f"2^{DOMAIN_EXPONENT} (~{2.0**DOMAIN_EXPONENT:.1e}) that LUCID's float64 margins cover "
                         "(docs/guarantee.md#magnitudes)")
