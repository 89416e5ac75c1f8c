"""The released decision is covered in exact arithmetic, although N's confidence is float64.

Bounds are proved about real numbers; the access layer computes N's confidence in float64. When
N' is one float32 step away from N the exact beta* and a proved bound can lie 1e-17 apart, less
than the rounding error of the float confidence, so the release rule adds a bound E_N on that error
(`lucid.analysis.soundness.confidence_error` / `release_thresholds`). Checked here against exact
rational arithmetic (`fractions.Fraction`: every float is a dyadic rational, so sums and products
of the stored parameters and inputs are exact).
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from bruteforce import exact_singleton_bound
from synthetic_runs import write_bounds, write_synthetic_run

from lucid.access import ClassifierOptions, LabelOnlyClassifier
from lucid.bounds.pair import PairProblem
from lucid.bounds.relu_split import split_upper_bound
from lucid.bounds.split_options import SplitControl
from lucid.network import NetworkStack, load_networks
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.soundness import confidence_error, release_thresholds

LOWER, UPPER = np.zeros(2), np.ones(2)


def exact_scores(layers, x) -> list[Fraction]:
    """Scores of the network (list of (W [out, in], b)) at x, in exact rational arithmetic."""
    h = [Fraction(float(v)) for v in x]
    for k, (w, b) in enumerate(layers):
        z = [sum((Fraction(float(w[i, j])) * h[j] for j in range(len(h))), Fraction(float(b[i])))
             for i in range(w.shape[0])]
        h = [max(v, Fraction(0)) for v in z] if k < len(layers) - 1 else z
    return h


def exact_label(scores: list[Fraction]) -> int | None:
    """The strict argmax, None on a tie (a tie counts as a disagreement: nothing is released on it)."""
    top = max(scores)
    return scores.index(top) if scores.count(top) == 1 else None


def exact_confidence(scores: list[Fraction]) -> Fraction:
    ranked = sorted(scores)
    return ranked[-1] - ranked[-2]


def float_layers(layers):
    return [w.astype(np.float64) for w, _ in layers], [b.astype(np.float64) for _, b in layers]


def random_layers(rng, sizes, scale=1.0):
    return [((rng.normal(0, 1.5 / np.sqrt(a), (b, a)) * scale).astype(np.float32),
             (rng.normal(0, 0.3, b) * scale).astype(np.float32)) for a, b in zip(sizes[:-1], sizes[1:])]


def one_ulp_pair(seed: int, share: float = 0.3):
    """N (2-8-2, float32) and N' = N with `share` of its parameters one float32 step away."""
    rng = np.random.default_rng(seed)
    n = random_layers(rng, [2, 8, 2])

    def nudge(t):
        t = t.copy()
        moved = rng.random(t.shape) < share
        towards = np.where(rng.random(t.shape) < 0.5, np.float32(np.inf), np.float32(-np.inf))
        t[moved] = np.nextafter(t[moved], towards[moved])
        return t

    return n, [(nudge(w), nudge(b)) for w, b in n]


def ulp_grid(x: np.ndarray, steps: int, lower=LOWER, upper=UPPER) -> np.ndarray:
    """Every float64 point within `steps` float steps of x in each coordinate, clipped to the domain."""
    axes = []
    for v in x:
        line = [float(v)]
        for direction in (np.inf, -np.inf):
            cur = float(v)
            for _ in range(steps):
                cur = float(np.nextafter(cur, direction))
                line.append(cur)
        axes.append(sorted(line))
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(x))
    return np.unique(np.clip(grid, lower, upper), axis=0)


def pair_run(path, n, p) -> NetworkStack:
    """A run directory whose networks are N and N' (the network without row 0)."""
    from safetensors.numpy import save_file

    write_synthetic_run(path, num_classes=2, input_dim=2, hidden=(8,), train_size=1)
    tensors = {}
    for i, ((wn, bn), (wp, bp)) in enumerate(zip(n, p)):
        tensors[f"layers.{i}.weight"] = np.stack([wn, wp])
        tensors[f"layers.{i}.bias"] = np.stack([bn, bp])
    tensors["removed"] = np.array([-1, 0], dtype=np.int64)
    save_file(tensors, str(path / "networks.safetensors"))
    return load_networks(path)


