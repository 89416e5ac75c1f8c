"""The network IR every later stage uses: dense affine layers with ReLU between them.

A `NetworkStack` holds K networks of one architecture, stacked along a leading axis
(weights[i] has shape [K, out, in], biases[i] shape [K, out]); ReLU follows every layer but
the last. CNN runs are lowered here to the same form: a valid 1-D convolution is a linear map,
so it becomes a dense (Toeplitz) matrix acting on the channel-major flattened signal, exactly
as torch's `flatten(1)` of a [batch, channels, length] tensor orders it. A 2-D convolution with
stride and zero padding is lowered the same way, on the C-H-W flattened image (`flatten(1)` of
[batch, channels, height, width]); the zero padding only drops the kernel entries that would
meet it.

Values are float64 copies of the float32 trained parameters (exact), so verification and
witness replay never lose precision relative to the trained networks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors import safe_open

from lucid.errors import LucidError

NETWORKS_FILE = "networks.safetensors"
TORCH_THRESHOLD = 200_000  # networks x inputs from which torch's speed pays for its import


@dataclass
class NetworkStack:
    weights: list[np.ndarray]  # each [K, out, in]
    biases: list[np.ndarray]  # each [K, out]
    removed: np.ndarray  # [K] int64; -1 is N (trained on all rows), else the left-out row

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.biases) or not self.weights:
            raise ValueError("a network needs at least one affine layer, with one bias per weight")
        k = len(self.removed)
        for w, b in zip(self.weights, self.biases):
            if w.ndim != 3 or b.ndim != 2 or w.shape[0] != k or b.shape[0] != k or w.shape[1] != b.shape[1]:
                raise ValueError(f"inconsistent layer shapes {w.shape} / {b.shape} for {k} networks")

    def __len__(self) -> int:
        return len(self.removed)

    @property
    def input_dim(self) -> int:
        return self.weights[0].shape[2]

    @property
    def num_classes(self) -> int:
        return self.weights[-1].shape[1]

    @property
    def layer_sizes(self) -> list[int]:
        """[input, hidden..., output] widths."""
        return [self.input_dim] + [w.shape[1] for w in self.weights]

    def select(self, index: Sequence[int] | np.ndarray | slice) -> "NetworkStack":
        """The sub-stack of the given network positions (not row ids: use `positions_of`)."""
        idx = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        if idx.ndim == 1 and len(idx) > 0 and np.all(np.diff(idx) == 1):
            idx = slice(int(idx[0]), int(idx[-1]) + 1)  # one contiguous run (e.g. a BaB root): views, no copy
        return NetworkStack(
            [w[idx] for w in self.weights], [b[idx] for b in self.biases], self.removed[idx]
        )

    def positions_of(self, removed_rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions in this stack of the networks trained without the given rows (-1 = N)."""
        lookup = {int(r): p for p, r in enumerate(self.removed)}
        try:
            return np.array([lookup[int(r)] for r in removed_rows], dtype=np.int64)
        except KeyError as exc:
            raise LucidError(f"no network trained without row {exc.args[0]} in this run") from None

    def forward(self, x: np.ndarray, *, float32: bool = False, use_torch: bool | None = None) -> np.ndarray:
        """Scores of every network on every input: x [B, d] -> [K, B, C] (float64 array).

        The one stacked forward pass (verification, witness replay, evaluation). Float64 by default:
        replay and claimed bounds depend on it. `float32=True` only ranks candidate points (torch,
        about 20x faster than numpy's stacked matmul); nothing claimed may rest on it. Large float64
        workloads also run in torch, with the same float64 arithmetic (`use_torch` forces a path).
        """
        x = np.asarray(x, dtype=np.float64)
        last = len(self.weights) - 1
        if use_torch is None:
            use_torch = float32 or len(self) * len(x) >= TORCH_THRESHOLD
        if use_torch:
            import torch

            dtype = torch.float32 if float32 else torch.float64
            with torch.no_grad():
                h = torch.as_tensor(x, dtype=dtype)
                for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                    wt, bt = _tensor(w, dtype), _tensor(b, dtype)
                    h = torch.matmul(h, wt.transpose(1, 2)) + bt[:, None, :]
                    if i < last:
                        h = torch.relu(h)
            return h.numpy().astype(np.float64, copy=False)
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = np.matmul(h, w.transpose(0, 2, 1)) + b[:, None, :]
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def flat_parameters(self) -> np.ndarray:
        """One row per network with all its (lowered) parameters: used for k-means splitting."""
        parts = []
        for w, b in zip(self.weights, self.biases):
            parts.append(w.reshape(len(self), -1))
            parts.append(b)
        return np.concatenate(parts, axis=1)


