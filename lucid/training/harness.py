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
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import torch

from lucid.agt.store import AGT_FILE, save_boxes
from lucid.agt.train import DEFAULT_MAX_WIDTH, agt_boxes
from lucid.atomic import write_atomic, write_json_atomic
from lucid.data import Dataset, prepare_dataset
from lucid.errors import LucidError
from lucid.network import NETWORKS_FILE
from lucid.rundir import RUN_FORMAT
from lucid.training.architecture import check_arch_fits, initial_parameters, parse_arch
from lucid.training.progress import TrainingProgress
from lucid.training.vectorized import batch_orders, train_networks

ALGORITHM = "lucid-loo-sgd/1"  # docs/training.md defines it; bump if T ever changes
MEMORY_BUDGET = 3 * 2**30  # bytes of working memory per chunk (stays under ~4 GiB with overheads)
MAX_CHUNK = 64  # cache-friendly (measured), and a fine resume granularity
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
    agt: int = 0,
    agt_max_width: float | None = None,
    loo: bool = True,
) -> Path:
    """Train N and every leave-one-out network N_-i; write (or resume, or keep) the run at `out`.

    `agt=K` also stores the abstract-gradient-training boxes for k = 1..K (`agt.safetensors`,
    docs/agt.md); `loo=False` (only with `agt`) trains N alone.
    """
    _check_options(epochs, lr, weight_decay, batch_size, chunk_size)
    _check_agt_options(agt, agt_max_width, loo)
    dev = _device(device)
    spec = parse_arch(arch)
    ds = prepare_dataset(data, label=label, test_data=test_data, test_fraction=test_fraction, seed=seed, domain=domain)
    check_arch_fits(spec, ds.input_dim)
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
        training["agt"] = {"max_k": int(agt), "max_width": float(_agt_width(agt_max_width))}
    if not loo:
        training["loo"] = False
    meta = _run_json(ds, spec, training)
    fingerprint = _fingerprint(meta, ds)
    meta["training"]["fingerprint"] = fingerprint

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    if _existing_run_matches(out, fingerprint):
        if partial.exists():
            shutil.rmtree(partial)  # leftover of a crash between publishing and cleaning up
        return out

    n = len(ds.y_train)
    if chunk_size is None:
        chunk_size = default_chunk_size(spec, ds.input_dim, ds.num_classes, n, batch_size)
    init = initial_parameters(spec, ds.input_dim, ds.num_classes, seed)
    orders = batch_orders(n, epochs, seed)
    boxes = None
    if agt and not (partial / AGT_FILE).exists():  # a resumed run keeps its boxes
        # before anything is written: a diverging bound stops the command with nothing on disk
        if progress:
            print(f"lucid: abstract gradient training, boxes for k = 1..{int(agt)}", file=sys.stderr, flush=True)
        boxes = agt_boxes(
            init, spec, torch.from_numpy(ds.X_train), torch.from_numpy(ds.y_train), orders, max_k=int(agt),
            lr=lr, weight_decay=weight_decay, batch_size=batch_size, num_classes=ds.num_classes,
            max_width=_agt_width(agt_max_width),
        )
    chunk_size = _open_staging(partial, fingerprint, chunk_size)
    if boxes is not None:
        save_boxes(partial / AGT_FILE, boxes, algorithm=ALGORITHM, max_width=_agt_width(agt_max_width))
    # position 0 = N, position j = without row j-1 (N alone without leave-one-out networks)
    removed_all = torch.arange(-1, n if loo else 0, dtype=torch.int64)
    total = len(removed_all)
    bounds = [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]

    X = torch.from_numpy(ds.X_train).to(dev)
    y = torch.from_numpy(ds.y_train).to(dev)
    todo = [c for c in range(len(bounds)) if not (partial / _chunk_name(c)).exists()]
    stop = threading.Event()
    stop_after = int(os.environ.get(STOP_AFTER_ENV, "0") or 0)

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
            on_epoch=on_epoch,
        )
        trained["removed"] = removed_all[lo:hi]
        _save_tensors(partial / _chunk_name(c), trained)

    _keep_freed_memory()
    if dev.type == "cuda":
        workers = 1  # one GPU: chunks run one after another
    else:  # one chunk per core, as many as the memory budget allows
        fit = MEMORY_BUDGET // _chunk_bytes(spec, ds, chunk_size, batch_size)
        workers = max(1, min(_cores(), len(todo), fit))
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
    _publish(partial, out, meta, ds, len(bounds))
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


def _check_agt_options(agt: int, agt_max_width: float | None, loo: bool) -> None:
    if int(agt) != agt or agt < 0:
        raise LucidError(f"--agt must be a non-negative integer (the largest number of removed rows), got {agt}")
    if agt_max_width is not None and not (math.isfinite(agt_max_width) and agt_max_width > 0):
        raise LucidError(f"--agt-max-width must be a positive number, got {agt_max_width}")
    if not loo and not agt:
        raise LucidError("--no-loo trains N alone and is only useful with --agt K (the boxes stand in for N_-i)")


def _agt_width(agt_max_width: float | None) -> float:
    return DEFAULT_MAX_WIDTH if agt_max_width is None else float(agt_max_width)


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


