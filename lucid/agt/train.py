"""Abstract Gradient Training of algorithm T (`lucid-loo-sgd/1`) for MLPs and the 1-D CNN.

`abstract_train` runs T in interval arithmetic: same initial parameters (a point), the same
batch order, and at every step

    [g_L, g_U]  contains the batch gradient T computes, for every theta in the current box and
                every way of removing up to k rows (`removal_mean_bounds`), and
    theta'     = theta - lr (g + wd theta) = (1 - lr wd) theta - lr g,  so
    theta'_L   = (1 - lr wd) theta_L - lr g_U,   theta'_U = (1 - lr wd) theta_U - lr g_L,

widened by the float32 rounding of T's update and moved outward (`lucid.agt.rounding`). By
induction the final box contains every parameter vector T can produce from D with any set S
of at most k rows left out, in float32 as T runs it.

Per-batch worst case: a set S of k rows is the same set in every epoch, and S meets a batch in
at most k rows. AGT allows *any* <= k rows of *each* batch independently (and a different
parameter vector per row bound), a sound over-approximation of the real set of trajectories.

When only the last layer trains, the box is also intersected with the corner bound
(`lucid.agt.last_layer`) and a zonotope (`lucid.agt.zonotope`). The zonotope uses a tighter,
per-epoch removal budget: every epoch of T is a permutation of the rows, so S meets at most k
batches of an epoch, k rows in all. `abstract_train` checks that the orders are permutations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lucid.agt.cnn import cnn_row_gradient_bounds, conv_names
from lucid.agt.gradients import DenseBox, forward_bounds, removal_mean_bounds, row_gradient_bounds
from lucid.agt.last_layer import corner_update_bounds, last_layer_step
from lucid.agt.rounding import outward, update_radius
from lucid.agt.zonotope import Zonotope, zonotope_update
from lucid.errors import LucidError
from lucid.sgd import SgdStep, TrainingInputs

DEFAULT_MAX_WIDTH = 100.0  # widest parameter interval accepted before the run is declared diverged
UPDATES = ("zonotope", "corner", "interval")  # the last-layer update rules, tightest first
ZONOTOPE_ORDER = 4  # at most 4 P generators for P last-layer parameters


class AgtDiverged(LucidError):
    """The interval bound overflowed, became NaN, or grew wider than the stated limit."""


@dataclass
class AgtBox:
    """[lower, upper] (float64, by safetensors name) containing every network T can produce
    with at most k training rows removed."""

    k: int
    lower: dict[str, torch.Tensor]
    upper: dict[str, torch.Tensor]
    history: list[dict] = field(default_factory=list)
    update: str = "interval"  # the update rule that bounded it (see `abstract_train`)

    def contains(self, params: dict[str, torch.Tensor]) -> bool:
        """True if every parameter of `params` ([..., shape] float tensors, stacked or not) is inside."""
        for name, lo in self.lower.items():
            p = params[name].to(torch.float64)
            if not bool(((p >= lo) & (p <= self.upper[name])).all()):
                return False
        return True

    def max_width(self) -> float:
        return max(float((self.upper[n] - self.lower[n]).max()) for n in self.lower)


def _names(n_layers: int) -> list[str]:
    return [f"layers.{i}.{t}" for i in range(n_layers) for t in ("weight", "bias")]


def abstract_train(
    inputs: TrainingInputs,
    sgd: SgdStep,
    *,
    k: int,
    max_width: float = DEFAULT_MAX_WIDTH,
    update: str = "zonotope",
    on_epoch: Callable[[int, AgtBox], None] | None = None,
    on_step: Callable[[int, int, AgtBox], None] | None = None,
) -> AgtBox:
    """The k-removal parameter box of T (`sgd`) run on `inputs` (initial parameters, rows, batch orders).

    `sgd.trainable`: layer indices the optimiser updates (default all; a fine-tuning variant of T
    leaves the other layers at their initial values, without weight decay).
    `update`: when only the last layer trains, how its update is bounded besides the interval
    update (the box keeps the tightest end): "zonotope" (`lucid.agt.zonotope`, also the corner
    bound), "corner" (`lucid.agt.last_layer`: per-coordinate contraction), or "interval" alone.
    Runs with one torch thread (restored afterwards): on a shared machine small float64 ops
    with several threads spend their time waiting for each other (measured: 200x slower).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _abstract_train(inputs, sgd, k, max_width, update, on_epoch, on_step)
    finally:
        torch.set_num_threads(threads)


