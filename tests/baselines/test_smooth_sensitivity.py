"""AGT smooth-sensitivity prediction: sound stability certificates, the mechanism's arithmetic, the baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lucid.agt import abstract_train
from lucid.agt.stability import certified_classes, stable_distances
from lucid.baselines.common import TrainConfig, check_data
from lucid.baselines.smooth_sensitivity import (
    ensemble_distance,
    noise_scale,
    probability_of_one,
    run_smooth_sensitivity,
)
from lucid.errors import LucidError
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training.architecture import initial_parameters, parse_arch
from lucid.training.vectorized import batch_orders, train_networks

torch.set_num_threads(1)


def blobs(n: int, seed: int, d: int = 4, classes: int = 2):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = np.clip(0.25 + 0.5 * y[:, None] / max(classes - 1, 1) + rng.normal(0, 0.15, (n, d)), 0, 1)
    return X.astype(np.float32), y.astype(np.int64)


def _forward(params: dict, X: np.ndarray, index: int, layers: int) -> np.ndarray:
    a = torch.from_numpy(X).double()
    for i in range(layers):
        a = a @ params[f"layers.{i}.weight"][index].double().T + params[f"layers.{i}.bias"][index].double()
        a = a.clamp(min=0) if i < layers - 1 else a
    return a.argmax(1).numpy()


def test_every_certified_prediction_holds_for_every_leave_one_out_network_and_box_point():
    X, y = blobs(40, 0)
    Xq = np.random.default_rng(3).uniform(0, 1, (300, 4)).astype(np.float32)  # many near the boundary
    spec = parse_arch("2x6")
    init = initial_parameters(spec, 4, 2, 0)
    orders = batch_orders(40, 3, 0)
    sgd = SgdStep(lr=0.5, weight_decay=1e-5, batch_size=40, num_classes=2)
    inputs = TrainingInputs(init, spec, torch.from_numpy(X), torch.from_numpy(y), orders)
    nets = train_networks(inputs, sgd, torch.arange(-1, 40))  # N and every N_-i
    boxes = {k: abstract_train(inputs, sgd, k=k) for k in (1, 2)}
    labels = _forward(nets, Xq, 0, 3)
    dist = stable_distances(boxes, Xq, labels)
    certified = dist >= 1
    assert 0 < certified.sum() < len(Xq)  # the test would prove nothing if all or none were certified
    for i in range(1, 41):
        assert (_forward(nets, Xq, i, 3)[certified] == labels[certified]).all()
    rng = np.random.default_rng(0)
    for k, box in boxes.items():
        mine = dist >= k
        for _ in range(20):  # random parameter vectors inside box k (corners included)
            t = {n: torch.from_numpy(rng.choice([0.0, 1.0, rng.uniform()], size=box.lower[n].shape)) for n in box.lower}
            point = {n: (box.lower[n] + t[n] * (box.upper[n] - box.lower[n]))[None] for n in box.lower}
            assert (_forward(point, Xq, 0, 3)[mine] == labels[mine]).all()
    # the certified class is the box's: N lies in every box
    assert ((certified_classes(boxes[1], Xq) == labels) | (certified_classes(boxes[1], Xq) == -1)).all()
    # monotone: box 2 contains box 1's networks, so what box 2 certifies box 1 certifies too
    assert (certified_classes(boxes[1], Xq)[dist >= 2] == labels[dist >= 2]).all()


def test_the_expected_accuracy_formula_matches_sampling_and_noise_shrinks_with_k():
    rng = np.random.default_rng(0)
    for label, k, eps in ((1, 0, 1.0), (0, 3, 0.5), (1, 20, 2.0)):
        z = rng.standard_cauchy(400_000) * noise_scale(eps, k)
        assert abs(float(np.mean(label + z > 0.5)) - float(probability_of_one(np.array([label]), np.array([k]), eps)[0])) < 3e-3
    scales = noise_scale(1.0, np.arange(6))
    assert (np.diff(scales) < 0).all() and scales[0] == pytest.approx(6.0)


def test_the_ensemble_distance_is_the_sum_of_the_smallest_distances_plus_n_minus_one():
    # 6 teachers, 5 vote 1: n = ceil(4 / 2) = 2; smallest distances 0 and 1: K = 0 + 1 + 2 - 1 = 2
    assert ensemble_distance(np.array([5]), np.array([[3, 0, 5, 1, 4, 2]])).tolist() == [2]
    # unanimous 4 of 4: n = 2, distances 2, 2 -> K = 5; a tie: n = 0 -> K = -1, clipped to 0
    assert ensemble_distance(np.array([4, 2]), np.array([[2, 7, 2, 9], [5, 5, 5, 5]])).tolist() == [5, 0]


def _data(classes: int = 2):
    Xa, ya = blobs(1000, 1, classes=classes)
    Xb, yb = blobs(80, 2, classes=classes)
    return check_data(Xa, ya, Xb, yb, classes)


def test_the_baseline_reports_accuracy_and_unreachable_targets():
    # full-batch, few steps: a regime where the boxes stay narrow (benchmarks/results/agt.md)
    cfg = TrainConfig(arch="1x6", epochs=3, lr=0.5, batch_size=1000, seed=0)
    res = run_smooth_sensitivity(_data(), cfg, [0, 0.2, 5.0], k_max=3)
    assert [r.status for r in res] == ["unreachable", "ok", "ok"]
    low, high = res[1], res[2]
    assert 0.4 < low.accuracy < high.accuracy <= high.details["noise_free_accuracy"]
    assert high.details["boxes"] == [1, 2, 3] and high.details["stable_share"] > 0.5
    teachers = run_smooth_sensitivity(_data(), cfg, [5.0], k_max=2, teachers=3)
    assert teachers[0].method == "agt_smooth_sensitivity[T=3]" and teachers[0].status == "ok"
    multi = run_smooth_sensitivity(_data(3), cfg, [1.0], k_max=1)
    assert multi[0].status == "unreachable" and "binary" in multi[0].message
    cnn = run_smooth_sensitivity(_data(), TrainConfig(arch="cnn", epochs=1, batch_size=1000), [1.0], k_max=1)
    assert cnn[0].status == "unreachable" and "MLP" in cnn[0].message
    with pytest.raises(LucidError, match="k_max"):
        run_smooth_sensitivity(_data(), cfg, [1.0], k_max=0)


def test_a_diverging_box_ends_the_k_grid_and_falls_back_to_smaller_k():
    cfg = TrainConfig(arch="1x6", epochs=3, lr=0.5, batch_size=1000, seed=0)
    res = run_smooth_sensitivity(_data(), cfg, [1.0], k_max=3, max_width=1e-9)
    assert res[0].status == "ok" and res[0].details["boxes"] == [] and res[0].details["diverged"]
    assert res[0].details["mean_distance"] == 0.0


def test_module_cli_runs_the_agt_baseline(tmp_path, capsys):
    from lucid.baselines.__main__ import main
    from lucid.training import train_run

    Xa, ya = blobs(60, 1)
    Xb, yb = blobs(40, 2)
    np.savez(tmp_path / "train.npz", X=Xa, y=ya)
    np.savez(tmp_path / "test.npz", X=Xb, y=yb)
    train_run(str(tmp_path / "train.npz"), tmp_path / "run", arch="2x4", epochs=2, batch_size=60,
              test_data=str(tmp_path / "test.npz"), progress=False)
    out = tmp_path / "res.json"
    main([str(tmp_path / "run"), "--epsilon", "1", "--methods", "agt-ss,agt-sa", "--teachers", "2",
          "--agt-k", "2", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [r["method"] for r in results] == ["agt_smooth_sensitivity", "agt_smooth_sensitivity[T=2]"]
    assert all(r["status"] == "ok" for r in results)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "run"), "--methods", "agt-ss", "--agt-k", "0"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
