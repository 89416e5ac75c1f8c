"""The release rule of a served run: which rows N's label is released for, built once from bounds.json.

A row whose N label is c, with confidence (score margin) conf, is released if conf exceeds the
threshold the verifier proved for it, and noised otherwise (`lucid.analysis.soundness`: a bound
plus N's float error). What bounds.json holds decides where that threshold comes from:

    rule                class               threshold of a row                 and
    global              `ClassBounds`       beta_c                              -
    regions             `BoxBounds`         beta_c of the row's box (its leaf)  -
    residual            `ResidualLevels`    the level L_c                       R_c agrees (residual_check.py)
    regions+residual    `BoxResidualLevels` the level of the row's box          the box's R_c agrees

`from_bounds` picks the rule once, when the classifier is built; the classifier then
asks `rule.must_noise(...)` for every batch without knowing which rule it holds.

Equal work: whether a row is released or noised is the bit the iDP guarantee does not cover, so
no rule branches on it. Each rule does the same work for every row of a batch: every row's leaf is
found by a walk of the same length (lucid/regions/lookup.py), every row's threshold is read, and
with residual sets every row is checked against every network of the union and both verdicts are
combined for every row (lucid/access/residual_check.py). Which rule a service holds is public
(it is the run's bounds.json), so choosing it once is no side channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from lucid.access.mechanism import needs_noise
from lucid.access.memo import BoundsRecord
from lucid.access.residual_check import ResidualCheck
from lucid.analysis.soundness import release_thresholds
from lucid.dynamic_range import check_network_range
from lucid.regions import RegionTree
from lucid.regions.lookup import RegionLookup
from lucid.residual import ResidualSets


class ReleaseRule(Protocol):
    """Which rows are noised (module docstring). A rule names the bounds its answers are given under
    (`served`, which the memo records and checks on every restart) and holds the tables it compares
    with; the parts a rule has no use for are None."""

    @property
    def name(self) -> str:
        """The rule's name: "global", "regions", "residual" or "regions+residual"."""

    @property
    def served(self) -> BoundsRecord: ...

    @property
    def regions(self) -> RegionTree | None:
        """The partition (--regions)."""

    @property
    def lookup(self) -> RegionLookup | None:
        """The partition's fixed-depth walk, input -> leaf."""

    @property
    def box_thresholds(self) -> np.ndarray | None:
        """[nodes, C]: each box's release threshold per class (with residual sets, of its level)."""

    @property
    def residual(self) -> ResidualCheck | None:
        """The residual networks' check (--residual)."""

    @property
    def levels(self) -> np.ndarray | None:
        """L_c per class over the whole domain (--residual; the report's Fig. 6 draws them)."""

    @property
    def level_thresholds(self) -> np.ndarray | None:
        """[C]: the release thresholds of the levels."""

    def must_noise(self, xn: np.ndarray, classes: np.ndarray, confidences: np.ndarray) -> np.ndarray:
        """[B] bool: the rows of in-domain network-space inputs `xn` (N's `classes`, with its
        `confidences`) whose label must be noised, the same work for every row."""


