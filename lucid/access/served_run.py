"""What the access layer reads of a run directory: bounds.json, the bounds answers are released
under (with the per-box bounds of `--regions` and the residual sets of `--residual`), and N, the
one network it evaluates (its dense layers alone, in float64, and its fingerprint). `lucid serve`,
`lucid evaluate`, `lucid budget` and `lucid report` read a run through these, so that a file one of
them refuses is refused by all.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from lucid.atomic import read_json
from lucid.errors import LucidError
from lucid.network import NetworkFile, stack_from_tensors
from lucid.regions import RegionTree
from lucid.regions.reader import read_regions
from lucid.residual import ResidualSets, read_residual
from lucid.rundir import BOUNDS_FILE, BOUNDS_FORMAT, Run


def load_upper_bounds(run: Run) -> np.ndarray:
    """beta_c per class from RUN/bounds.json; +inf where nothing is proved (every input noised)."""
    return load_bounds(run)[0]


def load_bounds(run: Run) -> tuple[np.ndarray, RegionTree | None, ResidualSets | None]:
    """beta_c per class, and the sections that refine it: the per-box bounds of `--regions` and
    the residual sets of `--residual` (each None when absent), from RUN/bounds.json."""
    path = run.path / BOUNDS_FILE
    doc = read_json(
        path, missing=f"{path} does not exist: run `lucid verify {run.path}` first", unreadable=f"{path} is corrupt"
    )
    if not isinstance(doc, dict) or doc.get("format") != BOUNDS_FORMAT or not isinstance(doc.get("bounds"), dict):
        raise LucidError(f"{path} is not a {BOUNDS_FORMAT} file")
    upper = _class_bounds(doc, run, path)
    regions = residual = None
    if doc.get("regions") is not None:
        regions = read_regions(doc["regions"], *run.domain, run.num_classes, str(path))
    if doc.get("residual") is not None:
        residual = read_residual(run.path, doc["residual"], run.num_classes, run.meta, str(path))
        boxes = [] if regions is None else regions.residual_sets()
        if not all(np.isin(r.positions, residual.positions).all() for r in boxes):
            raise LucidError(f"{path}: a region's residual set names a network the residual file does not hold")
        if any(len(r.positions) > residual.size for r in boxes):
            raise LucidError(f"{path}: a region's residual set holds more than {residual.size} networks")
    elif regions is not None and regions.residual_sets():
        raise LucidError(f"{path}: the regions section has residual sets but there is no residual section")
    return upper, regions, residual


def _class_bounds(doc: dict, run: Run, path: Path) -> np.ndarray:
    upper = np.full(run.num_classes, np.inf)
    for key, entry in doc["bounds"].items():
        try:
            cls = int(key)
        except ValueError:
            raise LucidError(f"{path}: class key {key!r} is not an integer") from None
        if not 0 <= cls < run.num_classes:
            raise LucidError(f"{path}: class {cls} is out of range for {run.num_classes} classes")
        value = entry.get("upper") if isinstance(entry, dict) else None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LucidError(f"{path}: the upper bound of class {cls} must be a finite number or null")
        upper[cls] = float(value)
    return upper


def load_n(run: Run) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    """N's dense layers (W^T, b) in float64 and a fingerprint of N, reading only N's slices."""
    tensors = NetworkFile(run.path, run.meta).n_tensors()
    digest = hashlib.sha256(json.dumps(run.meta, sort_keys=True).encode())
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].tobytes())
    stack = stack_from_tensors(tensors, run.meta.get("architecture", {}), run.input_dim)
    weights = [np.ascontiguousarray(w[0].T) for w in stack.weights]
    biases = [np.ascontiguousarray(b[0]) for b in stack.biases]
    return weights, biases, digest.hexdigest()
