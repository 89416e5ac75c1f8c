"""AGT smooth-sensitivity private prediction (Wicker et al., "Certification for Differentially
Private Prediction in Gradient-Based Training"), for binary classifiers.

Single model: N is trained by LUCID's algorithm T and abstract gradient training gives the boxes
for k = 1..k_max removed rows. At a query x, k' is the largest k whose box certifies N's label
(`lucid.agt.stability`; 0 if none). The answer is 1 iff f + z > 1/2, f = N's label in {0, 1},
z ~ Cauchy(0, 6 exp(-eps k' / 6) / eps): the smooth-sensitivity mechanism with beta = eps / 6 and
the sensitivity bound exp(-beta k') that stability at distance k' gives (k' = 0: the global
sensitivity 1, scale 6 / eps).

Teachers (T > 1): T networks trained by T on disjoint parts, each with its own boxes and
distances k_i; with vote counts n_0, n_1 and n = ceil(|n_1 - n_0| / 2), the majority g is stable
at distance K = (sum of the n smallest k_i) + n - 1 (flipping g needs n votes, and flipping the
i-th needs more than k_i removals); g gets the same Cauchy mechanism with K (K < 0, a tie: K = 0).

Why only a k-grid of 1..k_max: each k is one abstract training run (its cost grows linearly);
the paper finds the gain flattens after ~10 values and larger k rarely certify anything.

What the eps means here, stated exactly: it is the paper's nominal eps (per query; queries
compose), and this module is a baseline for comparison, not a proven guarantee. Two gaps:
(1) the smooth-sensitivity argument needs the noise scale computed on a neighbouring data set to
be within a factor exp(eps / 6) of this one's; a certified k' only bounds the true stable distance
from below, so a neighbour's own AGT run may certify a much larger k' (the AGT paper's "any upper
bound on the smooth sensitivity will do" step has the same gap); for a 0/1 release with equal
labels the privacy loss between the two is at most eps * |k' - k''| / 6. (2) `lucid.agt` bounds
*removals* only; from the smaller data set's side a removal is an addition, which no box here
covers (the paper's boxes bound both).

Accuracy is the exact expected accuracy of the randomized answers (Cauchy CDF, no sampling
noise); a seeded sampled accuracy, the share of queries with k' >= 1 and the mean k' are in
the details. A box that diverges (the paper's own settings do, benchmarks/results/agt.md) ends
the k-grid there: its queries get the distances of the smaller boxes, and the details say so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch

from lucid.access.mechanism import check_epsilon
from lucid.agt import AgtDiverged, abstract_train
from lucid.agt.stability import stable_distances
from lucid.baselines.common import BaselineResult, Dataset, TrainConfig
from lucid.baselines.models import parse_architecture
from lucid.baselines.subsample_aggregate import disjoint_parts
from lucid.errors import LucidError
from lucid.network import stack_from_tensors
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training.architecture import initial_parameters
from lucid.training.vectorized import batch_orders, train_networks

METHOD = "agt_smooth_sensitivity"


def method_name(teachers: int) -> str:
    return METHOD if teachers == 1 else f"{METHOD}[T={teachers}]"


def noise_scale(epsilon: float, distance: np.ndarray | int) -> np.ndarray:
    """Cauchy scale 6 exp(-eps k / 6) / eps for a stable distance k."""
    return 6.0 * np.exp(-epsilon * np.asarray(distance, dtype=np.float64) / 6.0) / epsilon


def probability_of_one(label: np.ndarray, distance: np.ndarray, epsilon: float) -> np.ndarray:
    """P(label + z > 1/2), z ~ Cauchy(0, scale): 1/2 - arctan((1/2 - label) / scale) / pi."""
    scale = noise_scale(epsilon, distance)
    return 0.5 - np.arctan((0.5 - np.asarray(label, dtype=np.float64)) / scale) / np.pi


def ensemble_distance(votes_one: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """K per query for T teachers: votes_one [rows] (teachers voting 1), distances [rows, T]."""
    distances = np.sort(np.asarray(distances, dtype=np.int64), axis=1)
    teachers = distances.shape[1]
    n = np.ceil(np.abs(2 * np.asarray(votes_one) - teachers) / 2).astype(np.int64)
    cumulative = np.concatenate([np.zeros((len(n), 1), dtype=np.int64), distances.cumsum(axis=1)], axis=1)
    return np.maximum(cumulative[np.arange(len(n)), n] + n - 1, 0)


def _teacher(
    data: Dataset, config: TrainConfig, rows: np.ndarray, seed: int, k_max: int, max_width: float
) -> tuple[np.ndarray, np.ndarray, dict]:
    """N's test labels and stable distances for a network trained by T on `rows`."""
    spec = parse_architecture(config.arch)
    X = torch.from_numpy(data.X_train[rows])
    y = torch.from_numpy(data.y_train[rows])
    init = initial_parameters(spec, data.input_dim, data.num_classes, seed)
    orders = batch_orders(len(rows), int(config.epochs), seed)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(config.lr, config.weight_decay, int(config.batch_size), data.num_classes)
    params = train_networks(inputs, sgd, torch.tensor([-1]))
    tensors = {name: p.numpy() for name, p in params.items()} | {"removed": np.array([-1])}
    stack = stack_from_tensors(tensors, spec, data.input_dim)  # the project's one stacked forward pass
    labels = stack.forward(data.X_test)[0].argmax(axis=1)
    boxes, diverged = {}, None
    for k in range(1, k_max + 1):
        try:
            boxes[k] = abstract_train(inputs, sgd, k=k, max_width=max_width)
        except AgtDiverged as exc:
            diverged = f"k = {k}: {exc}"
            break
    distances = stable_distances(boxes, data.X_test, labels) if boxes else np.zeros(len(labels), dtype=np.int64)
    return labels, distances, {"boxes": sorted(boxes), "diverged": diverged}


