"""The network IR every later stage uses: dense affine layers with ReLU between them.

A `NetworkStack` holds K networks of one architecture, stacked along a leading axis
(weights[i] has shape [K, out, in], biases[i] shape [K, out]); ReLU follows every layer but
the last. CNN runs are lowered to the same form (`lucid.convolution`).

Values are float64 copies of the float32 trained parameters (exact), so verification and
witness replay never lose precision relative to the trained networks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open

from lucid.convolution import lower_conv1d, lower_conv2d
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
        for w, b in zip(self.weights, self.biases, strict=True):
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

    def select(self, index: Sequence[int] | np.ndarray | slice) -> NetworkStack:
        """The sub-stack of the given network positions (not row ids: use `positions_of`)."""
        idx = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        rows: np.ndarray | slice = idx
        if idx.ndim == 1 and len(idx) > 0 and np.all(np.diff(idx) == 1):
            rows = slice(int(idx[0]), int(idx[-1]) + 1)  # one contiguous run (e.g. a BaB root): views, no copy
        return NetworkStack([w[rows] for w in self.weights], [b[rows] for b in self.biases], self.removed[rows])

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
                t = torch.as_tensor(x, dtype=dtype)
                for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                    wt, bt = _tensor(w, dtype), _tensor(b, dtype)
                    t = torch.matmul(t, wt.transpose(1, 2)) + bt[:, None, :]
                    if i < last:
                        t = torch.relu(t)
            return t.numpy().astype(np.float64, copy=False)
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = np.matmul(h, w.transpose(0, 2, 1)) + b[:, None, :]
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def forward_with_error(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """forward's float64 scores [K, B, C] (numpy path) and a rigorous bound [K, B, C] on each
        score's distance from the exact (real-number) score at x.

        Each float layer fl(W h + b) errs from the exact W h + b by at most gamma_(in+1) (|W| |h| + |b|)
        with h the float activations actually used (Higham, any summation order); an error e in h
        moves the layer by at most |W| e, and ReLU does not grow it. The bound is doubled so that its
        own float evaluation stays inside it. Replay uses it: at weights of 1e6 per layer a fixed
        relative tolerance no longer covers a float forward pass.
        """
        x = np.asarray(x, dtype=np.float64)
        last = len(self.weights) - 1
        h, err = x, np.zeros_like(x)
        with np.errstate(all="ignore"):
            for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                wt, abs_wt = w.transpose(0, 2, 1), np.abs(w).transpose(0, 2, 1)
                magnitude = np.matmul(np.abs(h), abs_wt) + np.abs(b)[:, None, :]
                err = np.matmul(err, abs_wt) + float_gamma(w.shape[2] + 1) * magnitude
                h = np.matmul(h, wt) + b[:, None, :]
                if i < last:
                    np.maximum(h, 0.0, out=h)
        return h, 2.0 * err

    def flat_parameters(self) -> np.ndarray:
        """One row per network with all its (lowered) parameters: used for k-means splitting."""
        parts = []
        for w, b in zip(self.weights, self.biases, strict=True):
            parts.append(w.reshape(len(self), -1))
            parts.append(b)
        return np.concatenate(parts, axis=1)


UNIT_ROUNDOFF = 2.0**-53


def float_gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): a float sum or dot product of n terms errs by at most
    gamma_n times the sum of the terms' magnitudes, in any summation order (BLAS blocking, FMA)."""
    return n * UNIT_ROUNDOFF / (1.0 - n * UNIT_ROUNDOFF)


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
    return (
        f"{count}{of} networks have non-finite parameters (NaN or infinity), "
        f"among them {which}: training diverged; train again with a smaller --lr"
    )


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
        weights, biases = lower_conv2d(tensors, architecture, input_dim)
    else:
        weights, biases = lower_conv1d(tensors, input_dim)
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
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types for corrupt files)
            raise LucidError(f"cannot read {self.path}: {exc}") from None
        bad = sorted(name for name, count in counts.items() if count != len(self.removed))
        if bad:
            raise LucidError(
                f"{NETWORKS_FILE} is inconsistent: {bad[0]} holds {counts[bad[0]]} networks, "
                f"'removed' {len(self.removed)}"
            )
        self._layer_sizes: list[int] | None = None

    def __len__(self) -> int:
        return len(self.removed)

    def tensors(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The raw (stored dtype) tensors of networks start..stop-1."""
        try:
            return {name: np.ascontiguousarray(self._fh.get_slice(name)[start:stop]) for name in self._names}
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types for corrupt files)
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
        if first is not None:  # set with the first non-finite network, so count > 0
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
        return stack_from_tensors(
            self.tensors(start, stop), self.meta.get("architecture", {}), int(self.meta["input_dim"])
        )

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
