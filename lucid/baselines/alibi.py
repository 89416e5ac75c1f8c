"""ALIBI label-DP baseline (Malek Esmaeili et al., NeurIPS 2021, "Antipodes of Label
Differential Privacy: PATE and ALIBI").

Each training label is released once as a noisy one-hot vector y~ = e_y + Lap(2/eps)^C. The
one-hot vectors of two labels differ by 2 in L1 norm, so this Laplace randomized response is
eps-label-DP. Bayesian post-processing turns y~ into the soft label
    P(c | y~) ∝ prior(c) * exp(-(eps/2) * ||y~ - e_c||_1)
(uniform prior: a data-dependent prior would spend budget), and the network is trained on the
soft labels with the usual SGD settings. Training only touches y~, so the model is eps-label-DP
by post-processing. Features are not protected (label DP), as in the paper's comparison.
"""

from __future__ import annotations

import time

import numpy as np

from lucid.access.mechanism import check_epsilon
from lucid.baselines.common import BaselineResult, Dataset, TrainConfig, accuracy, train_sgd

METHOD = "alibi"


def noisy_soft_labels(labels: np.ndarray, num_classes: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Laplace randomized response on one-hot labels followed by the Bayesian posterior [n, C]."""
    n = len(labels)
    if epsilon == 0:  # infinite noise: the posterior is the (uniform) prior
        return np.full((n, num_classes), 1.0 / num_classes, dtype=np.float32)
    noisy = np.eye(num_classes)[labels] + rng.laplace(scale=2.0 / epsilon, size=(n, num_classes))
    # ||y~ - e_c||_1 = sum_k |y~_k| - |y~_c| + |y~_c - 1|: only the last two terms depend on c.
    log_post = -(epsilon / 2.0) * (np.abs(noisy - 1.0) - np.abs(noisy))
    log_post -= log_post.max(axis=1, keepdims=True)
    post = np.exp(log_post)
    return (post / post.sum(axis=1, keepdims=True)).astype(np.float32)


def train_alibi(data: Dataset, config: TrainConfig, epsilon: float) -> BaselineResult:
    """Train on ALIBI soft labels at eps-label-DP; returns test accuracy and training seconds."""
    epsilon = check_epsilon(epsilon)
    start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    soft = noisy_soft_labels(data.y_train, data.num_classes, epsilon, rng)
    model = train_sgd(data.X_train, soft, data.num_classes, config)
    seconds = time.perf_counter() - start
    agree = float((soft.argmax(axis=1) == data.y_train).mean())
    return BaselineResult(
        METHOD,
        epsilon,
        accuracy(model, data.X_test, data.y_test),
        seconds,
        "ok",
        "",
        {"soft_label_agreement": agree, "privacy": "label-DP"},
    )
