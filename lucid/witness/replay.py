"""Witness replay: turn a solver's candidate input into a *true* lower bound on beta*_{c,S}, or drop it.

A MILP witness x is re-checked in float64 with the concrete networks: the lower bound
C_N^c(x) is claimed only if some network N' of S strictly disagrees, C_{N'}^c(x) < -tol. Raw
witnesses usually sit exactly on N's boundary (C_{N'}^c(x) = 0 up to solver tolerance), so a
failed witness is *repaired* first: the activation patterns of N and of a candidate N' at x are
fixed, which makes both networks affine, and one small LP maximises N's confidence subject to
N' preferring another class by a margin. The repaired point is replayed like any other; a point
that still fails is dropped and logged, never used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from lucid.deadline import past
from lucid.dynamic_range import outside_band
from lucid.network import UNIT_ROUNDOFF, NetworkStack, confidence

log = logging.getLogger(__name__)

DISAGREE_TOL = 1e-9  # |float64 forward error| on these networks is ~1e-13; a strict margin
REPAIR_MARGIN = 1e-7  # the margin the repair LP asks for, comfortably above DISAGREE_TOL
CLAIM_PAD = 1e-12  # a claimed lower bound is rounded down by this (times the score scale)


@dataclass(frozen=True, eq=False)
class LeakQuery:
    """What a leak search looks for (eq=False: arrays): an input of the box [lower, upper] where N
    (network 0 of `stack`) is confident in `cls` and a network of `stack` at `positions` is not.
    The searches that walk or climb (`climb`, `lucid.witness.gradient`, `lucid.witness.search`)
    take it whole; `replay` and `repair` check one point."""

    stack: NetworkStack
    positions: np.ndarray
    cls: int
    lower: np.ndarray
    upper: np.ndarray


@dataclass
class LeakWitness:
    x: np.ndarray  # in the domain, float64
    confidence: float  # a true lower bound on beta*_{c,S}: N's confidence at x, rounded down
    position: int  # stack position of a network of S that strictly disagrees at x
    leaking_row: int
    repaired: bool


def _confidences(
    stack: NetworkStack, positions: np.ndarray, x: np.ndarray, cls: int
) -> tuple[float, np.ndarray, float, float, np.ndarray]:
    """N's confidence, the confidences of the networks of S, the score scale and rigorous bounds on
    the float error of N's and of each S confidence (`NetworkStack.forward_with_error`)."""
    scores_n, err_n = stack.select(np.array([0])).forward_with_error(x[None, :])
    scores_s, err_s = stack.select(positions).forward_with_error(x[None, :])
    scores_n, err_n, scores_s, err_s = scores_n[0, 0], err_n[0, 0], scores_s[:, 0, :], err_s[:, 0, :]
    conf_n = float(confidence(scores_n, cls))
    scale = float(max(np.abs(scores_n).max(), np.abs(scores_s).max()))
    # a confidence is a difference of two scores, then rounded once more: both errors and that rounding
    pad = 4 * UNIT_ROUNDOFF
    error_n = 2.0 * float(err_n.max()) + pad * float(np.abs(scores_n).max())
    error_s = 2.0 * err_s.max(axis=1) + pad * np.abs(scores_s).max(axis=1)
    return conf_n, confidence(scores_s, cls), scale, error_n, error_s


def replay(
    stack: NetworkStack,
    positions: np.ndarray,
    x: np.ndarray,
    cls: int,
    lower: np.ndarray,
    upper: np.ndarray,
    repaired: bool = False,
) -> LeakWitness | None:
    """The witness if x (clipped to the domain) truly leaks for some network of S, else None.

    "Truly": the disagreement and the claimed confidence hold for the exact (real-number) networks,
    not only for their float64 evaluation: the tolerances are at least the rigorous error bounds of
    that evaluation (which matter only at extreme weight scales)."""
    x = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
    conf_n, conf_s, scale, error_n, error_s = _confidences(stack, positions, x, cls)
    strict = conf_s + np.maximum(DISAGREE_TOL * (1 + scale), error_s)  # < 0: disagrees exactly too
    j = int(np.argmin(strict))
    if not strict[j] < 0:
        return None
    pos = int(positions[j])
    claim = conf_n - max(CLAIM_PAD * (1 + scale), error_n)
    return LeakWitness(x, claim, pos, int(stack.removed[pos]), repaired)


def _affine_pieces(weights: list[np.ndarray], biases: list[np.ndarray], x: np.ndarray):
    """Fix the activation pattern at x: returns (G, h) pattern rows G y <= h, and the scores map (M, m)."""
    M = np.eye(len(x))
    m = np.zeros(len(x))
    G: list[np.ndarray] = []
    h: list[np.ndarray] = []
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        A, a = w @ M, w @ m + b
        if k == len(weights) - 1:
            return (np.concatenate(G) if G else np.zeros((0, len(x)))), (np.concatenate(h) if h else np.zeros(0)), A, a
        pre = A @ x + a
        on = pre > 0
        # active: pre >= 0  <=>  -A y <= a ; inactive: pre <= 0  <=>  A y <= -a
        sign = np.where(on, -1.0, 1.0)
        G.append(sign[:, None] * A)
        h.append(np.where(on, a, -a))
        M, m = A * on[:, None], a * on


