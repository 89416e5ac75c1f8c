"""LUCID-Inference (paper Algorithm 2): release N's label or draw one with the exponential mechanism.

A query's label is N's class c when N's confidence (score_c minus the runner-up) exceeds the
class's release threshold, max(beta_c, 0) + E_N (`lucid.analysis.soundness.release_thresholds`): the
verifier proved that above the iDP decision bound beta_c no single training row changes the label,
and E_N covers the float64 rounding of the confidence computed here, so releasing it leaks nothing.
Otherwise the label is drawn from the exponential mechanism with utility u(c) = 1, u(c') = 0
(sensitivity 1):

    P(c) = e^(eps/2) / (e^(eps/2) + C - 1),   P(c') = 1 / (e^(eps/2) + C - 1) for c' != c.

Everything here is vectorised over a batch of queries; the memo (lucid.access.memo) is applied
by the caller.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from lucid.errors import non_negative_number

_TWO_POW_53 = float(2**53)


class RandomSource:
    """Uniform draws in [0, 1) for the mechanism.

    Without a seed the bits come from the operating system's CSPRNG (`os.urandom`), because a
    predictable generator would let an attacker undo the noise. A seed gives numpy's PCG64,
    reproducible, and is meant for tests and evaluation tables only.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seeded = seed is not None
        self._rng = np.random.default_rng(seed) if seed is not None else None
        self._lock = threading.Lock()  # numpy Generators are not thread-safe

    def uniform(self, n: int) -> np.ndarray:
        if self._rng is not None:
            with self._lock:
                return self._rng.random(n)
        # 53 random bits per draw -> an exactly representable double in [0, 1).
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        return bits.astype(np.float64) / _TWO_POW_53


def true_label_probability(epsilon: float, num_classes: int) -> float:
    """P(release c) under the exponential mechanism, computed without overflow for large eps."""
    if num_classes < 2:
        return 1.0
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon / 2.0))


def check_epsilon(epsilon: float) -> float:
    return non_negative_number(epsilon, "epsilon")


def exponential_mechanism(classes: np.ndarray, num_classes: int, epsilon: float, rng: RandomSource) -> np.ndarray:
    """One draw per query: N's class `classes[i]` with P(c), each other class with P(c').

    One uniform u per query: u < P(c) gives c, otherwise u's position in the remaining mass
    [P(c), 1) picks one of the C - 1 other classes uniformly.
    """
    classes = np.asarray(classes, dtype=np.int64)
    if classes.size == 0 or num_classes < 2:
        return classes.copy()
    p_true = true_label_probability(epsilon, num_classes)
    if p_true >= 1.0:  # exp(-eps/2) underflowed: the other classes have probability 0
        return classes.copy()
    u = rng.uniform(classes.size)
    other = np.floor((u - p_true) / (1.0 - p_true) * (num_classes - 1)).astype(np.int64)
    other = np.clip(other, 0, num_classes - 2)
    # Skip c itself: the (k+1)-th class after c, cyclically, ranges over every c' != c.
    drawn = (classes + 1 + other) % num_classes
    return np.where(u < p_true, classes, drawn)


def needs_noise(confidences: np.ndarray, classes: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """True where the label must be noised: confidence <= the class's release threshold
    (`lucid.analysis.soundness.release_thresholds`: beta_c plus N's float error; +inf = nothing proved).
    `thresholds`: [C], or [B, C] with one row per input (its region's, `lucid.regions`)."""
    classes = np.asarray(classes, dtype=np.int64)
    if thresholds.ndim == 2:
        return ~(np.asarray(confidences) > thresholds[np.arange(len(classes)), classes])
    return ~(np.asarray(confidences) > thresholds[classes])
