"""The staging directory of `lucid train`: RUN.partial/ holds a manifest (the run's fingerprint and
chunk size) and one file per finished chunk; the finished run is assembled inside it and renamed to
RUN in one step, so RUN is either absent or complete, and an interrupted run resumes chunk by chunk."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from lucid.agt.store import AGT_FILE
from lucid.atomic import write_atomic, write_json_atomic
from lucid.data import Dataset
from lucid.dynamic_range import check_tensors_range
from lucid.errors import LucidError
from lucid.network import NETWORKS_FILE, diverged_message, non_finite


def existing_run_matches(out: Path, fingerprint: str) -> bool:
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
        raise LucidError(
            f"output directory {out} holds a run.json this version cannot compare; choose another --out"
        ) from None
    if theirs != fingerprint or not (out / NETWORKS_FILE).exists():
        raise LucidError(f"output directory {out} holds a different run (other data or options); choose another --out")
    return True


def open_staging(partial: Path, fingerprint: str, chunk_size: int) -> int:
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


def chunk_name(c: int) -> str:
    return f"chunk-{c:05d}.safetensors"


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    write_atomic(path, lambda tmp: save_file(cpu, tmp))


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    write_atomic(path, lambda tmp: save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, tmp))


def publish(partial: Path, out: Path, meta: dict, ds: Dataset, n_chunks: int) -> None:
    """Assemble the chunks into the final directory inside the staging area, then rename it to `out`."""
    chunks = [load_file(str(partial / chunk_name(c))) for c in range(n_chunks)]
    stacked = {name: np.concatenate([ch[name] for ch in chunks]) for name in chunks[0]}
    del chunks
    bad = non_finite(stacked)
    if bad.any():  # never publish: the chunks stay, so the same command ends here again at once
        first = int(stacked["removed"][bad.argmax()])
        raise LucidError(
            diverged_message(int(bad.sum()), len(bad), first)
            + f" (this run: --lr {meta['training']['lr']:g}; the unfinished run is kept in {partial}: "
            "delete it to discard it)"
        )
    check_tensors_range(stacked, meta, f"the trained networks (the unfinished run is kept in {partial})")
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
