"""Algorithm T, vectorised: K networks (N and/or leave-one-out networks) trained in lock-step.

Every network starts from the same initial parameters and walks the same batches; network k
only differs by the per-row sample weights w[k, b] = [row b != removed_k] / (rows kept in the
batch), which make its loss exactly the mean cross-entropy over the rows it keeps. The sum of the
K per-network losses has, for each network's parameters, exactly that network's gradient, so the
K SGD steps are independent even though they run as one batched computation.

The implementations of the step:
- `mlp`: hand-written forward/backward with batched matmuls in a [K, features, batch] layout.
  The first layer sees the same input rows for every network, so its forward and weight
  gradient are single large GEMMs over all K networks at once.
- `cnn`: the same kernels on the CNN's dense (Toeplitz) lowering, gradients folded onto the kernels.
- `autograd`: torch autograd on [K, ...] parameter tensors (MLP and CNN; a cross-check).
- `cnn2d`: 2-D CNNs (layer lists, `lucid.training.layer_spec`): autograd over one grouped conv2d
  per layer for all K networks (their channels stacked), then the batched dense layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lucid.sgd import SgdStep, TrainingInputs


def batch_orders(n: int, epochs: int, seed: int) -> torch.Tensor:
    """[epochs, n] int64: the row order of each epoch (one generator seeded once, randperm per epoch)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(epochs)])