def _keep_freed_memory() -> None:
    """Stop glibc from handing every freed block over 128 KiB back to the OS.

    Each training step allocates fresh activation tensors of about a megabyte; by default glibc
    maps and unmaps them every step, and the page faults cost ~40% of the training CPU time
    (measured). Freed memory then stays in the process's heap, bounded by the chunk working set.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 256 * 2**20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 512 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        pass


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _bytes_per_network(spec: dict, input_dim: int, num_classes: int, n: int, batch_size: int) -> int:
    """Rough working memory of one network in a chunk (float32 parameters, gradients, activations)."""
    widths = [input_dim]
    n_params = 0
    if spec["type"] == "cnn":
        length, channels = input_dim, 1
        for c in spec["conv_channels"]:
            n_params += c * channels * spec["kernel_size"] + c
            length -= spec["kernel_size"] - 1
            widths.append(c * length + channels * spec["kernel_size"] * length)  # output + unfolded input
            channels = c
        widths[-1] = channels * length
        flat = channels * length
    else:
        flat = input_dim
    sizes = [flat] + list(spec["hidden"]) + [num_classes]
    n_params += sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    widths += sizes[1:]
    rows = min(batch_size, n)
    per_network = 4 * (4 * n_params + 6 * rows * sum(widths))  # float32: params/grads/copies, acts
    return per_network


def _chunk_bytes(spec: dict, ds: Dataset, chunk_size: int, batch_size: int) -> int:
    per = _bytes_per_network(spec, ds.input_dim, ds.num_classes, len(ds.y_train), batch_size)
    return max(1, per * chunk_size)


def default_chunk_size(spec: dict, input_dim: int, num_classes: int, n: int, batch_size: int) -> int:
    """Networks per chunk: as many as fit MEMORY_BUDGET (capped), balanced across chunks.

    Depends only on the run's shapes, never on the machine, so a resumed run (which must use
    the same chunks to be bit-identical) recomputes the same value.
    """
    per_network = _bytes_per_network(spec, input_dim, num_classes, n, batch_size)
    total = n + 1
    cap = max(1, min(MAX_CHUNK, MEMORY_BUDGET // per_network))
    chunks = math.ceil(total / cap)
    return math.ceil(total / chunks)


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


def _existing_run_matches(out: Path, fingerprint: str) -> bool:
    """True if `out` already holds this exact run; error if it holds anything else."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise LucidError(f"output {out} exists and is not a directory")
    meta_path = out / "run.json"
    if not meta_path.exists():
        if any(out.iterdir()):
            raise LucidError(f"output directory {out} is not empty and holds no LUCID run; choose another --out")
        return False
    try:
        meta = json.loads(meta_path.read_text())
        theirs = meta["training"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        raise LucidError(f"output directory {out} holds a run.json this version cannot compare; choose another --out") from None
    if theirs != fingerprint or not (out / NETWORKS_FILE).exists():
        raise LucidError(f"output directory {out} holds a different run (other data or options); choose another --out")
    return True


def _open_staging(partial: Path, fingerprint: str, chunk_size: int) -> int:
    """Create or reopen RUN.partial; returns the chunk size to use (a resumed run keeps its own)."""
    manifest_path = partial / "manifest.json"
    if partial.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
            same = manifest["fingerprint"] == fingerprint
            chunk_size = int(manifest["chunk_size"])
        except (OSError, ValueError, KeyError, TypeError):
            raise LucidError(f"{partial} exists but is not a LUCID staging directory; remove it") from None
        if not same:
            raise LucidError(
                f"{partial} holds an interrupted different run (other data or options); "
                "re-run that command to finish it or delete the directory"
            )
        return chunk_size
    partial.mkdir(parents=True)
    write_json_atomic(manifest_path, {"fingerprint": fingerprint, "chunk_size": chunk_size})
    return chunk_size


def _chunk_name(c: int) -> str:
    return f"chunk-{c:05d}.safetensors"


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    write_atomic(path, lambda tmp: save_file(cpu, tmp))


def _publish(partial: Path, out: Path, meta: dict, ds: Dataset, n_chunks: int) -> None:
    """Assemble the chunks into the final directory inside the staging area, then rename it to `out`."""
    from safetensors.numpy import load_file, save_file

    chunks = [load_file(str(partial / _chunk_name(c))) for c in range(n_chunks)]
    stacked = {name: np.concatenate([ch[name] for ch in chunks]) for name in chunks[0]}
    del chunks
    final = partial / "final"
    if final.exists():
        shutil.rmtree(final)
    final.mkdir()
    write_atomic(final / NETWORKS_FILE, lambda tmp: save_file(stacked, tmp))

    def write_npz(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, X_train=ds.X_train, y_train=ds.y_train, X_test=ds.X_test, y_test=ds.y_test)

    write_atomic(final / "data.npz", write_npz)
    if (partial / AGT_FILE).exists():
        os.replace(partial / AGT_FILE, final / AGT_FILE)
    write_json_atomic(final / "run.json", meta)  # last: its presence marks a complete run
    if out.exists():
        out.rmdir()  # only an empty directory gets here (checked before training)
    os.replace(final, out)
    shutil.rmtree(partial)