def _scaled_rows(A: np.ndarray, b: np.ndarray, scale: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The repair LP's rows, each divided by a power of two near its largest coefficient on x, when
    the scores' magnitude lies outside the band (`lucid.dynamic_range.outside_band`): the LP's
    absolute tolerances then mean the same at every weight scale (beta becomes beta / that power in
    the rows that hold it, which changes no optimal x). Ordinary networks keep their LP as it is.
    Replay checks the answer anyway."""
    if scale == 0 or not outside_band(scale):
        return A, b
    size = np.abs(A[:, :d]).max(axis=1)
    holds_beta = A[:, d] != 0
    if holds_beta.any():  # one divisor for every row of beta, so beta' = beta / it: the same optimum x
        size[holds_beta] = size[holds_beta].max()
    size = np.where(size > 0, np.ldexp(1.0, np.frexp(np.where(size > 0, size, 1.0))[1]), 1.0)
    A, b = A / size[:, None], b / size
    A[holds_beta, d] = 1.0
    return A, b


def repair(
    stack: NetworkStack,
    positions: np.ndarray,
    x: np.ndarray,
    cls: int,
    lower: np.ndarray,
    upper: np.ndarray,
    candidates: int = 3,
) -> LeakWitness | None:
    """Search near x, inside the linear regions of N and of the most promising networks of S."""
    from scipy.optimize import linprog

    x = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
    _, conf_s, scale, _, error_s = _confidences(stack, positions, x, cls)
    n_w = [w[0] for w in stack.weights]
    n_b = [b[0] for b in stack.biases]
    Gn, hn, Sn, sn = _affine_pieces(n_w, n_b, x)
    C = stack.num_classes
    others = [t for t in range(C) if t != cls]
    d = len(x)
    for j in np.argsort(conf_s)[:candidates]:
        pos = int(positions[j])
        p_w = [w[pos] for w in stack.weights]
        p_b = [b[pos] for b in stack.biases]
        Gp, hp, Sp, sp_ = _affine_pieces(p_w, p_b, x)
        scores_p = Sp @ x + sp_
        t = max(others, key=lambda c: scores_p[c])
        # variables (y, beta); maximise beta
        rows, rhs = [], []
        for G, h in ((Gn, hn), (Gp, hp)):
            rows.append(np.hstack([G, np.zeros((len(G), 1))]))
            rhs.append(h)
        for u in others:  # beta <= s_c - s_u  for N
            rows.append(np.hstack([-(Sn[cls] - Sn[u])[None, :], [[1.0]]]))
            rhs.append([sn[cls] - sn[u]])
        # N' prefers t: s'_t - s'_c >= margin
        rows.append(np.hstack([-(Sp[t] - Sp[cls])[None, :], [[0.0]]]))
        # (at least twice what replay will ask for: its tolerance and the float error of N''s evaluation)
        margin = max(REPAIR_MARGIN, 2.0 * DISAGREE_TOL * (1 + scale), 4.0 * float(error_s[j]))
        rhs.append([(sp_[t] - sp_[cls]) - margin])
        A_ub, b_ub = np.vstack(rows), np.concatenate([np.ravel(r) for r in rhs])
        A_ub, b_ub = _scaled_rows(A_ub, b_ub, scale, d)
        c = np.zeros(d + 1)
        c[-1] = -1.0
        bounds = list(zip(lower, upper, strict=True)) + [(None, None)]
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, bounds=bounds, method="highs")
        if res.status != 0:
            continue
        found = replay(stack, positions, res.x[:d], cls, lower, upper, repaired=True)
        if found is not None:
            return found
    return None


def find_leak(
    stack: NetworkStack, positions: np.ndarray, x: np.ndarray | None, cls: int, lower: np.ndarray, upper: np.ndarray
) -> LeakWitness | None:
    """Replay x; repair it if it does not strictly leak; None (logged) if neither works."""
    if x is None or not np.all(np.isfinite(x)):
        return None
    positions = np.asarray(positions, dtype=np.int64)
    found = replay(stack, positions, x, cls, lower, upper)
    if found is None:
        found = repair(stack, positions, x, cls, lower, upper)
    if found is None:
        log.info("witness for class %d dropped: no network of S strictly disagrees at it, even after repair", cls)
    return found


def climb(query: LeakQuery, x: np.ndarray, steps: int = 20, deadline: float | None = None) -> LeakWitness | None:
    """The best leak met on a walk from x across linear regions, one `repair` LP per region.

    Each LP's optimum lies on a region boundary; stepping slightly past it (along the move just
    made) lets the next linearisation see the neighbouring region."""
    lower, upper = query.lower, query.upper
    x = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
    best: LeakWitness | None = None
    point = x
    for _ in range(steps):
        if past(deadline):
            break
        found = repair(query.stack, query.positions, point, query.cls, lower, upper, candidates=2)
        if found is None:
            break
        if best is None or found.confidence > best.confidence:
            best = found
        if np.allclose(found.x, point, atol=1e-12):
            break
        point = np.clip(found.x + 1e-7 * (found.x - point), lower, upper)
    return best
