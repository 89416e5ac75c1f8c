"""An imported run's identity, and a run's provenance across `lucid export --all` and `lucid import`.

`lucid import` records its runs' training algorithm as `EXTERNAL_ALGORITHM` and fingerprints them over
everything they hold (`imported_run_fingerprint`). `lucid export --all` writes an `origin` record
into its manifest: the run's own run.json and a digest of its networks. When `lucid import` reads
back exactly that run's networks and data, it restores that run.json byte for byte, so the round
trip keeps the fingerprint and the training record (`restored_run`). The check catches files
changed or mixed up since the export; it is no signature.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from lucid.network import stack_from_tensors
from lucid.rundir import EXTERNAL_ALGORITHM, trained_run_fingerprint

NOT_KEPT = "not kept: the manifest's origin does not match these networks and data"


def imported_run_fingerprint(meta: dict, arrays: tuple[np.ndarray, ...], tensors: dict[str, np.ndarray]) -> str:
    """Identity of an imported run: its metadata, the data (X_train, y_train, X_test, y_test) and
    the networks' exact parameters."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in meta.items() if k != "training"}, sort_keys=True).encode())
    h.update(json.dumps({k: v for k, v in meta["training"].items() if k != "fingerprint"}, sort_keys=True).encode())
    for arr in (*arrays, *(tensors[k] for k in sorted(tensors))):
        h.update(str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).data)  # a view: the stacked networks are not copied
    return h.hexdigest()


class NetworksDigest:
    """sha256 of float32 dense networks added in stack order (position 0 is N), with their removed
    rows: what `lucid export --all` records and `lucid import` checks."""

    def __init__(self, removed: np.ndarray) -> None:
        self._h = hashlib.sha256(np.ascontiguousarray(removed, dtype=np.int64).tobytes())

    def add(self, weights: list[np.ndarray], biases: list[np.ndarray]) -> None:
        for w, b in zip(weights, biases, strict=True):
            self._h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
            self._h.update(np.ascontiguousarray(b, dtype=np.float32).tobytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def origin_record(meta: dict, networks_sha256: str) -> dict:
    """The manifest's `origin`: the exported run's run.json and its networks' digest."""
    return {"run": meta, "networks_sha256": networks_sha256}


def dense_layers(tensors: dict[str, np.ndarray], meta: dict, chunk: int = 256):
    """(weights, biases) of each network of a stacked tensors dict in stack order, float32, as the
    verifier sees them: a CNN's convolutions lowered (exactly: kernel entries and zeros)."""
    for start in range(0, len(tensors["removed"]), chunk):
        part = {k: v[start : start + chunk] for k, v in tensors.items()}
        stack = stack_from_tensors(part, meta.get("architecture", {}), int(meta["input_dim"]))
        for p in range(len(stack)):
            yield ([w[p].astype(np.float32) for w in stack.weights], [b[p].astype(np.float32) for b in stack.biases])


ARCHITECTURE_FIELDS = ("type", "hidden", "input_shape", "conv")  # ("spec" is written from these)


def restored_run(
    origin: Any, meta: dict, arrays: tuple[np.ndarray, ...], tensors: dict[str, np.ndarray]
) -> dict | None:
    """The run.json of the run `lucid export --all` wrote these files from, when they are that run's
    networks and data exactly: the networks' digest and the run's own fingerprint (recomputed here,
    from the data given) must match, and so must every field the import derived from the files
    (`meta`). None otherwise."""
    if not isinstance(origin, dict) or not isinstance(origin.get("run"), dict):
        return None
    run = origin["run"]
    training = run.get("training")
    if not isinstance(training, dict) or not isinstance(training.get("fingerprint"), str):
        return None
    derived = ("format", "num_classes", "input_dim", "train_size", "test_size", "domain", "labels", "scaler")
    if any(run.get(k) != meta.get(k) for k in derived):
        return None
    architecture = run.get("architecture") if isinstance(run.get("architecture"), dict) else {}
    if any(architecture.get(k) != meta["architecture"].get(k) for k in ARCHITECTURE_FIELDS):
        return None
    digest = NetworksDigest(tensors["removed"])
    for weights, biases in dense_layers(tensors, meta):
        digest.add(weights, biases)
    if origin.get("networks_sha256") != digest.hexdigest():
        return None
    try:
        if training.get("algorithm") == EXTERNAL_ALGORITHM:
            fingerprint = imported_run_fingerprint(run, arrays, tensors)
        else:
            fingerprint = trained_run_fingerprint(run, *arrays)
    except (KeyError, TypeError, ValueError):
        return None
    return run if fingerprint == training["fingerprint"] else None
