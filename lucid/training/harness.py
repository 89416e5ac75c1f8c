"""`train_run`: data -> a complete, atomically published run directory (format lucid-run/1).

Work happens in a sibling staging directory `RUN.partial/`: a manifest (the run's fingerprint
and the chunk size) plus one safetensors file per finished chunk of networks. Re-running the
same command skips finished chunks; since a chunk's result depends only on the run and the
chunk's membership, the resumed result is bit-identical to an uninterrupted one (same device
and thread count). The finished directory is assembled inside the staging area and renamed to
RUN in one step, so RUN is either absent or complete.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from lucid.agt.store import AGT_FILE, save_boxes
from lucid.cluster import connect
from lucid.data import Dataset, prepare_dataset
from lucid.option_fields import settings_with_options
from lucid.rundir import RUN_FORMAT, trained_run_fingerprint
from lucid.sgd import TrainingInputs
from lucid.training.agt_options import stage_agt_boxes
from lucid.training.architecture import check_arch_fits, initial_parameters
from lucid.training.distributed import train_on_cluster
from lucid.training.finetune import pretrained_init
from lucid.training.progress import TrainingProgress
from lucid.training.resources import MEMORY_BUDGET, chunk_bytes, cores, default_chunk_size, keep_freed_memory
from lucid.training.settings import ALGORITHM, TrainSettings
from lucid.training.staging import chunk_name, existing_run_matches, open_staging, publish, save_arrays, save_tensors
from lucid.training.vectorized import batch_orders, train_networks

STOP_AFTER_ENV = "LUCID_TRAIN_STOP_AFTER_CHUNKS"  # test hook: simulate Ctrl-C after N new chunks


def train_run(data: str, out: str | Path, settings: TrainSettings | None = None, **options: Any) -> Path:
    """Train N and every leave-one-out network N_-i; write (or resume, or keep) the run at `out`.

    Options are a `TrainSettings` or its fields as keywords (`train_run(data, out, arch="2x10")`);
    keywords given with a `TrainSettings` replace its fields. `scheduler` trains the chunks on a
    Dask cluster instead of this process's threads, with a bit-identical result; `agt=K` also
    stores the abstract-gradient-training boxes for k = 1..K (`agt.safetensors`, docs/agt.md);
    `loo=False` trains N alone (for `agt`, or as another run's pre-trained start); `init_from` and
    `train_layers` select the fine-tuning variant of T (`lucid.training.finetune`)."""
    if settings is None:
        settings = TrainSettings.from_options(**options)
    elif options:
        settings = settings_with_options(settings, "train", options)
    spec = settings.spec
    ds = prepare_dataset(
        data,
        label=settings.label,
        test_data=settings.test_data,
        test_fraction=settings.test_fraction,
        seed=settings.seed,
        domain=settings.domain,
    )
    check_arch_fits(spec, ds.input_dim)
    if settings.init_from is not None:
        init, init_record = pretrained_init(settings.init_from, spec, ds)
    else:
        init, init_record = initial_parameters(spec, ds.input_dim, ds.num_classes, settings.seed), None
    meta = _run_json(ds, spec, settings.training_record(init_record))
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
    if settings.scheduler is not None:
        cluster = connect(settings.scheduler)
    try:
        return _train(ds, meta, out, partial, init, settings, cluster)
    finally:
        if cluster is not None:
            cluster.close()


def _train(
    ds: Dataset,
    meta: dict,
    out: Path,
    partial: Path,
    init: dict[str, torch.Tensor],
    settings: TrainSettings,
    cluster: Any,
) -> Path:
    spec, fingerprint = meta["architecture"], meta["training"]["fingerprint"]
    epochs, batch_size, progress, dev = settings.epochs, settings.batch_size, settings.progress, settings.torch_device
    sgd = settings.sgd_step(ds.num_classes)  # T's SGD step, as every chunk (local or on a Dask worker) is given it
    n = len(ds.y_train)
    chunk_size = settings.chunk_size
    if chunk_size is None:
        chunk_size = default_chunk_size(spec, ds.input_dim, ds.num_classes, n, batch_size)
    orders = batch_orders(n, epochs, settings.seed)
    boxes = None
    if settings.agt and not (partial / AGT_FILE).exists():  # a resumed run keeps its boxes
        # before anything is written: a diverging bound stops the command with nothing on disk
        boxes = stage_agt_boxes(ds, spec, init, orders, settings)
    chunk_size = open_staging(partial, fingerprint, chunk_size)
    if boxes is not None:
        save_boxes(partial / AGT_FILE, boxes, algorithm=ALGORITHM, max_width=settings.agt_width)
    # position 0 = N, position j = without row j-1 (with --no-loo: N alone)
    removed_all = torch.arange(-1, n if settings.loo else 0, dtype=torch.int64)
    total = len(removed_all)
    bounds = [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]
    inputs = TrainingInputs(
        init, spec, torch.from_numpy(ds.X_train).to(dev), torch.from_numpy(ds.y_train).to(dev), orders
    )
    todo = [c for c in range(len(bounds)) if not (partial / chunk_name(c)).exists()]
    stop = threading.Event()
    stop_after = int(os.environ.get(STOP_AFTER_ENV, "0") or 0)
    if cluster is not None:
        held = {
            "X": ds.X_train,
            "y": ds.y_train,
            "orders": orders.numpy(),
            "spec": spec,
            "init": {k: v.numpy() for k, v in init.items()},
        }
        with TrainingProgress(total=total, enabled=progress) as bar:
            bar.advance(total - sum(bounds[c][1] - bounds[c][0] for c in todo))
            train_on_cluster(
                cluster,
                held,
                {c: bounds[c] for c in todo},
                sgd,
                save=lambda c, arrays: save_arrays(partial / chunk_name(c), arrays),
                advance=bar.advance,
                stop_after=stop_after,
            )
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

        trained = train_networks(inputs, sgd, removed_all[lo:hi], on_epoch=on_epoch)
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


class _Stopped(Exception):
    """Raised inside a worker to abandon its chunk after an interrupt."""


def _run_json(ds: Dataset, spec: dict, training: dict) -> dict:
    return {
        "format": RUN_FORMAT,
        "num_classes": ds.num_classes,
        "input_dim": ds.input_dim,
        "train_size": len(ds.y_train),
        "test_size": len(ds.y_test),
        "domain": ds.domain,
        "architecture": spec,
        "training": training,
        "labels": ds.labels,
        "scaler": ds.scaler,
        "data": {"source": ds.source, "feature_names": ds.feature_names},
    }


def _fingerprint(meta: dict, ds: Dataset) -> str:
    """Identity of a run (`lucid.rundir.trained_run_fingerprint`)."""
    return trained_run_fingerprint(meta, ds.X_train, ds.y_train, ds.X_test, ds.y_test)