def released_but_disagreeing(clf: LabelOnlyClassifier, nets: list, X: np.ndarray) -> int:
    """How many points the classifier releases where N's exact label is not the released one or some
    network's exact label differs from it."""
    cls, noised = clf.decide(X)
    bad = 0
    for x, c in zip(X[~noised], cls[~noised]):
        if any(exact_label(exact_scores(net, x)) != c for net in nets):
            bad += 1
    return bad


def test_the_error_bound_covers_every_float_confidence():
    """|float64 confidence - exact confidence| <= E_N at random and near-tie inputs, for networks of
    several depths, huge weights and cancelling neurons; and E_N is small (it costs no accuracy)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for sizes, scale in [([2, 8, 2], 1.0), ([3, 6, 5, 3], 1.0), ([2, 8, 2], 1e6), ([4, 10, 10, 2], 30.0)]:
        layers = random_layers(rng, sizes, scale)
        if scale == 30.0:  # a neuron and its negation: large terms that cancel in the next layer
            w, b = layers[1]
            w[1] = -w[0]
            b[1] = -b[0]
        ws, bs = float_layers(layers)
        error = confidence_error(ws, bs, np.zeros(sizes[0]), np.ones(sizes[0]))
        X = rng.random((300, sizes[0]))
        h = X
        for k, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w.T + b
            if k < len(ws) - 1:
                h = np.maximum(h, 0.0)
        top2 = np.sort(h, axis=1)[:, -2:]
        conf = top2[:, 1] - top2[:, 0]
        for x, c in zip(X, conf):
            exact = exact_confidence(exact_scores(layers, x))
            gap = abs(Fraction(float(c)) - exact)
            assert gap <= Fraction(error), (sizes, scale, float(gap), error)
            worst = max(worst, float(gap) / error)
        assert error < 1e-9 * scale ** len(ws)
    assert worst > 1e-4  # the bound is not vacuous: real errors come within a few orders of it


def test_non_finite_parameters_have_no_error_bound():
    ws, bs = [np.array([[np.nan, 1.0]]), np.eye(1)], [np.zeros(1), np.zeros(1)]
    assert confidence_error(ws, bs, np.zeros(2), np.ones(2)) == np.inf
    assert np.isinf(release_thresholds(np.array([0.1, np.nan]), 1e-15)[1])


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_one_ulp_networks_release_no_input_that_leaks_in_exact_arithmetic(tmp_path, seed):
    """N' one float32 step from N: around the exact argmax of beta*, on every float64 point within a
    few steps, (a) with the bound at the sample's highest exact leaking confidence the old rule
    (float confidence > bound) releases leaking inputs and the new one none, (b) the splitting tier's
    bound is above every leaking confidence and, with the release rule, releases no leaking input."""
    n, p = one_ulp_pair(seed)
    stack = pair_run(tmp_path / "run", n, p)
    problem = VerificationProblem.from_stack(stack, LOWER, UPPER)
    old_rule_leaks = 0
    for cls in (0, 1):
        beta, argmax = exact_singleton_bound(float_layers(n), float_layers(p), cls, LOWER, UPPER)
        if argmax is None or not beta > 0:
            continue
        X = ulp_grid(argmax, 10)
        scores_n = [exact_scores(n, x) for x in X]
        scores_p = [exact_scores(p, x) for x in X]
        leaking = np.array([exact_label(a) != exact_label(b) or exact_label(a) is None
                            for a, b in zip(scores_n, scores_p)])
        n_label = np.array([exact_label(a) == cls for a in scores_n])
        assert (leaking & n_label).any()
        highest = max(float(exact_confidence(a)) for a, bad, mine in zip(scores_n, leaking, n_label) if bad and mine)

        write_bounds(tmp_path / "run", {cls: highest, 1 - cls: None})
        clf = LabelOnlyClassifier.from_run(tmp_path / "run", epsilon=1.0, options=ClassifierOptions(seed=0))
        f_cls, noised = clf.decide(X)
        f_conf = np.abs(clf.scores(X)[:, 1] - clf.scores(X)[:, 0])
        old_rule_leaks += int(np.sum(leaking & (f_cls == cls) & (f_conf > highest)))
        assert not np.any(leaking & ~noised)
        assert released_but_disagreeing(clf, [n, p], X) == 0

        ws, bs = float_layers(p)
        nw, nb = float_layers(n)
        pair = PairProblem(nw, nb, [w[None] for w in ws], [b[None] for b in bs], problem.n_bounds.lower,
                           problem.n_bounds.upper, LOWER, UPPER)
        tier = split_upper_bound(pair, cls, -np.inf, margin_upper=problem.margin_upper, control=SplitControl(3.0))
        assert tier.bound >= highest
        write_bounds(tmp_path / "run", {cls: tier.bound, 1 - cls: None})
        clf = LabelOnlyClassifier.from_run(tmp_path / "run", epsilon=1.0, options=ClassifierOptions(seed=0))
        assert released_but_disagreeing(clf, [n, p], X) == 0
    assert old_rule_leaks > 0  # float rounding decides here: the sample can tell the rules apart


def test_a_run_trained_with_a_tiny_learning_rate_releases_no_leaking_input(tmp_path):
    """`lucid train --lr 1e-7` from a pre-trained start: the leave-one-out networks are a few float32
    steps from N and `lucid verify` proves bounds of order 1e-7. Around each class's exact argmax
    (every network's beta* by the 2-D oracle), no released input has a disagreeing network."""
    rng = np.random.default_rng(1)
    for name, rows in (("public.csv", 200), ("private.csv", 16)):
        X = rng.random((rows, 2))
        y = (X[:, 0] + 0.3 * rng.normal(size=rows) > X[:, 1]).astype(int)
        np.savetxt(tmp_path / name, np.c_[X, y], delimiter=",", header="a,b,label", comments="", fmt="%.6f")

    def lucid(*args):
        # the CLI's main in this process (CI time: three interpreters importing torch and lucid)
        from lucid.cli import main

        try:
            main(list(args))
        except SystemExit as exc:
            assert not exc.code, exc.code

    common = ["--arch", "8", "--no-progress", "--test-fraction", "0.25"]
    lucid("train", str(tmp_path / "public.csv"), "--out", str(tmp_path / "pre"), "--epochs", "100", "--lr", "0.5",
          "--batch-size", "16", "--no-loo", *common)
    run = tmp_path / "run"
    lucid("train", str(tmp_path / "private.csv"), "--out", str(run), "--epochs", "3", "--lr", "1e-7",
          "--batch-size", "4", "--init", str(tmp_path / "pre"), *common)
    # MILPs only (23 s to 10 s with the splitting tier; CI time): the bounds are as sound, a little looser
    lucid("verify", str(run), "--time-limit", "120", "--split-time", "0")
    bounds = json.loads((run / "bounds.json").read_text())["bounds"]
    assert all(entry["upper"] is not None for entry in bounds.values())

    stack = load_networks(run)
    nets, seen = [], set()
    for i in range(len(stack)):
        layers = [(w[i], b[i]) for w, b in zip(stack.weights, stack.biases)]
        key = b"".join(a.tobytes() for pair in layers for a in pair)
        if key not in seen:  # bit-identical networks agree everywhere: check each once
            seen.add(key)
            nets.append(layers)
    assert len(nets) > 1
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, options=ClassifierOptions(seed=0))
    lower, upper = clf.domain_lower, clf.domain_upper
    checked = 0
    for cls in (0, 1):
        found = [exact_singleton_bound(float_layers(nets[0]), float_layers(net), cls, lower, upper) for net in nets[1:]]
        beta, argmax = max(found, key=lambda f: f[0])
        if argmax is None or not beta > 0:
            continue
        assert bounds[str(cls)]["upper"] >= beta - 1e-12
        X = ulp_grid(argmax, 6, lower, upper)
        assert released_but_disagreeing(clf, nets, X) == 0
        checked += 1
    assert checked