def _tensor(a: np.ndarray, dtype):
    """torch shares a numpy array's memory, which it may not do with a read-only map: copy those."""
    import torch

    return torch.as_tensor(a if a.flags.writeable else np.array(a), dtype=dtype)


def confidence(scores: np.ndarray, cls: int | np.ndarray | None = None) -> np.ndarray:
    """score_c - max_{c' != c} score_c' along the last axis; c = argmax when not given."""
    scores = np.asarray(scores, dtype=np.float64)
    if cls is None:
        cls = scores.argmax(axis=-1)
    cls = np.broadcast_to(np.asarray(cls), scores.shape[:-1])
    own = np.take_along_axis(scores, cls[..., None], axis=-1)[..., 0]
    others = scores.copy()
    np.put_along_axis(others, cls[..., None], -np.inf, axis=-1)
    return own - others.max(axis=-1)


def conv1d_to_dense(weight: np.ndarray, bias: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower a valid, stride-1 1-D convolution to a dense layer.

    weight [K, c_out, c_in, k], bias [K, c_out]; the input is channel-major flattened
    [c_in * length]; the output is channel-major flattened [c_out * (length - k + 1)].
    """
    n_k, c_out, c_in, ksize = weight.shape
    out_len = length - ksize + 1
    if out_len < 1:
        raise LucidError(f"convolution with kernel {ksize} needs inputs of length >= {ksize}, got {length}")
    dense = np.zeros((n_k, c_out, out_len, c_in, length), dtype=np.float64)
    for p in range(out_len):
        dense[:, :, p, :, p : p + ksize] = weight
    dense_bias = np.repeat(bias.astype(np.float64)[:, :, None], out_len, axis=2)
    return dense.reshape(n_k, c_out * out_len, c_in * length), dense_bias.reshape(n_k, c_out * out_len)


def conv2d_output_hw(height: int, width: int, kernel: tuple[int, int], stride: int, pad: int) -> tuple[int, int]:
    """(height, width) of a 2-D convolution's output, as torch's conv2d computes it (floor division)."""
    kh, kw = kernel
    if height + 2 * pad < kh or width + 2 * pad < kw:
        raise LucidError(f"a {kh}x{kw} kernel is larger than the padded {height + 2 * pad}x{width + 2 * pad} input")
    return (height + 2 * pad - kh) // stride + 1, (width + 2 * pad - kw) // stride + 1


def conv2d_to_dense(weight: np.ndarray, bias: np.ndarray, input_shape: Sequence[int], stride: int = 1,
                    pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lower a 2-D convolution with stride and zero padding to a dense layer, exactly.

    weight [K, c_out, c_in, kh, kw], bias [K, c_out]; the input is the C-H-W flattened
    [c_in * h * w] image of `input_shape` (c_in, h, w); the output is the C-H-W flattened
    [c_out * oh * ow]. Every entry of the result is a kernel entry (converted to float64, which
    is exact for float32 weights) or an exact zero: no arithmetic on the weights, so the lowered
    network computes what the convolution computes, up to the summation order.
    """
    n_k, c_out, c_in, kh, kw = weight.shape
    channels, height, width = (int(v) for v in input_shape)
    if c_in != channels:
        raise LucidError(f"a convolution over {c_in} channels cannot read a {channels}-channel input")
    if stride < 1 or pad < 0:
        raise LucidError(f"a convolution needs stride >= 1 and pad >= 0, got stride {stride}, pad {pad}")
    oh, ow = conv2d_output_hw(height, width, (kh, kw), stride, pad)
    kernel = np.asarray(weight, dtype=np.float64)
    dense = np.zeros((n_k, c_out, oh, ow, c_in, height, width), dtype=np.float64)
    for p in range(oh):
        top = p * stride - pad  # input row under kernel row 0; rows outside the image are padding
        r0, r1 = max(top, 0), min(top + kh, height)
        for q in range(ow):
            left = q * stride - pad
            s0, s1 = max(left, 0), min(left + kw, width)
            if r1 > r0 and s1 > s0:  # a window wholly in the padding reads only zeros
                dense[:, :, p, q, :, r0:r1, s0:s1] = kernel[:, :, :, r0 - top : r1 - top, s0 - left : s1 - left]
    dense_bias = np.repeat(np.asarray(bias, dtype=np.float64)[:, :, None], oh * ow, axis=2)
    return dense.reshape(n_k, c_out * oh * ow, c_in * height * width), dense_bias.reshape(n_k, c_out * oh * ow)


def non_finite(tensors: dict[str, np.ndarray]) -> np.ndarray:
    """[K] bool: which networks of a `networks.safetensors` slice hold a NaN or infinite parameter."""
    k = len(tensors["removed"])
    bad = np.zeros(k, dtype=bool)
    for name, t in tensors.items():
        if name != "removed" and t.dtype.kind == "f":
            bad |= ~np.isfinite(t.reshape(k, -1)).all(axis=1)
    return bad


def diverged_message(count: int, total: int | None, first_removed: int) -> str:
    """The one line for networks with non-finite parameters (a diverged training run)."""
    which = "N (trained on every row)" if first_removed == -1 else f"the network without row {first_removed}"
    of = f" of {total}" if total is not None else ""
    return (f"{count}{of} networks have non-finite parameters (NaN or infinity), "
            f"among them {which}: training diverged; train again with a smaller --lr")


def stack_from_tensors(tensors: dict[str, np.ndarray], architecture: dict, input_dim: int) -> NetworkStack:
    """Build the dense IR from the tensors of `networks.safetensors` (docs/formats.md).

    CNN runs store `conv.{j}.weight` [K, c_out, c_in, kernel] and `conv.{j}.bias` [K, c_out]
    for the convolutions (input = 1 channel of length d), followed by the usual `layers.{i}.*`
    dense layers acting on the channel-major flattened output of the last convolution. 2-D CNN
    runs (`"type": "cnn2d"`) store `conv.{j}.weight` [K, c_out, c_in, kh, kw]; their input shape,
    strides and paddings come from the architecture.
    """
    if "removed" not in tensors:
        raise LucidError(f"{NETWORKS_FILE} has no 'removed' tensor")
    bad = non_finite(tensors)
    if bad.any():  # a NaN reads as "cannot leak" in a comparison: refuse before any bound sees it
        raise LucidError(diverged_message(int(bad.sum()), None, int(tensors["removed"][bad.argmax()])))
    kind = architecture.get("type", "mlp")
    if kind == "cnn2d":
        weights, biases = _lower_conv2d(tensors, architecture, input_dim)
    else:
        weights, biases = _lower_conv1d(tensors, input_dim)
    j = len(weights)
    i = 0
    while f"layers.{i}.weight" in tensors:
        weights.append(tensors[f"layers.{i}.weight"].astype(np.float64))
        biases.append(tensors[f"layers.{i}.bias"].astype(np.float64))
        i += 1
    if i == 0:
        raise LucidError(f"{NETWORKS_FILE} has no 'layers.0.weight' tensor")
    if kind == "cnn" and j == 0:
        raise LucidError("run.json says the architecture is a CNN but the networks have no conv tensors")
    try:
        return NetworkStack(weights, biases, tensors["removed"].astype(np.int64))
    except ValueError as exc:
        raise LucidError(f"{NETWORKS_FILE} is inconsistent: {exc}") from None


def _lower_conv1d(tensors: dict[str, np.ndarray], input_dim: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The dense layers of the 1-D CNN's convolutions (none for an MLP)."""
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    length, channels = input_dim, 1
    j = 0
    while f"conv.{j}.weight" in tensors:
        w = tensors[f"conv.{j}.weight"]
        if w.ndim != 4 or w.shape[2] != channels:
            raise LucidError(f"conv.{j}.weight has shape {tuple(w.shape)}, expected [K, out, {channels}, kernel]")
        dw, db = conv1d_to_dense(w, tensors[f"conv.{j}.bias"], length)
        weights.append(dw)
        biases.append(db)
        channels, length = w.shape[1], length - w.shape[3] + 1
        j += 1
    return weights, biases


def conv2d_layers(architecture: dict) -> tuple[tuple[int, int, int], list[dict]]:
    """(input shape, conv layers) of a `cnn2d` architecture, checked to be well-formed."""
    try:
        shape = tuple(int(v) for v in architecture["input_shape"])
        layers = [{key: int(layer[key]) for key in ("channels", "kernel", "stride", "pad")}
                  for layer in architecture["conv"]]
    except (KeyError, TypeError, ValueError):
        raise LucidError("run.json: a cnn2d architecture needs 'input_shape' [C, H, W] and 'conv' layers with "
                         "channels, kernel, stride and pad") from None
    if len(shape) != 3 or min(shape) < 1:
        raise LucidError(f"run.json: the cnn2d input_shape must be three positive sizes [C, H, W], got {list(shape)}")
    return shape, layers  # type: ignore[return-value]


def _lower_conv2d(tensors: dict[str, np.ndarray], architecture: dict,
                  input_dim: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The dense layers of a 2-D CNN's convolutions, on the C-H-W flattened image."""
    shape, layers = conv2d_layers(architecture)
    if int(np.prod(shape)) != input_dim:
        raise LucidError(f"run.json: the cnn2d input_shape {list(shape)} does not have input_dim = {input_dim} values")
    if f"conv.{len(layers)}.weight" in tensors:
        raise LucidError(f"{NETWORKS_FILE} has more conv tensors than run.json's {len(layers)} conv layers")
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    for j, layer in enumerate(layers):
        if f"conv.{j}.weight" not in tensors:
            raise LucidError(f"{NETWORKS_FILE} has no 'conv.{j}.weight' tensor "
                             f"(run.json has {len(layers)} conv layers)")
        w = tensors[f"conv.{j}.weight"]
        expected = (layer["channels"], shape[0], layer["kernel"], layer["kernel"])
        if w.ndim != 5 or tuple(w.shape[1:]) != expected:
            raise LucidError(f"conv.{j}.weight has shape {tuple(w.shape)}, "
                             f"expected [K, {', '.join(map(str, expected))}]")
        dw, db = conv2d_to_dense(w, tensors[f"conv.{j}.bias"], shape, layer["stride"], layer["pad"])
        weights.append(dw)
        biases.append(db)
        oh, ow = conv2d_output_hw(shape[1], shape[2], (layer["kernel"], layer["kernel"]), layer["stride"], layer["pad"])
        shape = (layer["channels"], oh, ow)
    return weights, biases


def _read_meta(run_dir: Path, meta: dict | None) -> dict:
    if meta is not None:
        return meta
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise LucidError(f"cannot read {run_dir / 'run.json'}: {exc}") from None


class NetworkFile:
    """A run's `networks.safetensors`, read a contiguous range of networks at a time.

    safetensors memory-maps the file, so a slice costs only its own bytes: the access layer and the
    evaluation stream 36 000 networks in chunks instead of holding them all in float64 (8 bytes x
    parameters x networks: 3.6 GB for 36 000 networks of 2x100 on Adult). Every slice goes through
    `stack_from_tensors`, so a streamed network is the same float64 network `load_networks` gives.
    """

    def __init__(self, run_dir: str | Path, meta: dict | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.meta = _read_meta(self.run_dir, meta)
        self.path = self.run_dir / NETWORKS_FILE
        try:
            self._fh = safe_open(str(self.path), framework="numpy")
            self._names = sorted(self._fh.keys())
            if "removed" not in self._names:
                raise LucidError(f"{NETWORKS_FILE} has no 'removed' tensor")
            self.removed = self._fh.get_tensor("removed").astype(np.int64)
            counts = {name: self._fh.get_slice(name).get_shape()[0] for name in self._names}
        except FileNotFoundError:
            raise LucidError(f"{self.path} does not exist (is {self.run_dir} a LUCID run directory?)") from None
        except LucidError:
            raise
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise LucidError(f"cannot read {self.path}: {exc}") from None
        bad = sorted(name for name, count in counts.items() if count != len(self.removed))
        if bad:
            raise LucidError(f"{NETWORKS_FILE} is inconsistent: {bad[0]} holds {counts[bad[0]]} networks, "
                             f"'removed' {len(self.removed)}")
        self._layer_sizes: list[int] | None = None

    def __len__(self) -> int:
        return len(self.removed)

    def tensors(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The raw (stored dtype) tensors of networks start..stop-1."""
        try:
            return {name: np.ascontiguousarray(self._fh.get_slice(name)[start:stop]) for name in self._names}
        except Exception as exc:
            raise LucidError(f"cannot read {self.path}: {exc}") from None

    def check_finite(self, chunk_bytes: int = 64 << 20) -> None:
        """Raise the one-line error if any network has a NaN or infinite parameter (streamed)."""
        if len(self) == 0:
            return
        per_network = sum(int(np.prod(self._fh.get_slice(n).get_shape()[1:], dtype=np.int64)) * 8 for n in self._names)
        step = max(1, chunk_bytes // max(per_network, 1))
        count, first = 0, None
        for start in range(0, len(self), step):
            bad = non_finite(self.tensors(start, min(len(self), start + step)))
            if bad.any() and first is None:
                first = int(self.removed[start + int(bad.argmax())])
            count += int(bad.sum())
        if count:
            raise LucidError(diverged_message(count, len(self), first))

    def n_tensors(self) -> dict[str, np.ndarray]:
        """N's raw tensors (position 0, leading axis kept), checked to be N."""
        if len(self) == 0 or int(self.removed[0]) != -1:
            raise LucidError(f"{self.path}: position 0 is not N (removed[0] must be -1)")
        return self.tensors(0, 1)

    def select(self, index: slice) -> NetworkStack:
        """Networks at the positions of a contiguous slice, as a float64 `NetworkStack`."""
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("NetworkFile reads contiguous ranges only")
        return stack_from_tensors(self.tensors(start, stop), self.meta.get("architecture", {}),
                                  int(self.meta["input_dim"]))

    @property
    def layer_sizes(self) -> list[int]:
        if self._layer_sizes is None:
            self._layer_sizes = self.select(slice(0, 1)).layer_sizes
        return self._layer_sizes


def load_networks(run_dir: str | Path, meta: dict | None = None, index: slice | None = None) -> NetworkStack:
    """Load (and for a CNN, lower) the networks of a run directory, all of them or a contiguous
    slice of positions (read without touching the rest of the file). Never executes code."""
    source = NetworkFile(run_dir, meta)
    return source.select(slice(None) if index is None else index)