def _abstract_train(
    inputs: TrainingInputs,
    sgd: SgdStep,
    k: int,
    max_width: float,
    update: str,
    on_epoch: Callable[[int, AgtBox], None] | None,
    on_step: Callable[[int, int, AgtBox], None] | None,
) -> AgtBox:
    init, spec, X, y, orders = inputs.init, inputs.spec, inputs.X, inputs.y, inputs.orders
    lr, weight_decay, batch_size, trainable = sgd.lr, sgd.weight_decay, sgd.batch_size, sgd.trainable
    cnn = spec.get("type", "mlp") == "cnn"
    if spec.get("type", "mlp") not in ("mlp", "cnn"):  # anything else would be bounded as an MLP: wrong
        raise LucidError(
            f"abstract gradient training bounds MLPs and the 1-D CNN only, not a {spec.get('type')!r} "
            "architecture (docs/agt.md)"
        )
    if int(k) != k or k < 0:
        raise LucidError(f"the number of removed rows k must be a non-negative integer, got {k}")
    n_layers = len(spec["hidden"]) + 1
    names = (conv_names(spec) if cnn else []) + _names(n_layers)
    if cnn and trainable is not None:
        raise LucidError("the fine-tuning variant (trainable layers) is for MLPs only")
    layers = set(range(n_layers)) if trainable is None else set(trainable)
    if not layers or not layers <= set(range(n_layers)):
        raise LucidError(f"trainable layers must be a non-empty subset of 0..{n_layers - 1}, got {sorted(layers)}")
    _check_orders(orders, X.shape[0])
    X = X.to(torch.float64)
    if bool((X < 0).any()):
        raise LucidError("abstract gradient training needs inputs in the [0, 1] domain (a feature is negative)")
    onehot_all = F.one_hot(y.to(torch.int64), sgd.num_classes).to(torch.float64)
    lower = {name: init[name].detach().to(torch.float64).clone() for name in names}
    upper = {name: t.clone() for name, t in lower.items()}
    box = AgtBox(int(k), lower, upper)
    n = X.shape[0]
    steps = (n + batch_size - 1) // batch_size
    decay = 1.0 - lr * weight_decay
    if update not in UPDATES:
        raise LucidError(f"unknown AGT update {update!r}; choose one of {', '.join(UPDATES)}")
    last_only = not cnn and layers == {n_layers - 1} and decay > 0
    zonotope = None
    if last_only and update == "zonotope":
        zonotope = Zonotope.from_box(*_augmented(lower, upper, spec))
        max_generators = ZONOTOPE_ORDER * zonotope.center.shape[0]
    box.update = update if last_only else "interval"
    for epoch in range(orders.shape[0]):
        order = orders[epoch]
        for step, start in enumerate(range(0, n, batch_size)):
            rows = order[start : start + batch_size]
            if cnn:
                rowb = cnn_row_gradient_bounds(lower, upper, spec, X[rows], onehot_all[rows])
            else:
                dense_box = DenseBox.of_layers(lower, upper, n_layers)
                forward = forward_bounds(dense_box, X[rows])
                dense = row_gradient_bounds(
                    dense_box, X[rows], onehot_all[rows], first_layer=min(layers), forward=forward
                )
                rowb = [(rb, 0) if j // 2 in layers else (None, 0) for j, rb in enumerate(dense)]
            tighter: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
            moved: Zonotope | None = None
            if last_only and update != "interval":
                # forward[0][-1]: the last layer's input, T's features within rounding
                bounded = last_layer_step(*dense_box.layer(-1), *forward[0][-1], onehot_all[rows])
                tighter = _by_name(spec, *corner_update_bounds(bounded, k=k, lr=lr, decay=decay))
                if zonotope is not None:
                    moved = zonotope_update(
                        zonotope, bounded, k=k, lr=lr, weight_decay=weight_decay, max_generators=max_generators
                    )
            for name, (rb, extra) in zip(names, rowb, strict=False):
                if rb is None:  # a frozen layer (fine-tuning variant)
                    continue
                g_lo, g_hi = removal_mean_bounds(rb, k, extra)
                p_lo, p_hi = lower[name], upper[name]
                a, b = decay * p_lo, decay * p_hi
                new_lo = torch.minimum(a, b) - lr * g_hi
                new_hi = torch.maximum(a, b) - lr * g_lo
                if name in tighter:  # both bounds hold: keep the tighter end
                    new_lo = torch.maximum(new_lo, tighter[name][0])
                    new_hi = torch.minimum(new_hi, tighter[name][1])
                pmax = torch.maximum(p_lo.abs(), p_hi.abs())
                gmax = torch.maximum(g_lo.abs(), g_hi.abs())
                newmax = torch.maximum(new_lo.abs(), new_hi.abs())
                radius = update_radius(decay, lr, weight_decay, pmax, gmax, newmax)
                lower[name], upper[name] = outward(new_lo, new_hi, radius)
            if zonotope is not None:
                zonotope = _follow(moved, lower, upper, spec, epoch, step, steps)
            if on_step is not None:
                on_step(epoch, step, box)
            _check(box, epoch, step, steps, max_width)
        if zonotope is not None:
            zonotope.end_epoch()
        box.history.append(_width_stats(box, epoch + 1))
        if on_epoch is not None:
            on_epoch(epoch, box)
    return box


def _check_orders(orders: torch.Tensor, n: int) -> None:
    """T visits every row once per epoch; the per-epoch removal budget relies on it."""
    expected = torch.arange(n, dtype=torch.int64)
    for epoch, order in enumerate(orders):
        if not torch.equal(order.to(torch.int64).sort().values, expected):
            raise LucidError(f"the batch order of epoch {epoch + 1} is not a permutation of the {n} training rows")


def _augmented(lower, upper, spec) -> tuple[torch.Tensor, torch.Tensor]:
    """The last layer's box as [W | b] ([C, J + 1])."""
    last = len(spec["hidden"])
    w, b = f"layers.{last}.weight", f"layers.{last}.bias"
    return (torch.cat([lower[w], lower[b][:, None]], dim=1), torch.cat([upper[w], upper[b][:, None]], dim=1))


def _by_name(spec, lo: torch.Tensor, hi: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """[W | b] bounds split back into the last layer's weight and bias, by safetensors name."""
    last = len(spec["hidden"])
    return {f"layers.{last}.weight": (lo[:, :-1], hi[:, :-1]), f"layers.{last}.bias": (lo[:, -1], hi[:, -1])}


def _follow(moved: Zonotope | None, lower, upper, spec, epoch: int, step: int, steps: int) -> Zonotope:
    """Intersect the last layer's box with the moved zonotope's (both hold every reachable
    network); restart the zonotope from the box where the step was not linearised."""
    lo, hi = _augmented(lower, upper, spec)
    if moved is None:
        return Zonotope.from_box(lo, hi)
    z_lo, z_hi = moved.bounds(lo.shape)
    lo, hi = torch.maximum(lo, z_lo), torch.minimum(hi, z_hi)
    if bool((lo > hi).any()):  # two sound enclosures cannot be disjoint
        raise LucidError(
            f"internal error: the AGT box and zonotope are disjoint at epoch {epoch + 1}, "
            f"step {step + 1} of {steps}; please report this"
        )
    for name, (a, b) in _by_name(spec, lo, hi).items():
        lower[name], upper[name] = a.contiguous(), b.contiguous()
    return moved


def _check(box: AgtBox, epoch: int, step: int, steps: int, max_width: float) -> None:
    where = f"epoch {epoch + 1}, step {step + 1} of {steps}"
    for name, lo in box.lower.items():
        hi = box.upper[name]
        if not (bool(torch.isfinite(lo).all()) and bool(torch.isfinite(hi).all())):
            raise AgtDiverged(
                f"AGT bound for k={box.k} diverged at {where}: {name} overflowed (inf/NaN); "
                "try a larger batch, fewer epochs or a smaller learning rate"
            )
        width = float((hi - lo).max())
        if width > max_width:
            raise AgtDiverged(
                f"AGT bound for k={box.k} diverged at {where}: {name} has an interval of width {width:.3g} "
                f"> the limit {max_width:g}; try a larger batch, fewer epochs or a smaller learning rate"
            )


def _width_stats(box: AgtBox, epoch: int) -> dict:
    stats: dict = {"epoch": epoch}
    for name, lo in box.lower.items():
        w = box.upper[name] - lo
        stats[name] = {"median_width": float(w.median()), "max_width": float(w.max())}
    return stats


def agt_boxes(
    inputs: TrainingInputs, sgd: SgdStep, *, max_k: int, max_width: float = DEFAULT_MAX_WIDTH
) -> list[AgtBox]:
    """The boxes for k = 1..max_k (each its own abstract run)."""
    return [abstract_train(inputs, sgd, k=k, max_width=max_width) for k in range(1, max_k + 1)]
