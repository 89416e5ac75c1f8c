"""The reader of bounds.json's `regions` section (lucid-regions/1, docs/formats.md): a
`RegionTree` rebuilt by replaying its splits over the run's domain, with the checks that refuse
anything but a partition of that domain with well-formed bounds, in one line."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lucid.errors import LucidError
from lucid.regions.tree import REGIONS_FORMAT, RegionTree
from lucid.residual import ClassResidual


def read_regions(doc: Any, lower: np.ndarray, upper: np.ndarray, num_classes: int, where: str) -> RegionTree:
    """Read and check a `regions` section against the run's domain; one error line if it is not a
    partition of that domain or a bound is malformed."""

    def bad(why: str) -> LucidError:
        return LucidError(f"{where}: the regions section {why}")

    if not isinstance(doc, dict) or doc.get("format") != REGIONS_FORMAT or not isinstance(doc.get("nodes"), list):
        raise bad(f"is not a {REGIONS_FORMAT} section")
    nodes = doc["nodes"]
    if not nodes or len(nodes) % 2 == 0:
        raise bad("must list the root and two children per split")
    tree = RegionTree(lower, upper, num_classes)
    by_id = {}
    for entry in nodes:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), int) or entry["id"] in by_id:
            raise bad("has a node without a unique integer id")
        by_id[entry["id"]] = entry
    if sorted(by_id) != list(range(len(nodes))):
        raise bad("must number its nodes 0..n-1")
    order = sorted((e for e in nodes if e.get("split") is not None), key=lambda e: _split_child(e, bad))
    for entry in order:
        split = entry["split"]
        try:
            left, right = split["left"], split["right"]
            if "box" in split:
                carved = (
                    np.asarray(split["box"]["lower"], dtype=np.float64),
                    np.asarray(split["box"]["upper"], dtype=np.float64),
                )
            else:
                feature, threshold = split["feature"], float(split["threshold"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"has a malformed split at node {entry['id']}") from None
        if ("box" not in split and (isinstance(feature, bool) or not isinstance(feature, int))) or entry["id"] >= len(
            tree
        ):
            raise bad(f"has a malformed split at node {entry['id']}")
        try:
            got = tree.carve(entry["id"], *carved) if "box" in split else tree.split(entry["id"], feature, threshold)
        except ValueError as exc:
            raise bad(f"is not a partition of the domain ({exc})") from None
        if got != (left, right):
            raise bad(f"numbers the children of node {entry['id']} out of order")
    if len(tree) != len(nodes):
        raise bad("has nodes that no split creates")
    for i, entry in by_id.items():
        bounds = entry.get("bounds")
        if not isinstance(bounds, dict):
            raise bad(f"has no bounds at node {i}")
        up = np.full(num_classes, np.inf)
        low = np.full(num_classes, -np.inf)
        for key, value in bounds.items():
            try:
                c = int(key)
            except ValueError:
                raise bad(f"has a class key {key!r} that is not an integer at node {i}") from None
            if not 0 <= c < num_classes or not isinstance(value, dict):
                raise bad(f"has a bound for an unknown class {key!r} at node {i}")
            up[c] = _read_number(value.get("upper"), np.inf, bad, i)
            low[c] = _read_number(value.get("lower"), -np.inf, bad, i)
            if value.get("residual") is not None:
                tree.residual[i][c] = ClassResidual.from_json(
                    value["residual"], f"{where}: the regions section's residual set of class {c} at node {i}"
                )
        tree.bound_upper[i] = up
        tree.bound_lower[i] = low
        tree.complete[i] = np.array(
            [bool((bounds.get(str(c)) or {}).get("complete", False)) for c in range(num_classes)]
        )
        tree.verified[i] = bool(entry.get("verified", False))
        tree.seconds[i] = float(entry.get("seconds", 0.0) or 0.0)
    for i, entry in by_id.items():  # the boxes it states must be the ones its splits make
        lo, hi = tree.box(i)
        try:
            same = np.array_equal(np.asarray(entry["lower"], float), lo) and np.array_equal(
                np.asarray(entry["upper"], float), hi
            )
        except (KeyError, TypeError, ValueError):
            same = False
        if not same:
            raise bad(f"states a box for node {i} that its splits of this run's domain do not make")
    # A child's bound is capped by its parent's when it is recorded; re-apply the cap so a
    # hand-edited file can only make the served bounds smaller-or-equal to what is sound.
    for i in range(1, len(tree)):
        tree.bound_upper[i] = np.minimum(tree.bound_upper[i], tree.bound_upper[tree.parent[i]])
    return tree


def _split_child(entry: dict, bad) -> int:
    split = entry["split"]
    if not isinstance(split, dict) or not isinstance(split.get("left"), int):
        raise bad(f"has a malformed split at node {entry.get('id')}")
    return split["left"]


def _read_number(value: Any, missing: float, bad, node: int) -> float:
    if value is None:
        return missing
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"has a bound that is not a finite number or null at node {node}")
    return float(value)
