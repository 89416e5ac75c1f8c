"""`train_run`: data -> a complete, atomically published run directory (format lucid-run/1).

Work happens in a sibling staging directory `RUN.partial/`: a manifest (the run's fingerprint
and the chunk size) plus one safetensors file per finished chunk of networks. Re-running the
same command skips finished chunks; since a chunk's result depends only on the run and the
chunk's membership, the resumed result is bit-identical to an uninterrupted one (same device
and thread count). The finished directory is assembled inside the staging area and renamed to
RUN in one step, so RUN is either absent or complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lucid.agt.store import AGT_FILE, save_boxes
from lucid.data import Dataset, prepare_dataset
from lucid.errors import LucidError
from lucid.rundir import RUN_FORMAT
from lucid.training.architecture import check_arch_fits, initial_parameters, parse_arch
from lucid.training.finetune import parse_train_layers, pretrained_init
from lucid.training.progress import TrainingProgress
from lucid.training.agt_options import agt_width, check_agt_options, stage_agt_boxes
from lucid.training.resources import MEMORY_BUDGET, chunk_bytes, cores, default_chunk_size, keep_freed_memory
from lucid.training.staging import chunk_name, existing_run_matches, open_staging, publish, save_arrays, save_tensors
from lucid.training.vectorized import batch_orders, train_networks

ALGORITHM = "lucid-loo-sgd/1"  # docs/training.md defines it; bump if T ever changes
STOP_AFTER_ENV = "LUCID_TRAIN_STOP_AFTER_CHUNKS"  # test hook: simulate Ctrl-C after N new chunks


def train_run(
    data: str,
    out: str | Path,
    *,
    arch: str = "2x50",
    epochs: int = 50,
    lr: float = 0.1,
    weight_decay: float = 1e-5,
    batch_size: int = 1024,
    seed: int = 0,
    test_fraction: float = 0.2,
    test_data: str | None = None,
    label: str | None = None,
    domain: str | None = None,
    device: str = "cpu",
    chunk_size: int | None = None,
    progress: bool = True,
    scheduler: Any = None,
    agt: int = 0,
    agt_max_width: float | None = None,
    loo: bool = True,
    init_from: str | None = None,
    train_layers: str = "all",
) -> Path:
    """Train N and every leave-one-out network N_-i; write (or resume, or keep) the run at `out`.

    `scheduler`: train the chunks on a Dask cluster (`tcp://HOST:8786`, `local:N` or a Client;
    see `lucid.cluster`) instead of this process's threads; the result is bit-identical.
    `agt=K` also stores the abstract-gradient-training boxes for k = 1..K (`agt.safetensors`,
    docs/agt.md); `loo=False` trains N alone (for `agt`, or as another run's pre-trained start).
    `init_from` (a run directory) starts from that run's N instead of T's seeded initialisation and
    `train_layers` (`all`, `last`, `0,2`) chooses the layers SGD updates: the fine-tuning variant
    of T (`lucid.training.finetune`)."""
    _check_options(epochs, lr, weight_decay, batch_size, chunk_size)
    check_agt_options(agt, agt_max_width)
    dev = _device(device)
    if scheduler is not None and dev.type != "cpu":
        raise LucidError("--scheduler trains on the workers' CPUs; leave out --device")
    spec = parse_arch(arch)
    trainable = parse_train_layers(train_layers, spec)
    ds = prepare_dataset(data, label=label, test_data=test_data, test_fraction=test_fraction, seed=seed, domain=domain)
    check_arch_fits(spec, ds.input_dim)
    if init_from is not None:
        init, init_record = pretrained_init(init_from, spec, ds)
    else:
        init, init_record = initial_parameters(spec, ds.input_dim, ds.num_classes, seed), None
    training = {
        "algorithm": ALGORITHM,
        "optimizer": "sgd",
        "momentum": 0.0,
        "loss": "cross_entropy",
        "lr": float(lr),
        "weight_decay": float(weight_decay),
        "epochs": int(epochs),
        "batch_size": int(batch_size),
        "seed": int(seed),
        "test_fraction": None if test_data is not None else float(test_fraction),
        "test_data": test_data,
    }
    if agt:  # only when asked: runs without AGT keep their fingerprints
        training["agt"] = {"max_k": int(agt), "max_width": agt_width(agt_max_width)}
    if not loo:
        training["loo"] = False
    if init_record is not None:  # only when asked, like agt: other runs keep their fingerprints
        training["init"] = init_record
    if trainable is not None:
        training["trainable_layers"] = sorted(trainable)
    meta = _run_json(ds, spec, training)
    fingerprint = _fingerprint(meta, ds)
    meta["training"]["fingerprint"] = fingerprint

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    if existing_run_matches(out, fingerprint):
        if partial.exists():
            shutil.rmtree(partial)  # leftover of a crash between publishing and cleaning up
        return out

    # Connect before anything is written: an unreachable or mismatched cluster leaves no trace.
    cluster = None
    if scheduler is not None:
        from lucid.cluster import connect

        cluster = connect(scheduler)
    try:
        return _train(ds, spec, meta, out, partial, fingerprint, init, trainable, epochs=epochs, lr=lr,
                      weight_decay=weight_decay, batch_size=batch_size, seed=seed, dev=dev, chunk_size=chunk_size,
                      progress=progress, cluster=cluster, agt=int(agt), agt_max_width=agt_width(agt_max_width),
                      loo=loo)
    finally:
        if cluster is not None:
            cluster.close()


def _train(ds: Dataset, spec: dict, meta: dict, out: Path, partial: Path, fingerprint: str,
           init: dict[str, torch.Tensor], trainable: set[int] | None, *, epochs: int, lr: float,
           weight_decay: float, batch_size: int, seed: int, dev: torch.device, chunk_size: int | None,
           progress: bool, cluster: Any, agt: int, agt_max_width: float, loo: bool) -> Path:
    n = len(ds.y_train)
    if chunk_size is None:
        chunk_size = default_chunk_size(spec, ds.input_dim, ds.num_classes, n, batch_size)
    orders = batch_orders(n, epochs, seed)
    boxes = None
    if agt and not (partial / AGT_FILE).exists():  # a resumed run keeps its boxes
        # before anything is written: a diverging bound stops the command with nothing on disk
        boxes = stage_agt_boxes(ds, spec, init, orders, agt, agt_max_width, lr=lr, weight_decay=weight_decay,
                                batch_size=batch_size, trainable=trainable, progress=progress)
    chunk_size = open_staging(partial, fingerprint, chunk_size)
    if boxes is not None:
        save_boxes(partial / AGT_FILE, boxes, algorithm=ALGORITHM, max_width=agt_max_width)
    # position 0 = N, position j = without row j-1 (with --no-loo: N alone)
    removed_all = torch.arange(-1, n if loo else 0, dtype=torch.int64)
    total = len(removed_all)
    bounds = [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]
    X = torch.from_numpy(ds.X_train).to(dev)
    y = torch.from_numpy(ds.y_train).to(dev)
    todo = [c for c in range(len(bounds)) if not (partial / chunk_name(c)).exists()]
    stop = threading.Event()
    stop_after = int(os.environ.get(STOP_AFTER_ENV, "0") or 0)
    if cluster is not None:
        from lucid.training.distributed import train_on_cluster

        inputs = {"X": ds.X_train, "y": ds.y_train, "orders": orders.numpy(), "spec": spec,
                  "init": {k: v.numpy() for k, v in init.items()}}
        options = {"lr": lr, "weight_decay": weight_decay, "batch_size": batch_size, "num_classes": ds.num_classes,
                   "trainable": trainable}
        with TrainingProgress(total=total, enabled=progress) as bar:
            bar.advance(total - sum(bounds[c][1] - bounds[c][0] for c in todo))
            train_on_cluster(cluster, inputs, {c: bounds[c] for c in todo}, options,
                             save=lambda c, arrays: save_arrays(partial / chunk_name(c), arrays),
                             advance=bar.advance, stop_after=stop_after)
        publish(partial, out, meta, ds, len(bounds))
        return out

    def train_chunk(c: int, bar: TrainingProgress) -> None:
        # One torch thread per chunk: chunks run in parallel worker threads (the GIL is released
        # inside torch ops), which scales better than intra-op threads on a busy machine and makes
        # every chunk's arithmetic independent of the core count, hence bit-reproducible.
        torch.set_num_threads(1)
        lo, hi = bounds[c]
        per_epoch = (hi - lo) / epochs

        def on_epoch(_epoch: int) -> None:
            if stop.is_set():
                raise _Stopped
            bar.advance(per_epoch)

        trained = train_networks(
            init, spec, X, y, removed_all[lo:hi], orders,
            lr=lr, weight_decay=weight_decay, batch_size=batch_size, num_classes=ds.num_classes,
            trainable=trainable, on_epoch=on_epoch,
        )
        trained["removed"] = removed_all[lo:hi]
        save_tensors(partial / chunk_name(c), trained)

    keep_freed_memory()
    if dev.type == "cuda":
        workers = 1  # one GPU: chunks run one after another
    else:  # one chunk per core, as many as the memory budget allows
        fit = MEMORY_BUDGET // chunk_bytes(spec, ds, chunk_size, batch_size)
        workers = max(1, min(cores(), len(todo), fit))
    threads_before = torch.get_num_threads()
    with TrainingProgress(total=total, enabled=progress) as bar:
        bar.advance(total - sum(bounds[c][1] - bounds[c][0] for c in todo))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lucid-train")
        try:
            pending = {pool.submit(train_chunk, c, bar) for c in todo}
            finished = 0
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()  # re-raise a worker's error here
                    finished += 1
                if stop_after and finished >= stop_after and pending:
                    raise KeyboardInterrupt  # test hook: behave exactly like Ctrl-C
        except BaseException:
            stop.set()  # unfinished chunks stop at their next epoch; finished ones stay saved
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            torch.set_num_threads(threads_before)
    publish(partial, out, meta, ds, len(bounds))
    return out


# ------------------------------------------------------------------------------------- helpers


def _check_options(epochs: int, lr: float, weight_decay: float, batch_size: int, chunk_size: int | None) -> None:
    if int(epochs) != epochs or epochs < 1:
        raise LucidError(f"--epochs must be a positive integer, got {epochs}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise LucidError(f"--batch-size must be a positive integer, got {batch_size}")
    if not (math.isfinite(lr) and lr > 0):
        raise LucidError(f"--lr must be a positive number, got {lr}")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise LucidError(f"--weight-decay must be a non-negative number, got {weight_decay}")
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise LucidError(f"--chunk-size must be a positive integer, got {chunk_size}")


def _device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise LucidError(f"unknown device '{device}' (use cpu or cuda)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LucidError("--device cuda was requested but CUDA is not available here")
    if dev.type not in ("cpu", "cuda"):
        raise LucidError(f"unsupported device '{device}' (use cpu or cuda)")
    return dev


class _Stopped(Exception):
    """Raised inside a worker to abandon its chunk after an interrupt."""


def _run_json(ds: Dataset, spec: dict, training: dict) -> dict:
    return {
        "format": RUN_FORMAT,
        "num_classes": ds.num_classes,
        "input_dim": ds.input_dim,
        "train_size": int(len(ds.y_train)),
        "test_size": int(len(ds.y_test)),
        "domain": ds.domain,
        "architecture": spec,
        "training": training,
        "labels": ds.labels,
        "scaler": ds.scaler,
        "data": {"source": ds.source, "feature_names": ds.feature_names},
    }


def _fingerprint(meta: dict, ds: Dataset) -> str:
    """Identity of a run: the exact training inputs and everything that defines T's output.

    Paths (data source, test file) are left out so the same data reached another way is the same run.
    """
    h = hashlib.sha256()
    ident = {k: meta[k] for k in ("format", "architecture", "labels", "scaler", "domain")}
    ident["training"] = {k: v for k, v in meta["training"].items() if k != "test_data"}
    h.update(json.dumps(ident, sort_keys=True).encode())
    for arr in (ds.X_train, ds.y_train, ds.X_test, ds.y_test):
        h.update(str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


