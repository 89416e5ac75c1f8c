"""Baselines (issue 5): architecture parity with the run contract, mechanism correctness of
ALIBI and subsample-and-aggregate against independent computations, DP-SGD's target handling."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lucid.baselines.alibi import noisy_soft_labels, train_alibi
from lucid.baselines.common import DpSgdSettings, TrainConfig, check_data, load_run_data, train_plain
from lucid.baselines.dpsgd import train_dpsgd
from lucid.baselines.models import build_model, parse_architecture
from lucid.baselines.subsample_aggregate import answer_probabilities, disjoint_parts, run_subsample_aggregate
from lucid.errors import LucidError
from lucid.network import stack_from_tensors

torch.set_num_threads(1)  # tiny networks: extra threads only add contention on CI's 2 cores


def blobs(n: int, seed: int = 0, d: int = 5):
    """Two well-separated classes in [0, 1]^d."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = np.clip(0.3 + 0.4 * y[:, None] + rng.normal(0, 0.08, (n, d)), 0, 1).astype(np.float32)
    return X, y


def small_data(n_train=160, n_test=100):
    Xa, ya = blobs(n_train, 1)
    Xb, yb = blobs(n_test, 2)
    return check_data(Xa, ya, Xb, yb)


@pytest.mark.parametrize("arch", ["2x50", "3x7", "cnn"])
def test_model_matches_the_run_contract_lowering(arch):
    """Exporting the torch model under the contract's tensor names and lowering it with
    lucid.network gives the same scores: the baselines train exactly the run's architecture."""
    torch.manual_seed(0)
    d, c = 7, 3
    model = build_model(arch, d, c)
    tensors = {k: v.detach().numpy()[None] for k, v in model.state_dict().items()}
    tensors["removed"] = np.array([-1], dtype=np.int64)
    stack = stack_from_tensors(tensors, parse_architecture(arch), d)
    x = np.random.default_rng(0).random((11, d)).astype(np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(stack.forward(x)[0], expected, rtol=1e-5, atol=1e-5)
    if arch == "cnn":
        assert stack.layer_sizes == [7, 6 * 5, 6 * 3, 2, 3]


def test_parse_architecture():
    assert parse_architecture("4x30") == {"type": "mlp", "hidden": [30, 30, 30, 30]}
    assert parse_architecture({"type": "mlp", "hidden": [2, 3]})["hidden"] == [2, 3]
    for bad in ["2x", "0x5", "mlp", {"type": "rnn"}]:
        with pytest.raises(LucidError):
            parse_architecture(bad)


def test_check_data_rejects_bad_input():
    X, y = blobs(10)
    with pytest.raises(LucidError, match="finite"):
        check_data(np.where(X > 0.5, np.nan, X), y, X, y)
    with pytest.raises(LucidError, match="2 classes"):
        check_data(X, np.zeros(10, dtype=np.int64), X, np.zeros(10, dtype=np.int64))
    with pytest.raises(LucidError, match="features"):
        check_data(X, y, X[:, :3], y)
    with pytest.raises(LucidError, match="class ids"):
        check_data(X, y.astype(float), X, y)
    with pytest.raises(LucidError, match="epochs"):
        TrainConfig(epochs=0)


def laplace_posterior_bruteforce(noisy: np.ndarray, num_classes: int, eps: float) -> np.ndarray:
    """P(c | y~) from the Laplace(2/eps) likelihood of the whole vector and a uniform prior."""
    scale = 2.0 / eps
    like = np.array([np.prod(np.exp(-np.abs(noisy - np.eye(num_classes)[c]) / scale) / (2 * scale), axis=1)
                     for c in range(num_classes)]).T
    return like / like.sum(axis=1, keepdims=True)


def test_alibi_soft_labels_are_the_bayesian_posterior():
    eps, c = 1.5, 4
    labels = np.random.default_rng(0).integers(0, c, 500)
    soft = noisy_soft_labels(labels, c, eps, np.random.default_rng(7))
    # Re-draw the same noise to rebuild y~ and compare with the brute-force posterior.
    noisy = np.eye(c)[labels] + np.random.default_rng(7).laplace(scale=2.0 / eps, size=(500, c))
    np.testing.assert_allclose(soft, laplace_posterior_bruteforce(noisy, c, eps), rtol=1e-5, atol=1e-6)


def test_alibi_soft_labels_are_calibrated():
    """If the noise scale and the posterior agree, E[P(true | y~)] = E[sum_c P(c | y~)^2]."""
    eps, c, n = 1.0, 3, 60000
    labels = np.random.default_rng(1).integers(0, c, n)
    soft = noisy_soft_labels(labels, c, eps, np.random.default_rng(2)).astype(np.float64)
    assert soft[np.arange(n), labels].mean() == pytest.approx((soft**2).sum(axis=1).mean(), abs=0.005)
    # and the labels carry information at this eps but none at eps = 0
    assert soft[np.arange(n), labels].mean() > 1 / c + 0.03
    np.testing.assert_allclose(noisy_soft_labels(labels[:5], c, 0.0, np.random.default_rng(0)), np.full((5, c), 1 / c), rtol=1e-6)


def test_exponential_mechanism_over_votes_is_eps_dp():
    """One training row changes one teacher's vote: every answer probability changes by <= e^eps."""
    rng = np.random.default_rng(3)
    eps = 0.7
    for _ in range(200):
        votes = rng.multinomial(16, np.ones(3) / 3)[None]
        src, dst = rng.choice(3, 2, replace=False)
        if votes[0, src] == 0:
            continue
        moved = votes.copy()
        moved[0, src] -= 1
        moved[0, dst] += 1
        p, q = answer_probabilities(votes, eps), answer_probabilities(moved, eps)
        assert np.all(p <= np.exp(eps) * q * (1 + 1e-12)) and np.all(q <= np.exp(eps) * p * (1 + 1e-12))
    np.testing.assert_allclose(answer_probabilities(np.array([[5, 1]]), 2.0)[0],
                               np.exp([5.0, 1.0]) / np.exp([5.0, 1.0]).sum())


def test_disjoint_parts_partition_the_rows():
    parts = disjoint_parts(103, 16, seed=4)
    joined = np.concatenate(parts)
    assert len(parts) == 16 and sorted(joined.tolist()) == list(range(103))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(LucidError):
        disjoint_parts(10, 11, seed=0)


def test_subsample_aggregate_accuracy():
    data = small_data()
    config = TrainConfig(arch="1x8", epochs=20, batch_size=16, lr=0.5)
    results = run_subsample_aggregate(data, config, 4, [0.0, 50.0])
    at_zero, at_large = results
    assert at_zero.accuracy == pytest.approx(0.5)  # uniform over 2 classes
    assert at_large.accuracy == pytest.approx(at_large.details["majority_accuracy"], abs=0.02)
    assert at_large.accuracy > 0.9 and at_large.train_seconds > 0
    too_many = run_subsample_aggregate(data, config, 1000, [1.0])[0]
    assert too_many.status == "unreachable" and too_many.accuracy is None


def test_plain_and_alibi_learn_separable_data():
    data = small_data()
    config = TrainConfig(arch="1x8", epochs=20, batch_size=16, lr=0.5)
    assert train_plain(data, config).accuracy > 0.95
    high = train_alibi(data, config, 8.0)
    assert high.status == "ok" and high.accuracy > 0.9 and high.train_seconds > 0


def test_dpsgd_reports_unreachable_targets_and_trains_reachable_ones():
    data = small_data(200)
    config = TrainConfig(arch="1x8", epochs=3, batch_size=50, lr=0.5)
    zero = train_dpsgd(data, config, 0.0)
    assert zero.status == "unreachable" and zero.accuracy is None
    tiny = train_dpsgd(data, config, 1e-4)
    assert tiny.status == "unreachable" and "cannot reach" in tiny.message
    ok = train_dpsgd(data, config, 8.0)
    assert ok.status == "ok" and 0 <= ok.accuracy <= 1
    assert ok.details["delta"] == pytest.approx(1 / 200)
    assert ok.details["epsilon_spent"] <= 8.0 and ok.details["noise_multiplier"] > 0
    with pytest.raises(LucidError):
        train_dpsgd(data, config, 1.0, DpSgdSettings(delta=2.0))


def test_load_run_data_reads_the_run_contract(tmp_path):  # noqa: D103
    X, y = blobs(12)
    meta = {"format": "lucid-run/1", "num_classes": 2, "input_dim": 5, "train_size": 8, "test_size": 4,
            "domain": {"lower": [0] * 5, "upper": [1] * 5}, "architecture": {"type": "mlp", "hidden": [4]},
            "training": {"epochs": 7, "lr": 0.2, "weight_decay": 0.0, "batch_size": 3, "seed": 5},
            "labels": [0, 1]}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    np.savez(tmp_path / "data.npz", X_train=X[:8], y_train=y[:8], X_test=X[8:], y_test=y[8:])
    data, config = load_run_data(tmp_path)
    assert (config.epochs, config.lr, config.batch_size, config.seed) == (7, 0.2, 3, 5)
    assert parse_architecture(config.arch) == {"type": "mlp", "hidden": [4]}
    assert data.X_train.shape == (8, 5) and data.num_classes == 2
    with pytest.raises(LucidError):
        load_run_data(tmp_path / "missing")


def _fake_run(path, n_train=40):
    X, y = blobs(n_train + 30, 3)
    meta = {"format": "lucid-run/1", "num_classes": 2, "input_dim": 5, "train_size": n_train, "test_size": 30,
            "domain": {"lower": [0] * 5, "upper": [1] * 5}, "architecture": {"type": "mlp", "hidden": [6]},
            "training": {"epochs": 4, "lr": 0.5, "weight_decay": 0.0, "batch_size": 10, "seed": 1},
            "labels": [0, 1]}
    path.mkdir()
    (path / "run.json").write_text(json.dumps(meta))
    np.savez(path / "data.npz", X_train=X[:n_train], y_train=y[:n_train], X_test=X[n_train:], y_test=y[n_train:])
    return path


def test_module_cli_runs_baselines_on_a_run(tmp_path, capsys):
    from lucid.baselines.__main__ import main

    run = _fake_run(tmp_path / "run")
    out = tmp_path / "res.json"
    main([str(run), "--epsilon", "0,1", "--methods", "dpsgd,alibi,sa", "--teachers", "4", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [(r["method"], r["epsilon"]) for r in results] == [
        ("dpsgd", 0.0), ("dpsgd", 1.0), ("alibi", 0.0), ("alibi", 1.0),
        ("subsample_aggregate[T=4]", 0.0), ("subsample_aggregate[T=4]", 1.0)]
    assert results[0]["status"] == "unreachable" and "| dpsgd | 0 |" in capsys.readouterr().out
    for args in ([str(run), "--methods", "foo"], [str(run), "--epsilon", "x"], [str(run), "--epsilon", "-1"],
                 [str(tmp_path / "nope")]):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("lucid: error:")
