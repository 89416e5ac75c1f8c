"""The verifier's networks as float64 arrays memory-mapped from RUN/cache/, shared by its worker processes.

`lucid verify` needs every network in float64 (exact copies of the float32 trained parameters).
Held in private memory, that is 8 bytes x parameters x networks in the driver and once more in each
worker process, which receives the problem by pickling: 36 000 networks of 2x100 on Adult are 3.6 GB
each time. Instead the float64 lowering is written once, chunk by chunk, to
`RUN/cache/networks-f64-KEY/` (KEY: a digest of `networks.safetensors` and the lowering's inputs),
and every process maps those files read-only: the pages live in the OS page cache, once for all
processes, and can be dropped and re-read under memory pressure. Local worker processes receive a
mapped array as its file name and layout (a `multiprocessing` reducer registered here), not as bytes;
Dask workers, which may be on other machines, still receive the data.

Read-only maps also guard the verifier: an in-place write to a network raises instead of silently
changing what is verified. A cache that cannot be written (read-only run directory) or read back
falls back to loading every network into memory; a stale cache cannot be used, because its key
changes with every byte of `networks.safetensors`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np

from lucid.network import NETWORKS_FILE, NetworkFile, NetworkStack

log = logging.getLogger(__name__)

CACHE_FORMAT = "lucid-networks-f64/1"
CHUNK_BYTES = 64 * 2**20  # float64 networks converted at a time while the cache is written
_HASH_BLOCK = 16 * 2**20


def networks_key(run_dir: Path, meta: dict) -> str:
    """Digest of everything the float64 lowering depends on: the file's bytes and the architecture."""
    h = hashlib.sha256(CACHE_FORMAT.encode())
    h.update(
        json.dumps(
            {"architecture": meta.get("architecture", {}), "input_dim": meta.get("input_dim")}, sort_keys=True
        ).encode()
    )
    with open(run_dir / NETWORKS_FILE, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()[:24]


def mapped_networks(run_dir: str | Path, meta: dict) -> NetworkStack:
    """Every network of the run, float64, memory-mapped from RUN/cache/ (written on first use)."""
    run_dir = Path(run_dir)
    source = NetworkFile(run_dir, meta)  # validates the file before anything is cached
    try:
        key = networks_key(run_dir, meta)
        folder = run_dir / "cache" / f"networks-f64-{key}"
        if not folder.is_dir():
            source.check_finite()  # the whole count in one line, before anything is written
            _write_cache(source, folder)
            _remove_stale(folder)
        stack = _open_cache(folder, len(source))
        if not np.array_equal(stack.removed, source.removed):
            raise ValueError(f"{folder} does not match {NETWORKS_FILE}")
        return stack
    except (OSError, ValueError, KeyError) as exc:
        log.warning("cannot map the networks from %s (%s); loading them into memory", run_dir / "cache", exc)
        return source.select(slice(None))


def _names(layers: int) -> list[str]:
    return [f"{kind}{i}" for i in range(layers) for kind in ("w", "b")]


def _write_cache(source: NetworkFile, folder: Path) -> None:
    first = source.select(slice(0, 1))
    arrays = [a for pair in zip(first.weights, first.biases, strict=True) for a in pair]
    per_network = sum(a[0].nbytes for a in arrays)
    chunk = max(1, CHUNK_BYTES // per_network)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        names = _names(len(first.weights))
        outs = [
            np.lib.format.open_memmap(
                staging / f"{name}.npy", mode="w+", dtype=np.float64, shape=(len(source),) + a.shape[1:]
            )
            for name, a in zip(names, arrays, strict=True)
        ]
        for start in range(0, len(source), chunk):
            part = source.select(slice(start, min(len(source), start + chunk)))
            for out, a in zip(
                outs, [a for pair in zip(part.weights, part.biases, strict=True) for a in pair], strict=True
            ):
                out[start : start + len(a)] = a
        for out in outs:
            out.flush()
        del outs
        np.save(staging / "removed.npy", source.removed)
        (staging / "layers.json").write_text(json.dumps({"format": CACHE_FORMAT, "layers": len(first.weights)}))
        for path in staging.iterdir():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():  # not another process's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_stale(keep: Path) -> None:
    """Caches of earlier versions of the networks file (each twice its size) go when a new one is
    written; a process still mapping one keeps reading it until it unmaps (POSIX unlink)."""
    for other in keep.parent.glob("networks-f64-*"):
        if other != keep and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)


def _open_cache(folder: Path, count: int) -> NetworkStack:
    layers = int(json.loads((folder / "layers.json").read_text())["layers"])
    arrays = [np.load(folder / f"{name}.npy", mmap_mode="r") for name in _names(layers)]
    removed = np.load(folder / "removed.npy")
    if any(a.dtype != np.float64 or a.shape[0] != count for a in arrays) or len(removed) != count:
        raise ValueError(f"{folder} does not hold {count} float64 networks")
    return NetworkStack(arrays[0::2], arrays[1::2], removed.astype(np.int64))


def _reduce_memmap(a: np.memmap):
    """A read-only map of a whole file travels as (file, offset, dtype, shape); anything else as data."""
    whole = isinstance(a.base, mmap.mmap) and a.mode == "r" and a.filename is not None
    if whole and a.flags.c_contiguous:
        return _open_map, (a.filename, a.offset, a.dtype.str, a.shape)
    return _rebuild_array, (np.asarray(a).copy(),)


def _open_map(filename: str, offset: int, dtype: str, shape: tuple[int, ...]) -> np.memmap:
    return np.memmap(filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=shape)


def _rebuild_array(a: np.ndarray) -> np.ndarray:
    return a


ForkingPickler.register(np.memmap, _reduce_memmap)
