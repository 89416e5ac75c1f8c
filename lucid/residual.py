"""Residual sets (`lucid verify --residual M`): the few networks checked at query time.

Per class c the verification keeps R_c, the M networks with the largest proven bounds, and the
level L_c, the next largest (lucid/bab/order_statistic.py): L_c >= beta*_{c,{j}} for every j
outside R_c. An input
that N labels c is released iff its confidence is above L_c (plus N's float error, as for beta_c)
and every network of R_c labels it c too (`lucid.access.residual_check`); docs/guarantee.md
proves that a release still means that all |D| + 1 networks agree.

Stored in the run directory as (docs/formats.md, `lucid-residual/1`):
  * bounds.json's "residual" section: the format, M, the parameter file's name and sha256, and per
    class its level, positions, removed rows and the proven bounds of its members;
  * `residual-<sha256 prefix>.safetensors`: the union of the sets' networks, with the tensors and
    dtypes of networks.safetensors (so it is read by the same `stack_from_tensors`). Its name
    carries its digest, so a new verification never overwrites the file an older bounds.json
    names; `lucid.rundir.write_bounds` removes stale ones once the new bounds.json is in place.
The reader refuses a missing, altered, foreign or non-finite file in one line: a run that says
"residual" is never served by another rule.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from lucid.atomic import write_atomic
from lucid.errors import LucidError
from lucid.network import NetworkFile, NetworkStack, stack_from_tensors
from lucid.rundir import bound_entry_value

RESIDUAL_FORMAT = "lucid-residual/1"


@dataclass(frozen=True)
class ClassResidual:
    """One class's residual set: its level L_c (+inf: nothing proved) and members."""

    level: float
    positions: np.ndarray  # [m] positions in networks.safetensors, ascending
    bounds: np.ndarray  # [m] the members' proven bounds (sound, what M = 0 would have to cover)

    @property
    def highest(self) -> float:
        """The largest bound of the class over every network: max(L_c, the members' bounds)."""
        return max([self.level, *self.bounds.tolist()])

    def to_json(self) -> dict[str, Any]:
        return {
            "level": bound_entry_value(self.level, upper=True),
            "positions": [int(p) for p in self.positions],
            "bounds": [bound_entry_value(b, upper=True) for b in self.bounds],
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ClassResidual:
        """Read `to_json`'s form (a region's set, lucid/regions/tree.py); one-line LucidError otherwise."""
        if not isinstance(obj, dict):
            raise LucidError(f"{where} must be an object with level, positions and bounds")
        positions, bounds = obj.get("positions"), obj.get("bounds")
        if (
            not isinstance(positions, list)
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in positions)
            or positions != sorted(set(positions))
        ):
            raise LucidError(f"{where}: positions must be ascending network positions >= 1")
        if not isinstance(bounds, list) or len(bounds) != len(positions):
            raise LucidError(f"{where}: bounds must list one bound per position")
        return cls(
            _level(obj.get("level"), f"{where}: the level"),
            np.asarray(positions, dtype=np.int64),
            np.array([_level(b, f"{where}: a bound") for b in bounds], dtype=np.float64),
        )


@dataclass(frozen=True)
class ResidualSets:
    """What the access layer serves: the levels, and the union of the residual networks."""

    size: int  # M
    levels: np.ndarray  # [C] L_c; +inf for a class without a proved level
    members: np.ndarray  # [C, K] bool: network k of `stack` belongs to R_c
    stack: NetworkStack  # the union's K networks, float64, ascending position
    positions: np.ndarray  # [K]
    digest: str  # sha256 of the parameter file: which networks the memo's answers were checked by


def split_off(bounds: np.ndarray, positions: np.ndarray, size: int) -> ClassResidual:
    """A class's residual set and level from sound per-network bounds alone (a box that got only
    its screen): the `size` highest bounds of `positions` are set aside, the largest of the rest
    is the level (-inf when nothing is left outside)."""
    members = residual_members(bounds, positions, size)
    rest = np.setdiff1d(positions, members, assume_unique=True)
    level = float(bounds[rest].max()) if len(rest) else -math.inf
    return ClassResidual(level, members, bounds[members].astype(np.float64))


def residual_members(screen: np.ndarray, positions: np.ndarray, size: int) -> np.ndarray:
    """A class's residual set: the `size` networks of `positions` with the highest screened bounds
    (ties by position), sorted; a network screened harmless (bound -inf) never takes a place."""
    candidates = positions[screen[positions] > -math.inf]
    order = np.lexsort((candidates, -screen[candidates]))
    return np.sort(candidates[order[:size]])