def sample_weights(removed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[K, B] weights: 1/(kept rows) for kept rows, 0 for network k's removed row.

    A batch that consists only of the removed row gets all-zero weights: zero loss gradient
    (the SGD step then only applies weight decay).
    """
    keep = removed[:, None] != rows[None, :]
    kept = keep.sum(dim=1, keepdim=True).clamp(min=1)
    return keep.to(torch.float32) / kept.to(torch.float32)


def train_networks(
    inputs: TrainingInputs,
    sgd: SgdStep,
    removed: torch.Tensor,
    *,
    method: str = "auto",
    on_epoch: Callable[[int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Train len(removed) networks (removed[k] = row left out, -1 = none) and return their
    parameters stacked along a new leading axis, on X's device, by safetensors name.

    `sgd.trainable`: the dense layers SGD updates (MLPs; default all). The fine-tuning variant of T
    leaves the other layers at their initial values (no step, no weight decay) and back-propagates
    only down to the first trainable layer; the trained layers get exactly T's arithmetic."""
    spec, X, y = inputs.spec, inputs.X, inputs.y
    lr, weight_decay, batch_size, trainable = sgd.lr, sgd.weight_decay, sgd.batch_size, sgd.trainable
    device = X.device
    k = len(removed)
    params = {
        name: p.to(device).unsqueeze(0).repeat((k,) + (1,) * p.ndim).contiguous() for name, p in inputs.init.items()
    }
    removed = removed.to(device)
    if method == "auto" or (method == "autograd" and spec["type"] == "cnn2d"):  # cnn2d's own step is autograd
        method = {"mlp": "mlp", "cnn": "cnn", "cnn2d": "cnn2d"}[spec["type"]]
    # every step has `parameters` and `gradients`; `weights` and `biases` are the MLP step's
    step: Any = {"mlp": _MlpStep, "cnn": _CnnStep, "autograd": _AutogradStep, "cnn2d": _Cnn2dStep}[method](
        params, spec, sgd.num_classes
    )
    first = 0
    if trainable is not None:
        if method != "mlp":
            raise ValueError("training only some layers is implemented for MLPs")
        first = min(trainable)
        chosen = [j for j in range(len(step.parameters)) if j // 2 in trainable]
    n = X.shape[0]
    onehot_all = F.one_hot(y, sgd.num_classes).to(torch.float32)  # [n, C]
    orders = inputs.orders.to(device)
    for epoch in range(orders.shape[0]):
        order = orders[epoch]
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            w = sample_weights(removed, rows)
            if trainable is None:
                grads = step.gradients(X[rows], y[rows], onehot_all[rows], w)
                _sgd_update(step.parameters, grads, lr, weight_decay)
            else:
                grads = _partial_gradients(step.weights, step.biases, X[rows], onehot_all[rows], w, first)
                _sgd_update([step.parameters[j] for j in chosen], [grads[j] for j in chosen], lr, weight_decay)
        if on_epoch is not None:
            on_epoch(epoch)
    return {name: p.detach() for name, p in params.items()}


@torch.no_grad()
def _sgd_update(params: list[torch.Tensor], grads: list[torch.Tensor], lr: float, weight_decay: float) -> None:
    # Same arithmetic, in the same order, as torch.optim.SGD without momentum:
    # d = g + wd * p; p = p - lr * d.
    if weight_decay != 0:
        torch._foreach_add_(grads, params, alpha=weight_decay)
    torch._foreach_add_(params, grads, alpha=-lr)


def _partial_gradients(
    W: list[torch.Tensor], b: list[torch.Tensor], xb: torch.Tensor, onehot: torch.Tensor, w: torch.Tensor, first: int
) -> list[torch.Tensor]:
    """`dense_gradients` when the layers below `first` are frozen: they hold the same values in
    every network, so their activations are computed once (network 0's) and shared by all K,
    and the backward pass stops at layer `first` (None below it)."""
    features = xb
    for i in range(first):
        features = torch.addmm(b[i][0], features, W[i][0].t()).clamp_(min=0)
    return [None] * (2 * first) + dense_gradients(W[first:], b[first:], features, onehot, w)  # type: ignore[return-value]  # None: never read


class _MlpStep:
    """Hand-written batched forward/backward of an MLP; activations are [K, features, B]."""

    def __init__(self, params: dict[str, torch.Tensor], spec: dict, num_classes: int) -> None:
        n_layers = len(spec["hidden"]) + 1
        self.weights = [params[f"layers.{i}.weight"] for i in range(n_layers)]
        self.biases = [params[f"layers.{i}.bias"] for i in range(n_layers)]
        self.parameters = [t for pair in zip(self.weights, self.biases, strict=True) for t in pair]

    @torch.no_grad()
    def gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, onehot: torch.Tensor, w: torch.Tensor
    ) -> list[torch.Tensor]:
        return dense_gradients(self.weights, self.biases, xb, onehot, w)


class _CnnStep:
    """The 1-D CNN trained through its dense (Toeplitz) lowering, with tied gradients.

    A valid convolution is the linear map D(kernel); forward and backward run on the dense
    stack with the MLP kernels, then each conv's dense gradient is folded back onto its kernel
    (dL/dkernel[o,c,j] = sum_p dL/dD[(o,p), (c,p+j)], dL/dbias[o] = sum_p dL/dbias_D[(o,p)]),
    which is exactly the convolution's gradient. SGD updates the kernels; D is rebuilt from them.
    """

    def __init__(self, params: dict[str, torch.Tensor], spec: dict, num_classes: int) -> None:
        k = next(iter(params.values())).shape[0]
        n_conv = len(spec["conv_channels"])
        self.conv_w = [params[f"conv.{j}.weight"] for j in range(n_conv)]
        self.conv_b = [params[f"conv.{j}.bias"] for j in range(n_conv)]
        self.flat: list[torch.Tensor] = []  # built on the first step, when the input length is known
        self.dense_w: list[torch.Tensor] = []
        self.dense_b: list[torch.Tensor] = []
        n_dense = len(spec["hidden"]) + 1
        self.tail_w = [params[f"layers.{i}.weight"] for i in range(n_dense)]
        self.tail_b = [params[f"layers.{i}.bias"] for i in range(n_dense)]
        self.parameters = [t for pair in zip(self.conv_w, self.conv_b, strict=True) for t in pair]
        self.parameters += [t for pair in zip(self.tail_w, self.tail_b, strict=True) for t in pair]
        self._k = k
        self._built = False

    def _build(self, input_dim: int, device: torch.device) -> None:
        length = input_dim
        for kernel in self.conv_w:
            _, c_out, c_in, ksize = kernel.shape
            out_len = length - ksize + 1
            o, c, j, p = torch.meshgrid(
                torch.arange(c_out), torch.arange(c_in), torch.arange(ksize), torch.arange(out_len), indexing="ij"
            )
            # flat position of kernel[o, c, j] at output position p inside D [c_out*out_len, c_in*length]
            self.flat.append(((o * out_len + p) * (c_in * length) + c * length + p + j).reshape(-1).to(device))
            self.dense_w.append(torch.zeros(self._k, c_out * out_len, c_in * length, device=device))
            self.dense_b.append(torch.zeros(self._k, c_out * out_len, device=device))
            length = out_len
        self._built = True
        self._refresh()

    @torch.no_grad()
    def _refresh(self) -> None:
        for kernel, bias, flat, dw, db in zip(
            self.conv_w, self.conv_b, self.flat, self.dense_w, self.dense_b, strict=True
        ):
            out_len = dw.shape[1] // kernel.shape[1]
            dw.view(self._k, -1)[:, flat] = kernel.unsqueeze(-1).expand(*kernel.shape, out_len).reshape(self._k, -1)
            db.copy_(bias.unsqueeze(-1).expand(*bias.shape, out_len).reshape(self._k, -1))

    @torch.no_grad()
    def gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, onehot: torch.Tensor, w: torch.Tensor
    ) -> list[torch.Tensor]:
        if not self._built:
            self._build(xb.shape[1], xb.device)
        else:
            self._refresh()  # the kernels were updated since the last step
        grads = dense_gradients(self.dense_w + self.tail_w, self.dense_b + self.tail_b, xb, onehot, w)
        folded: list[torch.Tensor] = []
        for i, (kernel, flat) in enumerate(zip(self.conv_w, self.flat, strict=True)):
            g_dense, g_bias = grads[2 * i], grads[2 * i + 1]
            out_len = g_dense.shape[1] // kernel.shape[1]
            folded.append(g_dense.reshape(self._k, -1)[:, flat].view(*kernel.shape, out_len).sum(-1))
            folded.append(g_bias.view(self._k, kernel.shape[1], out_len).sum(-1))
        return folded + grads[2 * len(self.conv_w) :]


