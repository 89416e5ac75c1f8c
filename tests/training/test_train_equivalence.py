"""Vectorised training (algorithm T) equals a plain one-network PyTorch loop with the row masked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lucid.network import load_networks
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training import train_run
from lucid.training.architecture import parse_arch
from lucid.training.vectorized import batch_orders, train_networks
from lucid.training.architecture import initial_parameters


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def plain_network(spec: dict, d: int, c: int, seed: int) -> nn.Module:
    """Built independently of lucid's ReferenceNet: same layers, same construction order."""
    torch.manual_seed(seed)
    if spec["type"] == "cnn":
        length = d - 4
        return nn.Sequential(
            nn.Unflatten(1, (1, d)), nn.Conv1d(1, 6, 3), nn.ReLU(), nn.Conv1d(6, 6, 3), nn.ReLU(),
            nn.Flatten(), nn.Linear(6 * length, 2), nn.ReLU(), nn.Linear(2, c),
        )
    sizes = [d] + spec["hidden"] + [c]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def plain_loop(X, y, removed_row, spec, c, *, epochs, lr, wd, batch_size, seed, trainable=None) -> list[np.ndarray]:
    """The textbook loop: SGD, mean cross-entropy over the batch rows other than `removed_row`;
    with `trainable`, the optimiser gets only those Linear layers (the fine-tuning variant)."""
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    net = plain_network(spec, X.shape[1], c, seed)
    linears = [m for m in net if isinstance(m, nn.Linear)]
    chosen = net.parameters() if trainable is None else [p for i in sorted(trainable) for p in linears[i].parameters()]
    opt = torch.optim.SGD(chosen, lr=lr, weight_decay=wd)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(X), generator=g)
        for start in range(0, len(X), batch_size):
            rows = order[start : start + batch_size]
            rows = rows[rows != removed_row]
            opt.zero_grad()
            if len(rows):
                nn.functional.cross_entropy(net(X[rows]), y[rows]).backward()
            else:  # T: an emptied batch has zero loss, so the step only applies weight decay
                for p in net.parameters():
                    p.grad = torch.zeros_like(p)
            opt.step()
    return [p.detach().numpy() for p in net.parameters()]


def toy(n=21, d=5, c=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d)).astype(np.float32)
    y = (X[:, 0] * c).astype(np.int64).clip(0, c - 1)
    return X, y


@pytest.mark.parametrize("arch,method", [("2x8", "mlp"), ("2x8", "autograd"), ("3,4", "mlp"), ("cnn", "cnn"), ("cnn", "autograd")])
def test_vectorised_equals_plain_loop(arch, method):
    X, y = toy()
    spec = parse_arch(arch)
    c, seed, epochs, bs, lr, wd = 3, 7, 4, 5, 0.5, 1e-2  # 21 rows / 5: the last batch has 1 row
    removed = torch.tensor([-1, 0, 4, 13, 20], dtype=torch.int64)
    orders = batch_orders(len(X), epochs, seed)
    lone = int(orders[0, -1])  # the row alone in epoch 0's last batch: removing it empties a batch
    removed = torch.cat([removed, torch.tensor([lone])])
    inputs = TrainingInputs(initial_parameters(spec, X.shape[1], c, seed), spec, torch.from_numpy(X), torch.from_numpy(y),
                            orders)
    got = train_networks(inputs, SgdStep(lr=lr, weight_decay=wd, batch_size=bs, num_classes=c), removed, method=method)
    names = list(got)  # conv.*, then layers.*, each weight then bias: the parameter order of the plain net
    assert len(names) == len(list(plain_network(spec, 5, c, seed).parameters()))
    for k, r in enumerate(removed.tolist()):
        ref = plain_loop(X, y, r, spec, c, epochs=epochs, lr=lr, wd=wd, batch_size=bs, seed=seed)
        for name, want in zip(names, ref):
            np.testing.assert_allclose(got[name][k].numpy(), want, atol=1e-5, rtol=0, err_msg=f"{name} removed={r}")
    # the networks really differ: removing a row changes the result
    assert any(not torch.equal(t[0], t[1]) for t in got.values())


@pytest.mark.parametrize("trainable", [{2}, {1}, {0, 2}])
def test_fine_tuning_some_layers_equals_a_plain_loop_with_the_others_frozen(trainable):
    X, y = toy()
    spec = parse_arch("2x8")
    c, seed, epochs, bs, lr, wd = 3, 7, 4, 5, 0.5, 1e-2
    removed = torch.tensor([-1, 0, 13, 20], dtype=torch.int64)
    init = initial_parameters(spec, X.shape[1], c, seed)
    inputs = TrainingInputs(init, spec, torch.from_numpy(X), torch.from_numpy(y), batch_orders(len(X), epochs, seed))
    got = train_networks(inputs, SgdStep(lr=lr, weight_decay=wd, batch_size=bs, num_classes=c, trainable=trainable), removed)
    for k, r in enumerate(removed.tolist()):
        ref = plain_loop(X, y, r, spec, c, epochs=epochs, lr=lr, wd=wd, batch_size=bs, seed=seed, trainable=trainable)
        for i in range(3):
            for j, kind in enumerate(("weight", "bias")):
                name = f"layers.{i}.{kind}"
                np.testing.assert_allclose(got[name][k].numpy(), ref[2 * i + j], atol=1e-5, rtol=0, err_msg=name)
                if i not in trainable:  # frozen: the start, exactly
                    assert torch.equal(got[name][k], init[name]), name
                else:
                    assert not torch.equal(got[name][k], init[name]), name


def test_run_directory_networks_match_plain_loop(tmp_path):
    X, y = toy(n=17, d=4, c=2)
    data = tmp_path / "toy.npz"
    np.savez(data, X=X, y=y)
    out = train_run(str(data), tmp_path / "run", arch="1x6", epochs=3, lr=0.3, batch_size=4, seed=3,
                    test_fraction=0.0, chunk_size=5, progress=False)
    stack = load_networks(out)
    arrays = np.load(out / "data.npz")
    np.testing.assert_array_equal(arrays["X_train"], X)  # already in [0, 1]: kept as is
    assert stack.removed.tolist() == list(range(-1, 17))
    spec = parse_arch("1x6")
    for pos in (0, 1, 9, 17):
        ref = plain_loop(X, y, int(stack.removed[pos]), spec, 2, epochs=3, lr=0.3, wd=1e-5, batch_size=4, seed=3)
        for layer in range(2):
            np.testing.assert_allclose(stack.weights[layer][pos], ref[2 * layer], atol=1e-5, rtol=0)
            np.testing.assert_allclose(stack.biases[layer][pos], ref[2 * layer + 1], atol=1e-5, rtol=0)


def test_N_reproducible_from_seed(tmp_path):
    X, y = toy(n=15, d=3, c=2)
    data = tmp_path / "toy.npz"
    np.savez(data, X=X, y=y)
    kw = dict(arch="2x5", epochs=3, batch_size=4, test_fraction=0.0, progress=False)
    a = load_networks(train_run(str(data), tmp_path / "a", seed=5, chunk_size=4, **kw))
    b = load_networks(train_run(str(data), tmp_path / "b", seed=5, chunk_size=16, **kw))
    c = load_networks(train_run(str(data), tmp_path / "c", seed=6, chunk_size=4, **kw))
    for wa, wb, wc in zip(a.weights, b.weights, c.weights):
        np.testing.assert_allclose(wa, wb, atol=1e-6, rtol=0)  # chunking does not change T
        assert not np.allclose(wa[0], wc[0])  # the seed does

