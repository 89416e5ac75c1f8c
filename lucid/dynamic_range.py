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

The score limit is where the checks against exact rational arithmetic stop: weights of 1e6 per layer
in `tests/verify/test_extreme_scale.py`, and of 2e6 per layer (this guard's score bound reaching 2^67.7) in
`benchmarks/extreme_scale.py`; beyond it nothing is claimed, so nothing is verified.
"""

from __future__ import annotations

import numpy as np

from lucid.errors import LucidError
from lucid.hyper import HyperNetwork, stack_hull
from lucid.network import stack_from_tensors

MAGNITUDE_BAND = 12  # magnitudes within [2^-12, 2^12] are left as they are by every rescaling
SCORE_EXPONENT = 68  # |scores| <= 2^68 ~ 3.0e20
PARAMETER_EXPONENT = 64  # |parameter| <= 2^64 ~ 1.8e19
DOMAIN_EXPONENT = 32  # |domain bound| <= 2^32 ~ 4.3e9


def outside_band(magnitude):
    """Whether a magnitude (or each of an array's) lies outside [2^-MAGNITUDE_BAND, 2^MAGNITUDE_BAND]:
    where the verifier rescales by a power of two (hidden neurons, the MILP's scores, the repair LP's
    rows) so that the solvers' absolute tolerances mean what they mean at order one. Ordinary
    networks stay inside it and are verified as they are."""
    return (magnitude > 2.0**MAGNITUDE_BAND) | (magnitude < 2.0**-MAGNITUDE_BAND)


def check_dynamic_range(hull: HyperNetwork, lower, upper, where: str) -> None:
    """Raise one line if the networks inside `hull` (the interval hull of a stack: every network is
    checked at once) or the domain [lower, upper] lie beyond the limits above; `where` names what
    is checked."""
    check_domain_range(lower, upper, where)
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    size = np.maximum(np.abs(lo), np.abs(hi))
    last = hull.num_layers - 1
    for k in range(hull.num_layers):
        # NaN and inf are the non-finite check's to refuse (NetworkFile.check_finite, the importer,
        # training): here they count as 0, so that check's message stays the one a user sees
        w_abs = _finite_abs(hull.w_lo[k], hull.w_hi[k])
        b_abs = _finite_abs(hull.b_lo[k], hull.b_hi[k])
        largest = max(float(w_abs.max(initial=0.0)), float(b_abs.max(initial=0.0)))
        if largest > 2.0**PARAMETER_EXPONENT:
            raise LucidError(
                f"{where}: layer {k} has a parameter of magnitude {largest:.3g}, beyond the limit "
                f"2^{PARAMETER_EXPONENT} (~{2.0**PARAMETER_EXPONENT:.1e}) that LUCID's float64 "
                "margins cover (docs/guarantee.md#magnitudes)"
            )
        with np.errstate(all="ignore"):
            size = w_abs @ size + b_abs  # a bound on |pre-activation| of every network in the hull
        reach = float(size.max(initial=0.0))
        if not np.isfinite(reach) or reach > 2.0**SCORE_EXPONENT:
            what = "the scores" if k == last else "the activations"
            raise LucidError(
                f"{where}: {what} of layer {k} may reach {reach:.3g} over the domain, beyond the "
                f"limit 2^{SCORE_EXPONENT} (~{2.0**SCORE_EXPONENT:.1e}) that LUCID's float64 "
                "margins cover (docs/guarantee.md#magnitudes)"
            )


def _finite_abs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        magnitude = np.maximum(np.abs(lo), np.abs(hi))
    return np.where(np.isfinite(magnitude), magnitude, 0.0)


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
        raise LucidError(
            f"{where}: the domain bound {size[f]:.3g} of feature {f} exceeds the limit "
            f"2^{DOMAIN_EXPONENT} (~{2.0**DOMAIN_EXPONENT:.1e}) that LUCID's float64 margins cover "
            "(docs/guarantee.md#magnitudes)"
        )


def check_scaler_range(offset, scale, where: str) -> None:
    """An affine input scaler x_net = (x - offset) * scale: every scale non-zero (zero maps every
    client input to one point) and within [2^-64, 2^64] in magnitude, every offset within 2^64. The
    scaler only maps a client's input to the point whose label is released, so it bears on no
    bound; the limits keep that map meaningful in float64."""
    offset, scale = np.asarray(offset, dtype=np.float64), np.asarray(scale, dtype=np.float64)
    size = np.abs(scale)
    for f in range(size.size):
        if not (np.isfinite(size[f]) and 2.0**-PARAMETER_EXPONENT <= size[f] <= 2.0**PARAMETER_EXPONENT):
            raise LucidError(
                f"{where}: the scale {float(scale[f])!r} of feature {f} is outside [2^-{PARAMETER_EXPONENT}, "
                f"2^{PARAMETER_EXPONENT}] in magnitude"
                + (" (a scale of 0 maps every input to one point)" if scale[f] == 0 else "")
            )
    if offset.size and not (np.all(np.isfinite(offset)) and np.abs(offset).max() <= 2.0**PARAMETER_EXPONENT):
        f = int(np.argmax(np.where(np.isfinite(offset), np.abs(offset), np.inf)))
        raise LucidError(
            f"{where}: the offset {float(offset[f])!r} of feature {f} exceeds the limit 2^{PARAMETER_EXPONENT}"
        )


def check_tensors_range(tensors: dict[str, np.ndarray], meta: dict, where: str, chunk: int = 256) -> None:
    """The guard for a stacked `networks.safetensors` dict (every network, lowered as the verifier
    lowers it, a chunk at a time) over run.json's domain: `lucid train` and `lucid import`."""
    hull = None
    for start in range(0, len(tensors["removed"]), chunk):
        part = {k: v[start : start + chunk] for k, v in tensors.items()}
        h = stack_hull(stack_from_tensors(part, meta.get("architecture", {}), int(meta["input_dim"])))
        hull = h if hull is None else hull.join(h)
    if hull is not None:
        check_dynamic_range(hull, meta["domain"]["lower"], meta["domain"]["upper"], where)