def from_bounds(
    bounds: np.ndarray,
    regions: RegionTree | None,
    residual: ResidualSets | None,
    confidence_error: float,
    lower: np.ndarray,
    upper: np.ndarray,
    source: str,
) -> ReleaseRule:
    """The rule of bounds.json's sections (`lucid.access.served_run.load_bounds`): beta_c per class,
    the per-box bounds of `--regions` and the residual sets of `--residual` (each None when absent).
    Released only above a bound plus N's float error `confidence_error` over the domain
    [lower, upper]; `source` names the run in messages (a residual network whose range over the
    domain is not representable is refused, as N is)."""
    if residual is None:
        if regions is None:
            return ClassBounds(release_thresholds(bounds, confidence_error), BoundsRecord(bounds))
        release = regions.release_bounds()
        return BoxBounds(
            regions,
            regions.lookup_arrays(),
            release_thresholds(release, confidence_error),
            BoundsRecord(release, regions.digest()),
        )
    for k in range(len(residual.positions)):
        check_network_range(
            [w[k] for w in residual.stack.weights],
            [b[k] for b in residual.stack.biases],
            lower,
            upper,
            f"{source}: residual network at position {residual.positions[k]}",
        )
    check = ResidualCheck(residual, lower, upper, regions)
    levels, level_thresholds = residual.levels, release_thresholds(residual.levels, confidence_error)
    # The memo's record names the residual file, so answers checked by other networks are refused.
    if regions is None:
        return ResidualLevels(check, levels, level_thresholds, BoundsRecord(levels, f"residual:{residual.digest}"))
    release = regions.release_bounds()  # with residual sets, the boxes' levels
    return BoxResidualLevels(
        regions,
        regions.lookup_arrays(),
        release_thresholds(release, confidence_error),
        check,
        levels,
        level_thresholds,
        BoundsRecord(release, f"residual:{residual.digest}:{regions.digest()}:{regions.sets_digest()}"),
    )


@dataclass(frozen=True)
class ClassBounds:
    """Released above beta_c, one bound per class over the whole domain (also `lucid evaluate`'s
    side-by-side comparison of the other rules)."""

    name: ClassVar[str] = "global"
    regions: ClassVar[None] = None
    lookup: ClassVar[None] = None
    box_thresholds: ClassVar[None] = None
    residual: ClassVar[None] = None
    levels: ClassVar[None] = None
    level_thresholds: ClassVar[None] = None
    thresholds: np.ndarray  # [C]
    served: BoundsRecord

    def must_noise(self, xn: np.ndarray, classes: np.ndarray, confidences: np.ndarray) -> np.ndarray:
        return needs_noise(confidences, classes, self.thresholds)


@dataclass(frozen=True)
class BoxBounds:
    """Released above the bound of the row's box: its leaf's (lucid/regions/tree.py), found by a walk
    of the same length for every input; rows of non-leaf nodes are never selected."""

    name: ClassVar[str] = "regions"
    residual: ClassVar[None] = None
    levels: ClassVar[None] = None
    level_thresholds: ClassVar[None] = None
    regions: RegionTree
    lookup: RegionLookup
    box_thresholds: np.ndarray
    served: BoundsRecord

    def must_noise(self, xn: np.ndarray, classes: np.ndarray, confidences: np.ndarray) -> np.ndarray:
        return needs_noise(confidences, classes, self.box_thresholds[self.lookup.locate(xn)])


@dataclass(frozen=True)
class ResidualLevels:
    """Released above the level L_c when every residual network of R_c agrees with N (lucid.residual)."""

    name: ClassVar[str] = "residual"
    regions: ClassVar[None] = None
    lookup: ClassVar[None] = None
    box_thresholds: ClassVar[None] = None
    residual: ResidualCheck
    levels: np.ndarray
    level_thresholds: np.ndarray
    served: BoundsRecord

    def must_noise(self, xn: np.ndarray, classes: np.ndarray, confidences: np.ndarray) -> np.ndarray:
        noised = needs_noise(confidences, classes, self.level_thresholds)
        noised |= ~self.residual.agree(xn, classes)  # both terms for every row: no branch on the answer
        return noised


@dataclass(frozen=True)
class BoxResidualLevels:
    """Released above the level of the row's box when every residual network of that box's R_c agrees."""

    name: ClassVar[str] = "regions+residual"
    regions: RegionTree
    lookup: RegionLookup
    box_thresholds: np.ndarray  # the boxes' levels
    residual: ResidualCheck
    levels: np.ndarray  # L_c per class over the whole domain
    level_thresholds: np.ndarray
    served: BoundsRecord

    def must_noise(self, xn: np.ndarray, classes: np.ndarray, confidences: np.ndarray) -> np.ndarray:
        leaves = self.lookup.locate(xn)
        noised = needs_noise(confidences, classes, self.box_thresholds[leaves])
        noised |= ~self.residual.agree(xn, classes, leaves)  # both terms for every row: no branch on the answer
        return noised