@torch.no_grad()
def dense_gradients(
    W: list[torch.Tensor], b: list[torch.Tensor], xb: torch.Tensor, onehot: torch.Tensor, w: torch.Tensor
) -> list[torch.Tensor]:
    """Per-network gradients [dW0, db0, dW1, ...] of sum_b w[k,b] * CE for a stack of dense ReLU layers."""
    k, h0, d = W[0].shape
    # Layer 0: one GEMM for all K networks, the batch is shared.
    z = torch.addmm(b[0].reshape(k * h0, 1), W[0].reshape(k * h0, d), xb.t()).view(k, h0, -1)
    acts = []  # post-ReLU activations feeding layers 1..L-1
    for i in range(1, len(W)):
        a = z.clamp_(min=0)
        acts.append(a)
        z = torch.baddbmm(b[i].unsqueeze(2), W[i], a)
    # d(sum_k sum_b w_kb * CE) / d logits = w_kb * (softmax - onehot)
    dz = torch.softmax(z, dim=1).sub_(onehot.t()).mul_(w.unsqueeze(1))
    grads: list[torch.Tensor] = [None] * (2 * len(W))  # type: ignore[list-item]
    for i in range(len(W) - 1, 0, -1):
        a = acts[i - 1]
        grads[2 * i] = torch.bmm(dz, a.transpose(1, 2))
        grads[2 * i + 1] = dz.sum(dim=2)
        # ReLU backward; aten's fused kernel is ~20x faster here than masked_fill with a bool mask.
        dz = torch.ops.aten.threshold_backward(torch.bmm(W[i].transpose(1, 2), dz), a, 0.0)
    # Computed as (x^T dz^T)^T: MKL is far slower on the tall-skinny [K*h0, B] @ [B, d] form.
    grads[0] = torch.mm(xb.t(), dz.reshape(k * h0, -1).t()).t().view(k, h0, d)
    grads[1] = dz.sum(dim=2)
    return grads


