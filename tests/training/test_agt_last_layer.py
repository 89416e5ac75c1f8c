"""AGT's last-layer updates: the corner bound (lucid/agt/last_layer.py) and the zonotope
(lucid/agt/zonotope.py).

One step: the bounds contain decay*theta - lr*g for sampled parameters and removal sets (the
corner bound also where the coordinate's map is not monotone, and it is attained at the corner
the argument names; the zonotope for points of the zonotope). Whole fine-tuning runs with 2-4
classes: every leave-one-out network (and networks without 2-3 rows) lies inside the boxes,
which are narrower than the interval update's, the zonotope's narrower still.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lucid.agt import abstract_train
from lucid.errors import LucidError
from lucid.sgd import SgdStep, TrainingInputs
from lucid.agt.last_layer import corner_update_bounds, last_layer_step
from lucid.agt.zonotope import Zonotope, zonotope_update


def corner_bounds(wl, wu, bl, bu, h, onehot, *, k, lr, decay):
    """[C, J + 1] bounds of the corner update, for features h known exactly."""
    return corner_update_bounds(last_layer_step(wl, wu, bl, bu, h, h, onehot), k=k, lr=lr, decay=decay)
from lucid.training.architecture import initial_parameters, parse_arch
from lucid.training.vectorized import batch_orders, train_networks


def random_step(seed: int, *, m=5, n_features=3, classes=3, radius=0.4):
    g = torch.Generator().manual_seed(seed)
    h = 2 * torch.rand(m, n_features, generator=g, dtype=torch.float64)
    h[0, 1] = 0.0  # a dead feature in one row
    y = torch.randint(0, classes, (m,), generator=g)
    W = torch.randn(classes, n_features, generator=g, dtype=torch.float64)
    b = torch.randn(classes, generator=g, dtype=torch.float64)
    wr = radius * torch.rand(classes, n_features, generator=g, dtype=torch.float64)
    br = radius * torch.rand(classes, generator=g, dtype=torch.float64)
    return h, F.one_hot(y, classes).double(), (W - wr, W + wr, b - br, b + br)


def update(h, onehot, W, b, keep, lr, decay):
    """decay*theta - lr*(mean gradient over the kept rows) for the augmented last layer [W | b]."""
    if not keep.any():
        return decay * torch.cat([W, b[:, None]], 1)
    p = torch.softmax(h[keep] @ W.T + b, dim=1)
    d = p - onehot[keep]
    g = torch.cat([(d[:, :, None] * h[keep][:, None, :]).mean(0), d.mean(0)[:, None]], 1)
    return decay * torch.cat([W, b[:, None]], 1) - lr * g


def removal_sets(m, k):
    return [torch.tensor([i not in s for i in range(m)]) for j in range(k + 1) for s in itertools.combinations(range(m), j)]


@pytest.mark.parametrize("seed,k,lr", [(0, 1, 0.3), (1, 2, 0.5), (2, 1, 8.0), (3, 5, 0.3)])
def test_one_step_contains_every_sampled_update(seed, k, lr):
    """lr = 8 makes the map of some coordinates non-monotone (the `rise` correction); k = 5 >= m
    may empty the batch."""
    h, onehot, (wl, wu, bl, bu) = random_step(seed)
    decay = 1 - lr * 1e-3
    lo, hi = corner_bounds(wl, wu, bl, bu, h, onehot, k=k, lr=lr, decay=decay)
    g = torch.Generator().manual_seed(100 + seed)
    sets = removal_sets(h.shape[0], min(k, h.shape[0]))
    for trial in range(3000):
        tw = torch.rand(wl.shape, generator=g, dtype=torch.float64)
        tb = torch.rand(bl.shape, generator=g, dtype=torch.float64)
        if trial % 2:  # corners
            tw, tb = (tw > 0.5).double(), (tb > 0.5).double()
        W, b = wl + tw * (wu - wl), bl + tb * (bu - bl)
        new = update(h, onehot, W, b, sets[trial % len(sets)], lr, decay)
        assert torch.all(new <= hi) and torch.all(new >= lo), (trial, float((new - hi).max()), float((lo - new).max()))


def test_one_step_is_attained_where_the_map_is_monotone():
    """At theta* (class c's row low, rivals high, coordinate (c, j) at its top) and the worst
    removal set, the update reaches the upper bound: no sound bound can be lower there."""
    h, onehot, (wl, wu, bl, bu) = random_step(4)
    lr, decay, k = 0.3, 1.0, 1
    _, hi = corner_bounds(wl, wu, bl, bu, h, onehot, k=k, lr=lr, decay=decay)
    classes, cols = hi.shape
    sets = removal_sets(h.shape[0], k)
    gap = 0.0
    for c, j in itertools.product(range(classes), range(cols)):
        W, b = wu.clone(), bu.clone()
        W[c], b[c] = wl[c], bl[c]
        if j < cols - 1:
            W[c, j] = wu[c, j]
        else:
            b[c] = bu[c]
        best = max(float(update(h, onehot, W, b, keep, lr, decay)[c, j]) for keep in sets)
        assert best <= float(hi[c, j])
        gap = max(gap, float(hi[c, j]) - best)
    assert gap < 1e-5  # float32 rounding allowances only


def test_one_step_keeps_the_contraction_the_interval_update_loses():
    h, onehot, (wl, wu, bl, bu) = random_step(5, radius=1.0)
    lr, k = 0.5, 1
    lo, hi = corner_bounds(wl, wu, bl, bu, h, onehot, k=k, lr=lr, decay=1.0)
    lw, hw = lo[:, :-1], hi[:, :-1]
    from lucid.agt.gradients import DenseBox, removal_mean_bounds, row_gradient_bounds

    rows = row_gradient_bounds(DenseBox([wl], [wu], [bl], [bu]), h, onehot)
    g_lo, g_hi = removal_mean_bounds(rows[0], k)
    interval_width = (wu - lr * g_lo) - (wl - lr * g_hi)
    assert torch.all(hw - lw <= interval_width)
    assert float((interval_width - (hw - lw)).max()) > 0.05


@pytest.mark.parametrize("seed,k,lr", [(0, 1, 0.3), (1, 2, 0.5), (2, 1, 3.0)])
def test_one_zonotope_step_holds_the_linearisation_and_every_removal(seed, k, lr):
    """From Z = c + diag(r) e: for theta anywhere in Z, decay theta - lr g(theta) lies within the new
    diagonal radius of c' + M (theta - c) (M read off the moved generators), and the effect of every
    removal set, -lr (g_R - g), lies in the new removal member."""
    h, onehot, (wl, wu, bl, bu) = random_step(seed, m=6, radius=0.3)
    decay = 1 - lr * 1e-3
    lo, hi = torch.cat([wl, bl[:, None]], 1), torch.cat([wu, bu[:, None]], 1)
    z = Zonotope.from_box(lo, hi)
    size = z.center.shape[0]
    step = last_layer_step(wl, wu, bl, bu, h, h, onehot)
    new = zonotope_update(z, step, k=k, lr=lr, weight_decay=1e-3, max_generators=4 * size)
    M = new.generators[:, :size] / z.generators.diagonal()[None, :]
    radius = new.generators[:, size:].diagonal()
    (offset, gens), = new.removals
    member_lo, member_hi = offset - gens.diagonal(), offset + gens.diagonal()
    sets = removal_sets(h.shape[0], k)
    g = torch.Generator().manual_seed(200 + seed)
    worst = 0.0
    for trial in range(2000):
        t = torch.rand(lo.shape, generator=g, dtype=torch.float64)
        if trial % 2:
            t = (t > 0.5).double()
        theta = lo + t * (hi - lo)
        W, b = theta[:, :-1], theta[:, -1]
        full = update(h, onehot, W, b, torch.ones(h.shape[0], dtype=torch.bool), lr, decay).flatten()
        linear = new.center + M @ (theta.flatten() - z.center)
        assert torch.all((full - linear).abs() <= radius)
        worst = max(worst, float(((full - linear).abs() / radius).max()))
        effect = update(h, onehot, W, b, sets[trial % len(sets)], lr, decay).flatten() - full
        assert torch.all(effect >= member_lo) and torch.all(effect <= member_hi)
    assert worst > 0.01  # the radius is not vacuous


def test_a_zonotope_centred_outside_the_box_still_bounds_the_step():
    """After intersections the zonotope's centre can leave the box; the remainder must then use
    the Jacobian on the segments from the centre, not over the box alone."""
    h, onehot, _ = random_step(6, m=6, classes=2)
    # In the box class 1 is far below class 0 (softmax saturated, Jacobian ~ 0); at the centre far
    # above (saturated again); the segments between cross p = 1/2, where the Jacobian peaks.
    wl, wu = torch.full((2, 3), -0.01, dtype=torch.float64), torch.full((2, 3), 0.01, dtype=torch.float64)
    bl, bu = torch.tensor([0.0, -10.05], dtype=torch.float64), torch.tensor([0.0, -9.95], dtype=torch.float64)
    lr, decay = 2.0, 1.0
    lo, hi = torch.cat([wl, bl[:, None]], 1), torch.cat([wu, bu[:, None]], 1)
    centre = (lo + hi) / 2
    centre[1, -1] = 10.0
    z = Zonotope(centre.flatten(), torch.diag((hi - lo + (centre - (lo + hi) / 2).abs() + 0.01).flatten()))
    size = z.center.shape[0]
    new = zonotope_update(z, last_layer_step(wl, wu, bl, bu, h, h, onehot), k=1, lr=lr, weight_decay=0.0,
                          max_generators=4 * size)
    M = new.generators[:, :size] / z.generators.diagonal()[None, :]
    radius = new.generators[:, size:].diagonal()
    g = torch.Generator().manual_seed(6)
    for trial in range(2000):
        t = torch.rand(lo.shape, generator=g, dtype=torch.float64)
        if trial % 2:
            t = (t > 0.5).double()
        theta = lo + t * (hi - lo)
        full = update(h, onehot, theta[:, :-1], theta[:, -1], torch.ones(h.shape[0], dtype=torch.bool), lr, decay)
        assert torch.all((full.flatten() - new.center - M @ (theta.flatten() - z.center)).abs() <= radius), trial


MULTI = [  # (classes, arch, epochs, batch, lr, weight decay)
    (2, "2x6", 6, 4, 0.2, 1e-3),
    (3, "2x5", 5, 6, 0.3, 1e-4),
    (4, "6", 4, 7, 0.5, 0.0),
]


def fine_tuning_setup(classes, arch, n=28, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g)
    y = torch.bucketize(X[:, 0] + 0.5 * X[:, 1] + 0.1 * torch.randn(n, generator=g),
                        torch.linspace(0.2, 1.2, classes - 1))
    spec = parse_arch(arch)
    public = TrainingInputs(initial_parameters(spec, d, classes, seed=2), spec, X.flip(0), y.flip(0),
                            batch_orders(n, 3, seed=5))
    pre = train_networks(public, SgdStep(lr=0.2, weight_decay=0.0, batch_size=5, num_classes=classes), torch.tensor([-1]))
    return X, y, spec, {name: t[0] for name, t in pre.items()}


@pytest.mark.parametrize("classes,arch,epochs,batch,lr,wd", MULTI)
def test_every_leave_one_out_network_lies_in_the_boxes_and_each_rule_tightens(classes, arch, epochs, batch, lr, wd):
    X, y, spec, init = fine_tuning_setup(classes, arch)
    last = len(spec["hidden"])
    orders = batch_orders(len(y), epochs, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=lr, weight_decay=wd, batch_size=batch, num_classes=classes, trainable={last})
    nets = train_networks(inputs, sgd, torch.arange(-1, len(y)))
    boxes = {rule: abstract_train(inputs, sgd, k=1, update=rule)
             for rule in ("interval", "corner", "zonotope")}
    w = f"layers.{last}.weight"
    widths = {}
    for rule, box in boxes.items():
        assert box.contains(nets), rule
        widths[rule] = float((box.upper[w] - box.lower[w]).median())
    for tight, loose in (("corner", "interval"), ("zonotope", "corner")):
        for name in (w, f"layers.{last}.bias"):  # each rule keeps the tighter end of the one before
            assert torch.all(boxes[tight].lower[name] >= boxes[loose].lower[name])
            assert torch.all(boxes[tight].upper[name] <= boxes[loose].upper[name])
    assert widths["corner"] < 0.9 * widths["interval"], widths
    assert widths["zonotope"] < 0.85 * widths["corner"], widths


def test_a_batch_that_can_be_emptied_restarts_the_zonotope_and_a_long_epoch_folds_early(monkeypatch):
    """29 rows in batches of 4: the last batch has one row, so k = 1 can empty it (the zonotope
    restarts from the box there); a tiny fold limit folds the removal members every step."""
    import lucid.agt.zonotope as zonotope

    X, y, spec, init = fine_tuning_setup(3, "2x5", n=29, seed=2)
    orders = batch_orders(29, 4, seed=3)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.3, weight_decay=1e-4, batch_size=4, num_classes=3, trainable={2})
    nets = train_networks(inputs, sgd, torch.arange(-1, 29))
    restarts = []
    original = zonotope.Zonotope.from_box
    monkeypatch.setattr(zonotope.Zonotope, "from_box", classmethod(lambda cls, lo, hi: restarts.append(1) or original(lo, hi)))
    assert abstract_train(inputs, sgd, k=1).contains(nets)
    assert len(restarts) == 1 + 4  # the start, then once per epoch at the one-row batch
    monkeypatch.setattr(zonotope, "FOLD_ELEMENTS", 1)
    assert abstract_train(inputs, sgd, k=1).contains(nets)


def test_orders_that_are_not_permutations_are_refused():
    X, y, spec, init = fine_tuning_setup(2, "2x5", n=12)
    orders = batch_orders(12, 2, seed=0)
    orders[1, 4] = orders[1, 0]  # a row visited twice in epoch 2, another never
    inputs = TrainingInputs(init, spec, X, y, orders)
    with pytest.raises(LucidError, match="epoch 2 is not a permutation"):
        abstract_train(inputs, SgdStep(lr=0.1, weight_decay=0.0, batch_size=4, num_classes=2, trainable={2}), k=1)


@pytest.mark.parametrize("rule", ["corner", "zonotope"])
def test_networks_without_two_or_three_rows_lie_in_the_k3_box(rule):
    X, y, spec, init = fine_tuning_setup(3, "2x5", seed=1)
    orders = batch_orders(len(y), 4, seed=1)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.3, weight_decay=1e-4, batch_size=6, num_classes=3, trainable={2})
    box = abstract_train(inputs, sgd, k=3, update=rule)
    first_batch = orders[0][:6].tolist()
    sets = [{0, 1}, {3, 17, 25}, set(first_batch[:3]), {5, 6}]
    nets = train_without_sets_frozen(inputs, sgd, sets)
    assert box.contains(nets)
    # the stand-in trainer is T's: for one removed row it gives the trainer's network exactly
    one = train_without_sets_frozen(inputs, sgd, [{4}])
    ref = train_networks(inputs, sgd, torch.tensor([4]))
    assert all(torch.equal(one[name], ref[name]) for name in ref)


def test_every_set_of_up_to_two_rows_lies_in_the_k2_zonotope_box():
    """All 78 removal sets of at most two of 12 rows (two rows in one batch, or in two batches of
    the same epoch: the per-epoch hull's convex combinations), 3 batches an epoch, 6 epochs."""
    X, y, spec, init = fine_tuning_setup(3, "2x5", n=12, seed=4)
    orders = batch_orders(12, 6, seed=2)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=0.5, weight_decay=1e-4, batch_size=4, num_classes=3, trainable={2})
    sets = [{i} for i in range(12)] + [set(pair) for pair in itertools.combinations(range(12), 2)]
    nets = train_without_sets_frozen(inputs, sgd, sets)
    box = abstract_train(inputs, sgd, k=2)
    assert box.contains(nets)
    loose = abstract_train(inputs, sgd, k=2, update="corner")
    w = "layers.2.weight"
    assert float((box.upper[w] - box.lower[w]).median()) < float((loose.upper[w] - loose.lower[w]).median())


def train_without_sets_frozen(inputs: TrainingInputs, sgd: SgdStep, sets: list[set[int]]) -> dict[str, torch.Tensor]:
    """`train_without_sets` with only the last layer trained: the frozen layers' features are the
    trainer's (`_partial_gradients` computes them with network 0's parameters, the same in all)."""
    from test_agt import train_without_sets  # tests/training/test_agt.py (this folder is on sys.path)

    init, spec = inputs.init, inputs.spec
    last = len(spec["hidden"])
    assert sgd.trainable == {last}
    features = inputs.X
    for i in range(last):
        features = torch.addmm(init[f"layers.{i}.bias"], features, init[f"layers.{i}.weight"].t()).clamp_(min=0)
    head = {"layers.0.weight": init[f"layers.{last}.weight"], "layers.0.bias": init[f"layers.{last}.bias"]}
    head_inputs = TrainingInputs(head, {"type": "mlp", "hidden": []}, features, inputs.y, inputs.orders)
    nets = train_without_sets(head_inputs, replace(sgd, trainable=None), sets)
    out = {f"layers.{i}.{t}": init[f"layers.{i}.{t}"].expand(len(sets), *init[f"layers.{i}.{t}"].shape)
           for i in range(last) for t in ("weight", "bias")}
    out[f"layers.{last}.weight"], out[f"layers.{last}.bias"] = nets["layers.0.weight"], nets["layers.0.bias"]
    return out


@pytest.mark.parametrize("rule", ["corner", "zonotope"])
@pytest.mark.parametrize("classes,arch,epochs,batch,lr,wd", MULTI)
def test_the_k0_box_holds_the_float32_network_by_its_rounding_allowances(classes, arch, epochs, batch, lr, wd, rule):
    """k = 0: the box is T's float32 rounding alone, so only the allowances (T's logit error eps,
    the softmax margin, the product and mean rounding) can hold the trained N."""
    X, y, spec, init = fine_tuning_setup(classes, arch)
    last = len(spec["hidden"])
    orders = batch_orders(len(y), epochs, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=lr, weight_decay=wd, batch_size=batch, num_classes=classes, trainable={last})
    n = train_networks(inputs, sgd, torch.tensor([-1, 3]))
    box = abstract_train(inputs, sgd, k=0, update=rule)
    assert box.contains({name: t[:1] for name, t in n.items()})
    assert not box.contains({name: t[1:] for name, t in n.items()})  # too thin for N_-3
    assert box.max_width() < 1e-3
