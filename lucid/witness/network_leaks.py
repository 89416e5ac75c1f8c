"""Per-network leaks: the best replayed leak of every network, for the residual level.

`lucid verify --residual M` keeps, per class, each network's own best leak (a true lower bound on
beta*_{c,{i}}): the (M+1)-th largest of them is a lower bound on the level of any set of M networks
(lucid/bab/order_statistic.py). One leaking input usually leaks for many networks at once, so every
point is replayed through all of them (`leaks_at`), with the same rigorous float64 check as
`lucid.witness.replay.replay`: a network counts only if it disagrees with N beyond the error bound
of its own evaluation, and the claimed confidence is N's rounded down by N's error bound.
`sampled_leaks` seeds the leaks from many candidate inputs at once: a float32 pass ranks them, and
only the points it picks are replayed in float64; `searched_leaks` then climbs, network by network,
for the networks that decide the level's lower bound (gradient ascent on N and that network, the
class search's own tool), and replays every point it reaches through all the networks.
"""

from __future__ import annotations

import numpy as np

from lucid.deadline import paced, past
from lucid.network import UNIT_ROUNDOFF, NetworkStack, confidence
from lucid.witness.gradient import gradient_search
from lucid.witness.replay import CLAIM_PAD, DISAGREE_TOL, LeakQuery

SEARCH_STARTS = 4  # gradient starts per searched network: its most disagreeing candidate points
SEARCH_STEPS = 100
SAMPLES = 2048  # uniform samples of the domain (besides the training points) that `sampled_leaks` ranks
REPLAYED = 256  # points `sampled_leaks` replays in float64: the most confident leaking ones
CHUNK = 256  # networks per forward pass


def leaks_at(
    stack: NetworkStack, cls: int, x: np.ndarray, lower: np.ndarray, upper: np.ndarray, deadline: float | None = None
) -> np.ndarray:
    """[len(stack)] per position: the best claimed confidence of N over the points `x` ([B, d],
    clipped to the domain) at which that network strictly disagrees with class `cls`; -inf where
    it disagrees at none (and for position 0, N itself), and for the networks not reached by
    `deadline` (time.monotonic()): a leak is only ever claimed, never needed."""
    x = np.clip(np.atleast_2d(np.asarray(x, dtype=np.float64)), lower, upper)
    best = np.full(len(stack), -np.inf)
    if not len(x):
        return best
    scores_n, err_n = stack.select(np.array([0])).forward_with_error(x)
    scores_n, err_n = scores_n[0], err_n[0]  # [B, C]
    conf_n = confidence(scores_n, cls)
    pad = 4 * UNIT_ROUNDOFF  # a confidence is a difference of two scores, then rounded once more
    magnitude_n = np.abs(scores_n).max(axis=1)
    error_n = 2.0 * err_n.max(axis=1) + pad * magnitude_n
    for part in paced(len(stack) - 1, CHUNK, deadline):
        positions = np.arange(1, len(stack))[part]
        scores_s, err_s = stack.select(positions).forward_with_error(x)  # [k, B, C]
        magnitude_s = np.abs(scores_s).max(axis=2)
        scale = np.maximum(magnitude_n[None, :], magnitude_s)
        error_s = 2.0 * err_s.max(axis=2) + pad * magnitude_s
        disagrees = confidence(scores_s, cls) + np.maximum(DISAGREE_TOL * (1 + scale), error_s) < 0
        claim = conf_n[None, :] - np.maximum(CLAIM_PAD * (1 + scale), error_n[None, :])
        best[positions] = np.where(disagrees, claim, -np.inf).max(axis=1)
    return best