class _AutogradStep:
    """Autograd on [K, ...] parameter tensors; supports the 1-D CNN (convs as unfold + einsum)."""

    def __init__(self, params: dict[str, torch.Tensor], spec: dict, num_classes: int) -> None:
        self._bind(
            params,
            len(spec.get("conv_channels", [])) if spec["type"] == "cnn" else 0,
            len(spec["hidden"]) + 1,
            num_classes,
        )

    def _bind(self, params: dict[str, torch.Tensor], n_conv: int, n_dense: int, num_classes: int) -> None:
        """The parameters autograd differentiates: the convolutions', then the dense layers'."""
        self.n_conv, self.n_dense = n_conv, n_dense
        self.names = [f"conv.{j}.{t}" for j in range(n_conv) for t in ("weight", "bias")]
        self.names += [f"layers.{i}.{t}" for i in range(n_dense) for t in ("weight", "bias")]
        self.parameters = [params[name] for name in self.names]
        self.num_classes = num_classes

    def scores(self, xb: torch.Tensor) -> torch.Tensor:
        """[K, B, C]: every network's scores on the batch (the forward pass the gradients differentiate)."""
        p = dict(zip(self.names, self.parameters, strict=True))
        k = self.parameters[0].shape[0]
        batch = xb.shape[0]
        if self.n_conv:
            h = xb.reshape(1, batch, 1, -1).expand(k, batch, 1, xb.shape[1])  # [K, B, c, L]
            for j in range(self.n_conv):
                weight, bias = p[f"conv.{j}.weight"], p[f"conv.{j}.bias"]
                patches = h.unfold(3, weight.shape[3], 1)  # [K, B, c_in, L', ksize]
                h = torch.relu(torch.einsum("kbcpj,kocj->kbop", patches, weight) + bias[:, None, :, None])
            h = h.reshape(k, batch, -1)  # channel-major, as torch's flatten(1)
        else:
            h = xb.unsqueeze(0).expand(k, batch, xb.shape[1])
        return self._dense(h, p)

    def _dense(self, h: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        """The dense layers on per-network features h [K, B, width] -> [K, B, C]."""
        for i in range(self.n_dense):
            h = torch.baddbmm(p[f"layers.{i}.bias"].unsqueeze(1), h, p[f"layers.{i}.weight"].transpose(1, 2))
            if i < self.n_dense - 1:
                h = torch.relu(h)
        return h

    def gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, onehot: torch.Tensor, w: torch.Tensor
    ) -> list[torch.Tensor]:
        with torch.enable_grad():
            for t in self.parameters:
                t.requires_grad_(True)
            scores = self.scores(xb)
            k, batch, c = scores.shape
            ce = F.cross_entropy(scores.reshape(k * batch, c), yb.repeat(k), reduction="none").view(k, batch)
            grads = torch.autograd.grad((ce * w).sum(), self.parameters)
            for t in self.parameters:
                t.requires_grad_(False)
        return list(grads)


class _Cnn2dStep(_AutogradStep):
    """A 2-D CNN, K networks at once: each convolution is one conv2d over the networks' stacked channels.

    The first convolution reads the shared input image, so the K kernels act as one convolution
    with K * c_out output channels; every later one runs with groups=K, so network k's channels
    meet only network k's kernels. The output [B, K * c, H, W] is network k's C-H-W features at
    channels k*c..(k+1)*c, flattened as torch's `flatten(1)` of one network's [B, c, H, W]. The
    weighted loss and autograd are `_AutogradStep`'s: each network gets exactly its own gradient.
    """

    def __init__(self, params: dict[str, torch.Tensor], spec: dict, num_classes: int) -> None:
        self.convs = [dict(layer) for layer in spec["conv"]]
        self.image = tuple(int(v) for v in spec["input_shape"])
        self._bind(params, len(self.convs), len(spec["hidden"]) + 1, num_classes)

    def scores(self, xb: torch.Tensor) -> torch.Tensor:
        p = dict(zip(self.names, self.parameters, strict=True))
        k, batch = self.parameters[0].shape[0], xb.shape[0]
        h = xb.reshape(batch, *self.image)
        for j, layer in enumerate(self.convs):
            weight, bias = p[f"conv.{j}.weight"], p[f"conv.{j}.bias"]  # [K, out, in, kh, kw], [K, out]
            h = F.conv2d(
                h,
                weight.flatten(0, 1),
                bias.flatten(),
                stride=layer["stride"],
                padding=layer["pad"],
                groups=1 if j == 0 else k,
            )
            h = torch.relu(h)
        return self._dense(h.reshape(batch, k, -1).transpose(0, 1), p)