def write_residual(
    run_dir: str | Path, classes: dict[int, ClassResidual], size: int, boxes: Iterable[ClassResidual] = ()
) -> dict:
    """Write the union's parameter file and return bounds.json's "residual" section (write that after).
    `classes`: the domain's sets; `boxes`: the sets of the region boxes (`--regions`), whose
    networks the file holds too."""
    run_dir = Path(run_dir)
    union = np.unique(np.concatenate([r.positions for r in (*classes.values(), *boxes)] + [np.zeros(0, np.int64)]))
    source = NetworkFile(run_dir)
    parts = [source.tensors(int(p), int(p) + 1) for p in union]
    names = sorted(parts[0]) if parts else ["removed"]
    tensors = {
        name: np.ascontiguousarray(np.concatenate([t[name] for t in parts])) if parts else np.zeros(0, np.int64)
        for name in names
    }
    blob = save(tensors, metadata={"format": RESIDUAL_FORMAT})
    digest = hashlib.sha256(blob).hexdigest()
    name = f"residual-{digest[:16]}.safetensors"

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(blob)

    write_atomic(run_dir / name, write)
    return {
        "format": RESIDUAL_FORMAT,
        "size": int(size),
        "file": name,
        "sha256": digest,
        "networks": [int(p) for p in union],
        "classes": {
            str(c): {**r.to_json(), "rows": [int(source.removed[p]) for p in r.positions]}
            for c, r in sorted(classes.items())
        },
    }


def _level(value: Any, where: str) -> float:
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LucidError(f"{where} must be a finite number or null")
    return float(value)


def read_residual(run_dir: str | Path, section: Any, num_classes: int, meta: dict, where: str) -> ResidualSets:
    """Check bounds.json's "residual" section and load its networks; one-line LucidError otherwise."""
    run_dir = Path(run_dir)
    if not isinstance(section, dict) or section.get("format") != RESIDUAL_FORMAT:
        raise LucidError(f"{where}: the residual section is not {RESIDUAL_FORMAT}")
    size, name, digest, entries = (section.get(k) for k in ("size", "file", "sha256", "classes"))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise LucidError(f"{where}: the residual size must be a whole number >= 1")
    if (
        not isinstance(name, str)
        or Path(name).name != name
        or not name.startswith("residual-")
        or not isinstance(digest, str)
        or not isinstance(entries, dict)
    ):
        raise LucidError(f"{where}: the residual section is malformed (file, sha256, classes)")
    levels = np.full(num_classes, np.inf)
    sets: dict[int, np.ndarray] = {}
    for key, entry in entries.items():
        cls = int(key) if isinstance(key, str) and key.isdigit() else -1
        if not 0 <= cls < num_classes:
            raise LucidError(f"{where}: residual class {key!r} is not a class of this run")
        residual = ClassResidual.from_json(entry, f"{where}: class {cls}'s residual set")
        if len(residual.positions) > size:
            raise LucidError(f"{where}: class {cls}'s residual set holds more than {size} networks")
        levels[cls], sets[cls] = residual.level, residual.positions
    union = np.unique(np.concatenate(list(sets.values()) + [np.zeros(0, np.int64)]))
    networks = section.get("networks")
    if networks is not None:  # the file also holds the region boxes' sets
        if (
            not isinstance(networks, list)
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in networks)
            or networks != sorted(set(networks))
            or not np.isin(union, networks).all()
        ):
            raise LucidError(f"{where}: the residual networks must be ascending positions holding every class's set")
        union = np.asarray(networks, dtype=np.int64)
    stack, positions = _load_networks(run_dir, name, digest, meta, union, where)
    members = np.stack([np.isin(positions, sets.get(c, np.zeros(0, np.int64))) for c in range(num_classes)])
    return ResidualSets(size, levels, members, stack, positions, digest)


def _load_networks(
    run_dir: Path, name: str, digest: str, meta: dict, union: np.ndarray, where: str
) -> tuple[NetworkStack, np.ndarray]:
    """The union's networks from the parameter file, checked against its digest and against the
    run's own networks at the same positions (another run's file is refused, not served)."""
    path = run_dir / name
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise LucidError(f"{path} is missing ({where} names it): run `lucid verify --residual` again") from None
    except OSError as exc:
        raise LucidError(f"cannot read {path}: {exc}") from None
    if hashlib.sha256(blob).hexdigest() != digest:
        raise LucidError(f"{path} is not the file {where} was written with (truncated or altered)")
    try:
        tensors = load(blob)
    except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types)
        raise LucidError(f"cannot read {path}: {exc}") from None
    own = NetworkFile(run_dir, meta)
    if len(union) and union[-1] >= len(own):
        raise LucidError(f"{where}: a residual position is beyond the run's {len(own) - 1} networks")
    rows = tensors.get("removed")
    if rows is None or len(rows) != len(union) or not np.array_equal(rows, own.removed[union]):
        raise LucidError(f"{path} does not hold this run's residual networks")
    for i, p in enumerate(union):
        theirs = own.tensors(int(p), int(p) + 1)
        if sorted(theirs) != sorted(tensors) or any(
            not np.array_equal(tensors[k][i : i + 1], theirs[k]) for k in theirs
        ):
            raise LucidError(
                f"{path} does not hold this run's residual networks (network at position {int(p)} differs)"
            )
    if not len(union):
        return NetworkStack([np.zeros((0, 1, 1))], [np.zeros((0, 1))], np.zeros(0, np.int64)), union
    return stack_from_tensors(tensors, meta.get("architecture", {}), int(meta["input_dim"])), union
