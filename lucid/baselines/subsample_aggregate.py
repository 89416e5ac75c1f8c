"""Subsample-and-aggregate label-only private prediction (van der Maaten & Hannun, 2020).

T models are trained on T disjoint parts of the training set. A query is answered by the
exponential mechanism over the vote counts n_c: P(c) ∝ exp(eps * n_c / 2). Removing or changing
one training row changes one model, hence one vote: the utility n_c has sensitivity 1, so this
is eps-DP per query. (That paper's beta = eps / B would understate eps by up to 2x; not used.)

Accuracy is reported as the exact expected accuracy of the randomized answers (the mean over
test rows of P(true label)), so it has no sampling noise; a seeded sampled accuracy is kept too.
Training happens once per T; every eps reuses the same votes and reports the same seconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from scipy.special import softmax

from lucid.access.mechanism import check_epsilon
from lucid.baselines.common import BaselineResult, Dataset, TrainConfig, predict, train_sgd
from lucid.errors import LucidError

METHOD = "subsample_aggregate"


def method_name(teachers: int) -> str:
    return f"{METHOD}[T={teachers}]"


def disjoint_parts(n: int, teachers: int, seed: int) -> list[np.ndarray]:
    """A seeded partition of range(n) into `teachers` near-equal disjoint parts."""
    if teachers < 1:
        raise LucidError(f"the number of teachers must be positive, got {teachers}")
    if teachers > n:
        raise LucidError(f"cannot split {n} training rows into {teachers} non-empty disjoint parts")
    return np.array_split(np.random.default_rng(seed).permutation(n), teachers)


def vote_counts(data: Dataset, config: TrainConfig, teachers: int) -> tuple[np.ndarray, float]:
    """[test rows, C] votes of the T teachers, and the seconds spent training them."""
    start = time.perf_counter()
    votes = np.zeros((len(data.X_test), data.num_classes), dtype=np.int64)
    rows = np.arange(len(data.X_test))
    for t, part in enumerate(disjoint_parts(len(data.X_train), teachers, config.seed)):
        model = train_sgd(data.X_train[part], data.y_train[part], data.num_classes, config, seed=config.seed + t)
        np.add.at(votes, (rows, predict(model, data.X_test)), 1)
    return votes, time.perf_counter() - start


def answer_probabilities(votes: np.ndarray, epsilon: float) -> np.ndarray:
    """The exponential mechanism's distribution over labels for each query: softmax(eps * n / 2)."""
    return softmax(check_epsilon(epsilon) * np.asarray(votes, dtype=np.float64) / 2.0, axis=1)


def run_subsample_aggregate(
    data: Dataset, config: TrainConfig, teachers: int, epsilons: Sequence[float]
) -> list[BaselineResult]:
    """One result per eps for T = `teachers` (eps-DP per single query)."""
    epsilons = [check_epsilon(e) for e in epsilons]
    if len(data.X_train) < teachers:
        return [
            BaselineResult(
                method_name(teachers),
                e,
                None,
                0.0,
                "unreachable",
                f"only {len(data.X_train)} training rows for {teachers} teachers",
                {"teachers": teachers},
            )
            for e in epsilons
        ]
    votes, seconds = vote_counts(data, config, teachers)
    rng = np.random.default_rng(config.seed)
    results = []
    for e in epsilons:
        probs = answer_probabilities(votes, e)
        expected = float(probs[np.arange(len(probs)), data.y_test].mean())
        sampled_labels = (probs.cumsum(axis=1) > rng.random((len(probs), 1))).argmax(axis=1)
        results.append(
            BaselineResult(
                method_name(teachers),
                e,
                expected,
                seconds,
                "ok",
                "",
                {
                    "teachers": teachers,
                    "sampled_accuracy": float((sampled_labels == data.y_test).mean()),
                    "majority_accuracy": float((votes.argmax(axis=1) == data.y_test).mean()),
                    "privacy": "eps-DP per single query",
                },
            )
        )
    return results