def run_smooth_sensitivity(
    data: Dataset,
    config: TrainConfig,
    epsilons: Sequence[float],
    *,
    k_max: int = 10,
    teachers: int = 1,
    max_width: float = 1e6,
) -> list[BaselineResult]:
    """One result per eps (the paper's nominal eps per query; the module docstring says why it is not proven here)."""
    epsilons = [check_epsilon(e) for e in epsilons]
    if int(k_max) != k_max or k_max < 1:
        raise LucidError(f"k_max must be a positive integer, got {k_max}")
    if int(teachers) != teachers or teachers < 1:
        raise LucidError(f"the number of teachers must be a positive integer, got {teachers}")
    if not (math.isfinite(max_width) and max_width > 0):
        raise LucidError(f"the AGT width limit must be a positive number, got {max_width}")
    name = method_name(teachers)
    info = {"teachers": teachers, "k_max": k_max, "privacy": "nominal eps per query (module docstring)"}
    if data.num_classes != 2:
        return [
            BaselineResult(
                name,
                e,
                None,
                0.0,
                "unreachable",
                f"the smooth-sensitivity mechanism is for binary classifiers ({data.num_classes} classes)",
                info,
            )
            for e in epsilons
        ]
    if parse_architecture(config.arch)["type"] != "mlp":
        return [
            BaselineResult(name, e, None, 0.0, "unreachable", "lucid.agt certifies predictions of MLP boxes only", info)
            for e in epsilons
        ]
    if len(data.X_train) < teachers:
        return [
            BaselineResult(
                name,
                e,
                None,
                0.0,
                "unreachable",
                f"only {len(data.X_train)} training rows for {teachers} teachers",
                info,
            )
            for e in epsilons
        ]
    if (data.X_train < 0).any() or (data.X_test < 0).any():
        raise LucidError("the AGT baseline needs non-negative features (LUCID's [0, 1] domain)")
    start = time.perf_counter()
    parts = (
        [np.arange(len(data.X_train))] if teachers == 1 else disjoint_parts(len(data.X_train), teachers, config.seed)
    )
    labels, distances, notes = [], [], []
    for t, rows in enumerate(parts):
        lab, dist, note = _teacher(data, config, rows, config.seed + t, int(k_max), max_width)
        labels.append(lab)
        distances.append(dist)
        notes.append(note)
    seconds = time.perf_counter() - start
    all_labels, all_distances = np.stack(labels, axis=1), np.stack(distances, axis=1)  # [rows, T]
    if teachers == 1:
        answer, distance = all_labels[:, 0], all_distances[:, 0]
    else:
        votes_one = all_labels.sum(axis=1)
        answer = (2 * votes_one >= teachers).astype(np.int64)  # ties answer 1, as the paper's g
        distance = ensemble_distance(votes_one, all_distances)
    diverged = [n["diverged"] for n in notes if n["diverged"]]
    rng = np.random.default_rng(config.seed)
    results = []
    for e in epsilons:
        if e == 0:
            results.append(
                BaselineResult(name, e, None, seconds, "unreachable", "eps = 0 would need infinite Cauchy noise", info)
            )
            continue
        p_one = probability_of_one(answer, distance, e)
        p_true = np.where(data.y_test == 1, p_one, 1.0 - p_one)
        sampled = (rng.random(len(p_one)) < p_one).astype(np.int64)
        results.append(
            BaselineResult(
                name,
                e,
                float(p_true.mean()),
                seconds,
                "ok",
                "",
                {
                    **info,
                    "sampled_accuracy": float((sampled == data.y_test).mean()),
                    "noise_free_accuracy": float((answer == data.y_test).mean()),
                    "stable_share": float((distance >= 1).mean()),
                    "mean_distance": float(distance.mean()),
                    "boxes": notes[0]["boxes"],
                    "diverged": diverged[:3],
                },
            )
        )
    return results