def sampled_leaks(
    stack: NetworkStack,
    cls: int,
    lower: np.ndarray,
    upper: np.ndarray,
    points: np.ndarray | None = None,
    seed: int = 0,
    deadline: float | None = None,
) -> np.ndarray:
    """`leaks_at` over the most promising of SAMPLES uniform samples and the training `points`:
    each network's most confident leaking point (ranked in float32; only the replay in float64
    decides), the REPLAYED most confident of them: the networks with the largest leaks, which set
    the level's lower bound, are the ones whose points are replayed. Until `deadline`
    (time.monotonic()): the networks not ranked or replayed by then get -inf."""
    x, conf_n = _candidates(stack, cls, lower, upper, points, seed)
    if not len(x):
        return np.full(len(stack), -np.inf)
    best = np.full(len(stack), -1, dtype=np.int64)  # per network: its most confident leaking point
    for part in paced(len(stack) - 1, CHUNK, deadline):
        positions = np.arange(1, len(stack))[part]
        scores = stack.select(positions).forward(x, float32=True)
        ranked = np.where(confidence(scores, cls) < 0, conf_n[None, :], -np.inf)
        top = ranked.argmax(axis=1)
        best[positions] = np.where(np.isfinite(ranked.max(axis=1)), top, -1)
    chosen = np.unique(best[best >= 0])
    chosen = chosen[np.argsort(-conf_n[chosen])[:REPLAYED]]
    return leaks_at(stack, cls, x[chosen], lower, upper, deadline)


def _candidates(
    stack: NetworkStack, cls: int, lower: np.ndarray, upper: np.ndarray, points: np.ndarray | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Uniform samples of the domain and the training points, those N labels `cls`, with N's
    confidence there."""
    rng = np.random.default_rng(seed)
    candidates = [lower + (upper - lower) * rng.random((SAMPLES, len(lower)))]
    if points is not None and len(points):
        candidates.append(np.clip(np.asarray(points, dtype=np.float64), lower, upper))
    x = np.concatenate(candidates)
    conf_n = confidence(stack.select(np.array([0])).forward(x)[0], cls)
    return x[conf_n > 0], conf_n[conf_n > 0]


def searched_leaks(
    stack: NetworkStack,
    cls: int,
    positions: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    points: np.ndarray | None = None,
    deadline: float | None = None,
    seed: int = 0,
) -> np.ndarray:
    """`leaks_at` over the points that gradient ascent reaches for each network of `positions` in
    turn (from its SEARCH_STARTS most disagreeing candidates), until `deadline` (time.monotonic())."""
    x, _ = _candidates(stack, cls, lower, upper, points, seed)
    found = []
    for p in positions:
        if past(deadline) or not len(x):
            break
        own = np.array([int(p)])
        starts = x[np.argsort(confidence(stack.select(own).forward(x)[0], cls))[:SEARCH_STARTS]]
        leak = gradient_search(
            LeakQuery(stack, own, cls, lower, upper), starts, steps=SEARCH_STEPS, polish=1, seed=seed, deadline=deadline
        )
        if leak is not None:
            found.append(leak.x)
    return leaks_at(stack, cls, np.array(found), lower, upper) if found else np.full(len(stack), -np.inf)


class NetworkLeaks:
    """The leak sources of one verification problem, as the engine's residual search reads them:
    a point's leaks over every network (`at`), the seeded ones (`sampled`) and which position a
    leaking row's network holds (`position`)."""

    def __init__(
        self, stack: NetworkStack, lower: np.ndarray, upper: np.ndarray, points: np.ndarray | None = None
    ) -> None:
        self.stack, self.lower, self.upper, self.points = stack, lower, upper, points
        self._positions = {int(r): p for p, r in enumerate(stack.removed)}

    @classmethod
    def of(cls, problem) -> NetworkLeaks:
        """Over a verification problem's networks, domain and training points (`lucid.analysis.problem`)."""
        return cls(problem.stack, problem.lower, problem.upper, problem.points)

    def at(self, cls: int, x: np.ndarray) -> np.ndarray:
        return leaks_at(self.stack, cls, x, self.lower, self.upper)

    def sampled(self, cls: int, deadline: float | None = None) -> np.ndarray:
        return sampled_leaks(self.stack, cls, self.lower, self.upper, self.points, deadline=deadline)

    def searched(self, cls: int, positions: np.ndarray, deadline: float | None) -> np.ndarray:
        return searched_leaks(self.stack, cls, positions, self.lower, self.upper, self.points, deadline)

    def position(self, row: int) -> int | None:
        return self._positions.get(int(row))

    def row(self, position: int) -> int:
        return int(self.stack.removed[position])
