"""`agt.safetensors`: the k-removal parameter boxes of a run, and their use as hyper-networks.

Tensors (float64): `k{k}.layers.{i}.weight.lower` / `.upper` [out, in] and
`k{k}.layers.{i}.bias.lower` / `.upper` [out], for k = 1..K. Metadata (strings): `format`
(`lucid-agt/1`), `ks` (JSON list), `algorithm` (the training algorithm bounded), `max_width`,
`rounding` (how float32/float64 rounding is covered), `update` (the update rule that bounded the
last layer: `zonotope`, `corner` or `interval`, docs/agt.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from lucid.agt.train import AgtBox
from lucid.atomic import write_atomic
from lucid.errors import LucidError
from lucid.hyper import HyperNetwork

AGT_FILE = "agt.safetensors"
AGT_FORMAT = "lucid-agt/1"
ROUNDING = (
    "float32 training modelled as per-operation widening (gamma_n with u=2^-24+2^-52), float64 bounds rounded outward"
)


def save_boxes(path: str | Path, boxes: list[AgtBox], *, algorithm: str, max_width: float) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for box in boxes:
        for name, lo in box.lower.items():
            tensors[f"k{box.k}.{name}.lower"] = lo.detach().to("cpu", torch.float64).contiguous()
            tensors[f"k{box.k}.{name}.upper"] = box.upper[name].detach().to("cpu", torch.float64).contiguous()
    meta = {
        "format": AGT_FORMAT,
        "ks": json.dumps([box.k for box in boxes]),
        "algorithm": algorithm,
        "max_width": repr(float(max_width)),
        "rounding": ROUNDING,
        "update": ",".join(sorted({box.update for box in boxes})),
    }
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def load_boxes(run_dir: str | Path) -> dict[int, AgtBox]:
    """Every box stored in RUN/agt.safetensors, by k."""
    path = Path(run_dir) / AGT_FILE
    if not path.exists():
        raise LucidError(f"{path} does not exist (train the run with `lucid train ... --agt K`)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != AGT_FORMAT:
                raise LucidError(f"{path} is not a {AGT_FORMAT} file")
            boxes = {}
            for k in json.loads(meta["ks"]):
                prefix = f"k{k}."
                lower = {
                    key[len(prefix) : -len(".lower")]: fh.get_tensor(key)
                    for key in fh.keys()  # noqa: SIM118 (a safetensors file, not a dict)
                    if key.startswith(prefix) and key.endswith(".lower")
                }
                upper = {name: fh.get_tensor(f"{prefix}{name}.upper") for name in lower}
                if not all(bool(t.isfinite().all()) for t in [*lower.values(), *upper.values()]):
                    raise LucidError(
                        f"{path}: the AGT box for k={k} has non-finite bounds (NaN or infinity): "
                        "its training diverged; train again with a smaller --lr"
                    )
                boxes[int(k)] = AgtBox(int(k), lower, upper)
    except LucidError:
        raise
    except Exception as exc:  # noqa: BLE001 (corrupt file / missing keys)
        raise LucidError(f"cannot read {path}: {exc}") from None
    return boxes


def box_hyper_network(box: AgtBox, positions: np.ndarray | list[int], input_dim: int | None = None):
    """The box as a `lucid.hyper.HyperNetwork`: what the MILP encoder consumes.

    `positions`: the stack positions of the networks the box stands for (e.g. every network of
    the run: N and each N_-i lie in every box with k >= 1). A CNN box is lowered to dense layers
    like `lucid.network` lowers the networks (lowering only places kernel entries, so lowering
    the lower and the upper kernel gives exactly the interval of every lowered entry); that
    needs `input_dim`.
    """
    from lucid.agt.cnn import lower_conv

    w_lo: list[np.ndarray] = []
    w_hi: list[np.ndarray] = []
    b_lo: list[np.ndarray] = []
    b_hi: list[np.ndarray] = []
    length, j = input_dim, 0
    while f"conv.{j}.weight" in box.lower:
        if length is None:
            raise LucidError("lowering a CNN box needs the input dimension")
        kernel = box.lower[f"conv.{j}.weight"]
        for bound, ws, bs in ((box.lower, w_lo, b_lo), (box.upper, w_hi, b_hi)):
            dense, bias = lower_conv(bound[f"conv.{j}.weight"], bound[f"conv.{j}.bias"], length)
            ws.append(dense.numpy().astype(np.float64))
            bs.append(bias.numpy().astype(np.float64))
        length = length - kernel.shape[2] + 1
        j += 1
    i = 0
    while f"layers.{i}.weight" in box.lower:
        w_lo.append(box.lower[f"layers.{i}.weight"].numpy().astype(np.float64))
        w_hi.append(box.upper[f"layers.{i}.weight"].numpy().astype(np.float64))
        b_lo.append(box.lower[f"layers.{i}.bias"].numpy().astype(np.float64))
        b_hi.append(box.upper[f"layers.{i}.bias"].numpy().astype(np.float64))
        i += 1
    return HyperNetwork(w_lo, w_hi, b_lo, b_hi, np.asarray(positions, dtype=np.int64))
