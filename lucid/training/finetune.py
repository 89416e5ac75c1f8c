"""The fine-tuning variant of T: start from a pre-trained network, train only some layers.

`lucid train PRIVATE --init PUBLIC_RUN --train-layers last` starts N and every N_-i from the
network N of another run (typically trained on public data, e.g. `lucid train PUBLIC --no-loo`)
and lets SGD update only the chosen dense layers; the others keep the pre-trained values. The
leave-one-out guarantee is about the private rows only, so the pre-trained start is a constant
of T, recorded in run.json (its digest and the source run's fingerprint) and in the run's
fingerprint. With few trained parameters the AGT boxes stay narrow where full training
diverges (benchmarks/results/agt.md), and the leave-one-out networks differ only in the trained
layers.

The source run must be one this run's N can start from: the same architecture, input width,
labels and feature scaling (a pre-trained weight means something only on features scaled the
same way; give both runs the same `--domain FILE` when the data sets' ranges differ).
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch

from lucid.data import Dataset
from lucid.errors import LucidError
from lucid.network import NetworkFile
from lucid.rundir import open_run
from lucid.training.architecture import initial_parameters


def parse_train_layers(text: str, spec: dict) -> set[int] | None:
    """`all` -> None (every layer), `last` -> {L-1}, `0,2` -> {0, 2} (dense layer indices)."""
    n_layers = len(spec["hidden"]) + 1
    value = str(text).strip().lower()
    if value == "all":
        return None
    if spec["type"] != "mlp":
        raise LucidError("--train-layers other than 'all' is implemented for MLPs only")
    if value == "last":
        return {n_layers - 1}
    try:
        chosen = {int(part) for part in value.split(",")}
    except ValueError:
        raise LucidError(f"--train-layers must be all, last or layer indices like 0,2; got '{text}'") from None
    if not chosen or not chosen <= set(range(n_layers)):
        raise LucidError(
            f"--train-layers: layer indices must lie in 0..{n_layers - 1} for this architecture, got '{text}'"
        )
    return None if chosen == set(range(n_layers)) else chosen


def pretrained_init(source: str, spec: dict, ds: Dataset) -> tuple[dict[str, torch.Tensor], dict]:
    """N of the run at `source` as float32 initial parameters, and the record run.json keeps of it."""
    try:
        run = open_run(source)
        raw = NetworkFile(run.path, run.meta).n_tensors()
    except LucidError as exc:
        raise LucidError(f"--init {source}: {exc}") from None
    meta = run.meta
    checks = [
        ("architecture", meta.get("architecture"), spec),
        ("input width", meta.get("input_dim"), ds.input_dim),
        ("labels", meta.get("labels"), ds.labels),
        ("feature scaling", meta.get("scaler"), ds.scaler),
    ]
    for what, theirs, ours in checks:
        if theirs != ours:
            hint = " (give both runs the same --domain FILE)" if what == "feature scaling" else ""
            raise LucidError(f"--init {source}: its {what} differs from this run's{hint}")
    tensors = {name: t[0] for name, t in raw.items() if name != "removed"}
    expected = {name: tuple(t.shape) for name, t in initial_parameters(spec, ds.input_dim, ds.num_classes, 0).items()}
    if {name: tuple(t.shape) for name, t in tensors.items()} != expected:
        raise LucidError(f"--init {source}: its networks file does not hold this architecture's tensors")
    _check_independent(source, run, ds)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        if tensors[name].dtype != np.float32 or not np.isfinite(tensors[name]).all():
            raise LucidError(f"--init {source}: {name} is not a finite float32 tensor")
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensors[name]).tobytes())
    init = {name: torch.from_numpy(np.array(t)) for name, t in tensors.items()}
    record = {"sha256": digest.hexdigest(), "fingerprint": meta.get("training", {}).get("fingerprint")}
    return init, record


def _check_independent(source: str, run, ds: Dataset) -> None:
    """The leave-one-out guarantee assumes the start does not depend on the private rows.

    A start trained on this very training set is refused. A partial overlap is only warned
    about: tabular data sets hold many identical rows of different people (Adult does), so a
    shared row is not proof that the start saw this run's row.
    """

    try:
        with np.load(run.path / "data.npz", allow_pickle=False) as f:
            theirs_x, theirs_y = f["X_train"], f["y_train"]
    except (OSError, KeyError, ValueError) as exc:
        raise LucidError(f"--init {source}: cannot read its data.npz ({exc})") from None

    def rows(X: np.ndarray, y: np.ndarray) -> set[bytes]:
        X = np.ascontiguousarray(X, dtype=np.float64)
        return {X[i].tobytes() + int(y[i]).to_bytes(8, "little", signed=True) for i in range(len(y))}

    ours = rows(ds.X_train, ds.y_train)
    shared = len(ours & rows(theirs_x, theirs_y))
    if ours and shared == len(ours):
        raise LucidError(
            f"--init {source}: it was trained on every training row of this run, so its N_-i would not "
            "be independent of the left-out row; pre-train on other (public) data"
        )
    if shared:
        print(  # noqa: T201 (a warning line on stderr, as lucid train writes them)
            f"lucid: warning: {shared} of this run's {len(ours)} training rows also appear among the --init run's "
            "training rows; the guarantee assumes the start does not depend on them",
            file=sys.stderr,
        )
