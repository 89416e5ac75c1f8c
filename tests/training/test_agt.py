"""Abstract Gradient Training (lucid/agt): the boxes contain every network T produces.

The strongest checks are containment of real float32 networks trained by `lucid.training`:
N in every box (also k = 0, where the width is float32 rounding alone), every N_-i in the
k = 1 box, and networks trained without 2-3 rows in the k = 3 box.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file

from lucid.agt import AgtDiverged, abstract_train
from lucid.agt.gradients import DenseBox, RowBounds, removal_mean_bounds, row_gradient_bounds, softmax_bounds
from lucid.agt.store import AGT_FILE, box_hyper_network, load_boxes
from lucid.cli import main
from lucid.errors import LucidError
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training.architecture import initial_parameters, parse_arch
from lucid.training.vectorized import _sgd_update, batch_orders, dense_gradients, train_networks


def tiny_data(n=26, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g)
    y = ((X[:, 0] + 0.5 * X[:, 1] + 0.1 * torch.randn(n, generator=g)) > 0.75).long()
    return X, y


CONFIGS = [  # (arch, epochs, batch, lr, weight decay): last batches of 2 and of 1 row included
    ("6", 3, 8, 0.1, 1e-3),
    ("2x5", 3, 5, 0.05, 1e-5),
    ("4,3", 2, 12, 0.2, 0.0),
]


def train_without_sets(inputs: TrainingInputs, sgd: SgdStep, sets: list[set[int]]) -> dict[str, torch.Tensor]:
    """T for networks that each leave out a *set* of rows, with the trainer's own kernels and
    its masking arithmetic (the trainer itself takes one removed row per network); every layer trains."""
    init, spec, X, y, orders = inputs.init, inputs.spec, inputs.X, inputs.y, inputs.orders
    lr, weight_decay, batch_size = sgd.lr, sgd.weight_decay, sgd.batch_size
    assert sgd.trainable is None
    k = len(sets)
    params = {name: p.unsqueeze(0).repeat((k,) + (1,) * p.ndim).contiguous() for name, p in init.items()}
    n_layers = len(spec["hidden"]) + 1
    weights = [params[f"layers.{i}.weight"] for i in range(n_layers)]
    biases = [params[f"layers.{i}.bias"] for i in range(n_layers)]
    flat = [t for pair in zip(weights, biases) for t in pair]
    onehot_all = F.one_hot(y, sgd.num_classes).to(torch.float32)
    n = X.shape[0]
    for epoch in range(orders.shape[0]):
        for start in range(0, n, batch_size):
            rows = orders[epoch][start : start + batch_size]
            keep = torch.stack([~torch.isin(rows, torch.tensor(sorted(s), dtype=torch.int64)) for s in sets])
            kept = keep.sum(dim=1, keepdim=True).clamp(min=1)
            w = keep.to(torch.float32) / kept.to(torch.float32)
            grads = dense_gradients(weights, biases, X[rows], onehot_all[rows], w)
            _sgd_update(flat, grads, lr, weight_decay)
    return params


# ------------------------------------------------------------------------- the building blocks


def test_removal_mean_bounds_cover_every_removal_by_brute_force():
    rng = np.random.default_rng(1)
    for m in (1, 2, 4, 5):
        lo = torch.from_numpy(rng.normal(size=(m, 3)))
        hi = lo + torch.from_numpy(rng.uniform(0, 1, size=(m, 3)))
        rb = RowBounds(lo, hi, torch.maximum(lo.abs(), hi.abs()))
        for k in range(0, m + 2):
            g_lo, g_hi = removal_mean_bounds(rb, k)
            best_hi, best_lo = -np.inf * np.ones(3), np.inf * np.ones(3)
            for j in range(0, min(k, m) + 1):
                for removed in itertools.combinations(range(m), j):
                    kept = [b for b in range(m) if b not in removed]
                    # every row value inside its interval: the extremes are at the interval ends
                    up = hi[kept].mean(0).numpy() if kept else np.zeros(3)
                    dn = lo[kept].mean(0).numpy() if kept else np.zeros(3)
                    best_hi, best_lo = np.maximum(best_hi, up), np.minimum(best_lo, dn)
                    assert np.all(g_hi.numpy() >= up) and np.all(g_lo.numpy() <= dn)
            # and the bound is the worst case, up to the float32 rounding allowance (~1e-6 here)
            assert np.allclose(g_hi.numpy(), best_hi, atol=1e-5) and np.allclose(g_lo.numpy(), best_lo, atol=1e-5)


def test_softmax_bounds_contain_sampled_logits():
    rng = np.random.default_rng(2)
    zl = torch.from_numpy(rng.normal(size=(20, 4)) * 3)
    zu = zl + torch.from_numpy(rng.uniform(0, 2, size=(20, 4)))
    p_lo, p_hi = softmax_bounds(zl, zu)
    t = torch.from_numpy(rng.uniform(size=(400, 20, 4)))
    t[:100] = t[:100].round()  # corners
    z = zl + (zu - zl) * t
    for dtype in (torch.float64, torch.float32):
        p = torch.softmax(z.to(dtype), dim=2).to(torch.float64)
        assert bool(((p >= p_lo) & (p <= p_hi)).all())


def test_row_gradient_bounds_contain_gradients_anywhere_in_the_box():
    X, y = tiny_data(n=7, d=4)
    spec = parse_arch("5,4")
    init = initial_parameters(spec, 4, 2, seed=3)
    names = [f"layers.{i}.{t}" for i in range(3) for t in ("weight", "bias")]
    centre = {n: init[n].double() for n in names}
    lower = {n: centre[n] - 0.05 for n in names}
    upper = {n: centre[n] + 0.05 for n in names}
    onehot = F.one_hot(y, 2).double()
    rows = row_gradient_bounds(DenseBox.of_layers(lower, upper, 3), X.double(), onehot)
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        for dtype in (torch.float64, torch.float32):
            params = []
            for n in names:
                t = torch.rand(centre[n].shape, generator=g, dtype=torch.float64)
                if trial % 3 == 0:
                    t = t.round()  # corners of the box
                params.append((lower[n] + (upper[n] - lower[n]) * t).to(dtype).requires_grad_(True))
            for b in range(len(y)):
                h = X[b : b + 1].to(dtype)
                for i in range(3):
                    h = h @ params[2 * i].T + params[2 * i + 1]
                    if i < 2:
                        h = torch.relu(h)
                loss = F.cross_entropy(h, y[b : b + 1])
                grads = torch.autograd.grad(loss, params)
                for j, gr in enumerate(grads):
                    gr = gr.double()
                    assert bool(((gr >= rows[j].lo[b]) & (gr <= rows[j].hi[b])).all()), (names[j], b)


# ------------------------------------------------------------- containment of trained networks


@pytest.mark.parametrize("arch, epochs, batch, lr, wd", CONFIGS)
def test_every_leave_one_out_network_lies_in_the_k1_box(arch, epochs, batch, lr, wd):
    X, y = tiny_data()
    n = len(y)
    spec = parse_arch(arch)
    init = initial_parameters(spec, X.shape[1], 2, seed=0)
    orders = batch_orders(n, epochs, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=lr, weight_decay=wd, batch_size=batch, num_classes=2)
    nets = train_networks(inputs, sgd, torch.arange(-1, n))  # N and every N_-i
    box = abstract_train(inputs, sgd, k=1)
    for name, lo in box.lower.items():
        p = nets[name].double()
        inside = (p >= lo) & (p <= box.upper[name])
        assert bool(inside.all()), f"{name}: networks {sorted(set(torch.nonzero(~inside)[:, 0].tolist()))} outside"
    assert 0 < box.max_width() < 10  # a real box, not a trivial one
    # k = 0: only float32 rounding separates the box from N, and N still lies inside
    point = abstract_train(inputs, sgd, k=0)
    assert point.contains({name: t[:1] for name, t in nets.items()})
    assert point.max_width() < 1e-3
    assert not point.contains({name: t[1:] for name, t in nets.items()})  # too thin to hold N_-i


def test_networks_without_two_or_three_rows_lie_in_the_k3_box():
    X, y = tiny_data()
    n = len(y)
    spec = parse_arch("2x5")
    init = initial_parameters(spec, X.shape[1], 2, seed=1)
    orders = batch_orders(n, 3, seed=1)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.05, weight_decay=1e-4, batch_size=6, num_classes=2)
    # the set trainer is the trainer: identical to it for |S| = 1
    single = train_without_sets(inputs, sgd, [{-1}, {4}, {n - 1}])
    ref = train_networks(inputs, sgd, torch.tensor([-1, 4, n - 1]))
    for name in ref:
        assert torch.allclose(single[name], ref[name], atol=1e-6, rtol=0)
    rng = np.random.default_rng(7)
    # random sets of 2 and 3 rows, and 3 rows of one batch (half of the first batch of epoch 1)
    sets = [set(rng.choice(n, size=s, replace=False).tolist()) for s in (2, 2, 3, 3, 3, 3)]
    sets.append(set(orders[0][:3].tolist()))
    nets = train_without_sets(inputs, sgd, sets)
    box3 = abstract_train(inputs, sgd, k=3)
    assert box3.contains(nets)
    box2 = abstract_train(inputs, sgd, k=2)
    assert box2.contains({name: t[:2] for name, t in nets.items()})
    assert box3.contains(ref) and box2.contains(ref)


def test_an_emptied_batch_is_covered():
    """k >= batch size: a batch can be removed entirely (zero loss gradient, weight decay only)."""
    X, _ = tiny_data(n=9)
    y = torch.ones(9, dtype=torch.int64)  # one label: every row pushes the output bias the same way,
    spec = parse_arch("4")  # so only the explicit 0 of an emptied batch covers a network that skips one
    init = initial_parameters(spec, 3, 2, seed=0)
    orders = batch_orders(9, 2, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.1, weight_decay=1e-2, batch_size=2, num_classes=2)
    sets = [set(orders[0][:2].tolist()), set(orders[1][8:].tolist()) | set(orders[0][2:3].tolist())]
    nets = train_without_sets(inputs, sgd, sets)
    assert abstract_train(inputs, sgd, k=2).contains(nets)


# -------------------------------------------------------------------------------- divergence


def test_a_diverging_bound_stops_with_the_step_and_epoch():
    X, y = tiny_data()
    spec = parse_arch("2x8")
    init = initial_parameters(spec, 3, 2, seed=0)
    orders = batch_orders(len(y), 20, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    with pytest.raises(AgtDiverged, match=r"k=1 diverged at epoch \d+, step \d+ of 6: layers\.\d\.(weight|bias)"):
        abstract_train(inputs, SgdStep(lr=2.0, weight_decay=0.0, batch_size=5, num_classes=2), k=1)
    with pytest.raises(AgtDiverged, match="width .* > the limit 0.001"):
        abstract_train(inputs, SgdStep(lr=0.1, weight_decay=0.0, batch_size=5, num_classes=2), k=1, max_width=1e-3)


def test_every_leave_one_out_cnn_lies_in_the_k1_box():
    """The 1-D CNN: bounds through its dense lowering, folded onto the kernels like the trainer."""
    X, y = tiny_data(n=14, d=7)
    spec = parse_arch("cnn")
    init = initial_parameters(spec, 7, 2, seed=0)
    orders = batch_orders(14, 2, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.2, weight_decay=1e-3, batch_size=5, num_classes=2)
    nets = train_networks(inputs, sgd, torch.arange(-1, 14))  # the CNN trainer
    box = abstract_train(inputs, sgd, k=1)
    assert sorted(box.lower) == sorted(nets.keys())
    assert box.contains(nets) and 0 < box.max_width() < 10
    point = abstract_train(inputs, sgd, k=0)
    assert point.contains({name: t[:1] for name, t in nets.items()})
    assert not point.contains({name: t[1:] for name, t in nets.items()})
    # lowered to the dense hyper-network the encoder consumes: contains every lowered network
    from lucid.network import stack_from_tensors

    hyper = box_hyper_network(box, np.arange(15), input_dim=7)
    stack = stack_from_tensors({n: t.numpy() for n, t in nets.items()} | {"removed": np.arange(-1, 14)}, spec, 7)
    for w, lo, hi in zip(stack.weights, hyper.w_lo, hyper.w_hi):
        assert np.all(w >= lo) and np.all(w <= hi)
    for b, lo, hi in zip(stack.biases, hyper.b_lo, hyper.b_hi):
        assert np.all(b >= lo) and np.all(b <= hi)


def test_negative_inputs_and_bad_options_are_refused():
    X, y = tiny_data(d=6)
    orders = batch_orders(len(y), 1, seed=0)
    sgd = SgdStep(lr=0.1, weight_decay=0.0, batch_size=5, num_classes=2)
    spec = parse_arch("cnn")
    with pytest.raises(LucidError, match="MLPs only"):
        abstract_train(TrainingInputs(initial_parameters(spec, 6, 2, seed=0), spec, X, y, orders),
                       replace(sgd, trainable={1}), k=1)
    spec = parse_arch("3")
    with pytest.raises(LucidError, match="domain"):
        abstract_train(TrainingInputs(initial_parameters(spec, 6, 2, seed=0), spec, X - 0.5, y, orders), sgd, k=1)


# ------------------------------------------------------------------------- lucid train --agt


def write_npz(path, n=30, d=3, seed=0):
    X, y = tiny_data(n=n, d=d, seed=seed)
    np.savez(path, X=X.numpy(), y=y.numpy())
    return path


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


def test_train_agt_stores_boxes_that_contain_every_network(tmp_path, capsys):
    data = write_npz(tmp_path / "d.npz")
    out = tmp_path / "run"
    code, err = run_cli(["train", str(data), "--arch", "5", "--epochs", "2", "--batch-size", "7", "--lr", "0.1",
                         "--test-fraction", "0.2", "--agt", "2", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    meta = json.loads((out / "run.json").read_text())
    assert meta["training"]["agt"] == {"max_k": 2, "max_width": 100.0}
    boxes = load_boxes(out)
    assert sorted(boxes) == [1, 2]
    nets = {k: torch.from_numpy(v) for k, v in load_file(str(out / "networks.safetensors")).items()}
    assert len(nets["removed"]) == meta["train_size"] + 1
    for k in (1, 2):
        assert boxes[k].contains(nets)
    hyper = box_hyper_network(boxes[1], np.arange(len(nets["removed"])))
    assert hyper.num_layers == 2 and not hyper.exact
    assert np.all(hyper.w_lo[0] <= nets["layers.0.weight"].double().numpy().min(0))
    # the same command again is the same run: nothing to do
    code, _ = run_cli(["train", str(data), "--arch", "5", "--epochs", "2", "--batch-size", "7", "--lr", "0.1",
                       "--test-fraction", "0.2", "--agt", "2", "--no-progress", "--out", str(out)], capsys)
    assert code == 0


def test_train_agt_no_loo_trains_n_and_the_boxes_only(tmp_path, capsys):
    data = write_npz(tmp_path / "d.npz")
    out = tmp_path / "run"
    code, err = run_cli(["train", str(data), "--arch", "2x4", "--epochs", "2", "--batch-size", "10",
                         "--agt", "1", "--no-loo", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert "1 networks" in err
    nets = {k: torch.from_numpy(v) for k, v in load_file(str(out / "networks.safetensors")).items()}
    assert nets["removed"].tolist() == [-1]
    assert load_boxes(out)[1].contains(nets)
    code, err = run_cli(["train", str(data), "--no-loo", "--no-progress", "--out", str(tmp_path / "x")], capsys)
    assert code == 0 and "1 networks" in err  # N alone: a pre-trained start for another run's --init
    code, err = run_cli(["verify", str(tmp_path / "x"), "--quiet"], capsys)
    assert code == 2 and "no leave-one-out networks" in err


def test_train_agt_divergence_exits_2_and_writes_nothing(tmp_path, capsys):
    data = write_npz(tmp_path / "d.npz")
    out = tmp_path / "run"
    code, err = run_cli(["train", str(data), "--arch", "2x8", "--epochs", "30", "--batch-size", "4", "--lr", "1.5",
                         "--agt", "1", "--no-progress", "--out", str(out)], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("lucid: error: AGT bound for k=1 diverged at epoch ")
    assert not out.exists() and not (tmp_path / "run.partial").exists()
    code, err = run_cli(["train", str(data), "--agt", "-1", "--no-progress", "--out", str(out)], capsys)
    assert code == 2 and "--agt" in err
    assert not out.exists()
    assert not (tmp_path / AGT_FILE).exists()


def test_fine_tuning_the_last_layer_is_bounded_too():
    """The fine-tuning variant (earlier layers frozen at pre-trained values): T's trainer with
    `trainable`, bounded by the abstract run with the same `trainable`."""
    X, y = tiny_data(n=20, d=4)
    spec = parse_arch("2x6")
    public = TrainingInputs(initial_parameters(spec, 4, 2, seed=2), spec, X.flip(0), y.flip(0), batch_orders(20, 2, seed=5))
    pre = train_networks(public, SgdStep(lr=0.2, weight_decay=0.0, batch_size=5, num_classes=2), torch.tensor([-1]))
    init = {name: t[0] for name, t in pre.items()}
    orders = batch_orders(20, 4, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.2, weight_decay=1e-3, batch_size=4, num_classes=2)
    full = train_networks(inputs, replace(sgd, trainable={0, 1, 2}), torch.tensor([-1, 3]))
    ref = train_networks(inputs, sgd, torch.tensor([-1, 3]))
    assert all(torch.equal(full[name], ref[name]) for name in ref)  # all layers trainable = T
    nets = train_networks(inputs, replace(sgd, trainable={2}), torch.arange(-1, 20))
    for name in ("layers.0.weight", "layers.1.bias"):  # frozen layers keep the initial values exactly
        assert torch.equal(nets[name], init[name].expand_as(nets[name]))
    assert not torch.equal(nets["layers.2.weight"][0], init["layers.2.weight"])
    box = abstract_train(inputs, replace(sgd, trainable={2}), k=1)
    assert box.contains(nets)
    assert torch.equal(box.lower["layers.0.weight"], init["layers.0.weight"].double())  # frozen: a point
    with pytest.raises(LucidError, match="trainable"):
        abstract_train(inputs, replace(sgd, trainable=set()), k=1)


def test_train_agt_resumes_after_an_interrupt(tmp_path, capsys, monkeypatch):
    from lucid.training.harness import STOP_AFTER_ENV

    data = write_npz(tmp_path / "d.npz")
    out = tmp_path / "run"
    args = ["train", str(data), "--arch", "4", "--epochs", "2", "--batch-size", "6", "--chunk-size", "5",
            "--agt", "1", "--no-progress", "--out", str(out)]
    monkeypatch.setenv(STOP_AFTER_ENV, "1")
    code, _ = run_cli(args, capsys)
    assert code == 130 and not out.exists()
    staged = (tmp_path / "run.partial" / AGT_FILE).read_bytes()
    monkeypatch.delenv(STOP_AFTER_ENV)
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert (out / AGT_FILE).read_bytes() == staged  # kept, not recomputed
    nets = {k: torch.from_numpy(v) for k, v in load_file(str(out / "networks.safetensors")).items()}
    assert load_boxes(out)[1].contains(nets)


def test_train_agt_cnn(tmp_path, capsys):
    data = write_npz(tmp_path / "d.npz", n=16, d=6)
    out = tmp_path / "run"
    code, err = run_cli(["train", str(data), "--arch", "cnn", "--epochs", "1", "--batch-size", "6", "--agt", "1",
                         "--no-loo", "--test-fraction", "0", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    box = load_boxes(out)[1]
    assert {"conv.0.weight", "conv.1.bias", "layers.1.weight"} <= set(box.lower)
    nets = {k: torch.from_numpy(v) for k, v in load_file(str(out / "networks.safetensors")).items()}
    assert box.contains(nets)


def test_a_small_real_run_breast_cancer():
    """A small real data set (80 rows of breast_cancer, 30 features scaled to [0, 1] by LUCID)."""
    from lucid.data import prepare_dataset

    ds = prepare_dataset("sklearn:breast_cancer", label=None, test_data=None, test_fraction=0.2, seed=0, domain=None)
    X, y = torch.from_numpy(ds.X_train[:80]), torch.from_numpy(ds.y_train[:80])
    spec = parse_arch("2x8")
    init = initial_parameters(spec, X.shape[1], 2, seed=0)
    orders = batch_orders(80, 2, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.05, weight_decay=1e-5, batch_size=20, num_classes=2)
    nets = train_networks(inputs, sgd, torch.arange(-1, 80))
    box1 = abstract_train(inputs, sgd, k=1)
    assert box1.contains(nets) and box1.max_width() < 1
    rng = np.random.default_rng(3)
    sets = [set(rng.choice(80, size=s, replace=False).tolist()) for s in (2, 3, 3)]
    box3 = abstract_train(inputs, sgd, k=3)
    assert box3.contains(train_without_sets(inputs, sgd, sets))


def test_last_layer_gradient_bounds_are_attained_for_a_binary_task():
    """Why the fine-tuning setting needs no linear (CROWN-style) bounds: with only the last layer
    an interval, ReLU features h >= 0 and two classes, every row's logit difference is largest at
    one corner of the box, so the per-row bounds on dW_last are all attained there together and
    the batch-mean bound is the gradient at that corner (up to the float32 rounding allowance):
    no relaxation, linear or other, can be tighter."""
    X, y = tiny_data(n=26, d=3, seed=4)
    spec = parse_arch("2x6")
    init = initial_parameters(spec, 3, 2, seed=1)
    g = torch.Generator().manual_seed(0)
    w = [init[f"layers.{i}.weight"].double() for i in range(3)]
    b = [init[f"layers.{i}.bias"].double() for i in range(3)]
    wl, wu, bl, bu = list(w), list(w), list(b), list(b)
    wl[2], wu[2] = w[2] - 0.05 * torch.rand(w[2].shape, generator=g), w[2] + 0.05 * torch.rand(w[2].shape, generator=g)
    bl[2], bu[2] = b[2] - 0.05 * torch.rand(b[2].shape, generator=g), b[2] + 0.05 * torch.rand(b[2].shape, generator=g)
    onehot = F.one_hot(y, 2).double()
    rows = row_gradient_bounds(DenseBox(wl, wu, bl, bu), X.double(), onehot, first_layer=2)
    lo, hi = removal_mean_bounds(rows[4], 0)

    def mean_gradient(w_last, b_last):
        h = torch.relu(torch.relu(X.double() @ w[0].T + b[0]) @ w[1].T + b[1])
        p = torch.softmax(h @ w_last.T + b_last, dim=1)
        return ((p - onehot)[:, :, None] * h[:, None, :]).mean(0)

    # the corner where logit 1 - logit 0 is largest for every row at once (h >= 0)
    top = mean_gradient(torch.stack([wl[2][0], wu[2][1]]), torch.stack([bl[2][0], bu[2][1]]))
    bottom = mean_gradient(torch.stack([wu[2][0], wl[2][1]]), torch.stack([bu[2][0], bl[2][1]]))
    assert float((hi - lo).max()) > 1e-3  # a box that matters
    allowance = 1e-5
    assert torch.all(hi[1] >= top[1]) and torch.all(hi[1] - top[1] <= allowance)
    assert torch.all(lo[0] <= top[0]) and torch.all(top[0] - lo[0] <= allowance)
    assert torch.all(lo[1] <= bottom[1]) and torch.all(bottom[1] - lo[1] <= allowance)
    assert torch.all(hi[0] >= bottom[0]) and torch.all(hi[0] - bottom[0] <= allowance)
