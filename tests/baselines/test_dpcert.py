"""DP-CERT baseline: the averaged-then-clipped per-row gradient, the smoothed vote, the accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lucid.baselines.common import DpSgdSettings, TrainConfig, check_data
from lucid.baselines.dpcert import DpCertSettings, averaged_clipped_gradients, smoothed_predictions, train_dpcert
from lucid.errors import LucidError

torch.set_num_threads(1)


def blobs(n: int, seed: int, d: int = 4):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = np.clip(0.3 + 0.4 * y[:, None] + rng.normal(0, 0.08, (n, d)), 0, 1).astype(np.float32)
    return X, y


def test_each_rows_copies_are_averaged_before_the_row_is_clipped():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    copies = torch.rand(5, 3, 3)  # 5 rows, 3 copies each
    y = torch.tensor([0, 1, 1, 0, 1])
    clip = 0.05  # small enough that every row is clipped
    got = averaged_clipped_gradients(model, copies, y, clip)
    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    clipped_rows = 0
    for i in range(5):  # naive loop: mean loss over the copies, one backward, clip the row
        model.zero_grad()
        F.cross_entropy(model(copies[i]), y[i].repeat(3)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        clipped_rows += int(norm > clip)
        for n in grads:
            expected[n] += grads[n] * min(1.0, clip / float(norm))
    assert clipped_rows == 5
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-5, atol=1e-7)
    # clipping each copy and then averaging is a different (and not the DP-CERT) vector
    model.zero_grad()
    per_copy = []
    for j in range(3):
        model.zero_grad()
        F.cross_entropy(model(copies[0, j:j + 1]), y[:1]).backward()
        per_copy.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    clip_then_average = sum(g * min(1.0, clip / float(g.norm())) for g in per_copy) / 3
    row0 = averaged_clipped_gradients(model, copies[:1], y[:1], clip)
    assert not torch.allclose(torch.cat([row0[n].flatten() for n, _ in model.named_parameters()]), clip_then_average)


def test_the_smoothed_prediction_is_the_majority_vote():
    model = torch.nn.Linear(1, 2)
    with torch.no_grad():  # class 1 iff x > 0.5
        model.weight.copy_(torch.tensor([[-1.0], [1.0]]))
        model.bias.copy_(torch.tensor([0.5, -0.5]))
    X = np.array([[0.0], [1.0], [0.45], [0.55]], dtype=np.float32)
    assert smoothed_predictions(model, X[:2], 0.05, 51, 2, 0).tolist() == [0, 1]  # far from the boundary
    # near it the vote follows P(x + noise > 0.5) = Phi(+-0.05 / 0.1) ~ 0.69 for the side x lies on
    votes = [smoothed_predictions(model, X[2:], 0.1, 1, 2, s) for s in range(400)]
    share = np.mean(votes, axis=0)
    assert abs(share[0] - 0.31) < 0.07 and abs(share[1] - 0.69) < 0.07


def _data():
    Xa, ya = blobs(300, 1)
    Xb, yb = blobs(100, 2)
    return check_data(Xa, ya, Xb, yb)


def test_dpcert_trains_to_its_budget_and_reports_unreachable_ones():
    cfg = TrainConfig(arch="1x8", epochs=3, lr=0.5, batch_size=60, seed=0)
    small = DpCertSettings(augmentations=2, smoothing_samples=11)
    res = [train_dpcert(_data(), cfg, e, dpcert=small) for e in (0, 0.5, 4.0)]
    assert res[0].status == "unreachable"
    mid, high = res[1], res[2]
    assert mid.status == high.status == "ok"
    assert mid.details["noise_multiplier"] > high.details["noise_multiplier"] > 0
    for r, target in ((mid, 0.5), (high, 4.0)):
        assert r.details["epsilon_spent"] <= target * 1.01
    assert high.accuracy >= 0.85  # separable blobs survive the noise at eps = 4 (chance: 0.5)
    again = train_dpcert(_data(), cfg, 4.0, dpcert=small)
    assert again.accuracy == high.accuracy and again.details == high.details  # seeded
    tiny = train_dpcert(_data(), cfg, 1e-4)
    assert tiny.status == "unreachable" and "cannot reach" in tiny.message


@pytest.mark.parametrize("kwargs, message", [
    ({"dpcert": DpCertSettings(augmentations=-1)}, "augmentations"), ({"dpcert": DpCertSettings(sigma=0.0)}, "sigma"),
    ({"dp_sgd": DpSgdSettings(delta=1.5)}, "delta"), ({"dpcert": DpCertSettings(smoothing_samples=0)}, "smoothing"),
    ({"dp_sgd": DpSgdSettings(max_grad_norm=0.0)}, "clipping"),
])
def test_bad_settings_are_one_clear_error(kwargs, message):
    cfg = TrainConfig(arch="1x8", epochs=1, lr=0.5, batch_size=60, seed=0)
    with pytest.raises(LucidError, match=message):
        train_dpcert(_data(), cfg, 1.0, **kwargs)


@pytest.mark.parametrize("arch", ["1x3", "cnn"])
def test_the_run_architectures_average_then_clip_too(arch):
    from lucid.baselines.models import build_model

    torch.manual_seed(1)
    model = build_model(arch, 6, 3)
    copies = torch.rand(4, 3, 6)
    y = torch.tensor([0, 2, 1, 2])
    clip = 0.01
    got = averaged_clipped_gradients(model, copies, y, clip)
    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(4):
        model.zero_grad()
        F.cross_entropy(model(copies[i]), y[i].repeat(3)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))
        assert norm > clip  # every row is clipped, so the order of averaging and clipping matters
        for n in grads:
            expected[n] += grads[n] * (clip / norm)
    for n in expected:
        assert float(expected[n].abs().sum()) > 0 or "bias" in n
        torch.testing.assert_close(got[n], expected[n], rtol=1e-4, atol=1e-8)
