"""Residual sets per region box (`lucid verify --regions K --residual M`): each box's level against
the exact per-network bounds over its box, every release replayed exactly through all networks,
the same work for the three outcomes, and the reader's refusals."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from bab_fixtures import write_tiny_run
from exact_oracle import exact_singleton
from release_probes import (assert_four_outcomes_do_the_same_work, class_margin, crossings,
                            released_rows_agree_exactly)
from lucid.access import ClassifierOptions, LabelOnlyClassifier
from lucid.verify import verify_run
from lucid.errors import LucidError
from lucid.network import load_networks
from lucid.regions import RegionTree
from lucid.regions.reader import read_regions
from lucid.residual import ClassResidual, split_off

M = 2


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> Path:
    run = write_tiny_run(tmp_path_factory.mktemp("regions_residual") / "run", networks=10, classes=3, seed=6,
                         spread=(0.01, 0.03, 0.08))
    verify_run(run, residual=M, regions=6, time_limit=60, workers=1, progress=False, split_time=0)
    return run


def _doc(run: Path) -> dict:
    return json.loads((run / "bounds.json").read_text())


def _tree(run: Path) -> RegionTree:
    return read_regions(_doc(run)["regions"], np.zeros(2), np.ones(2), 3, "bounds.json")


def _net(stack, j):
    return [w[j] for w in stack.weights], [b[j] for b in stack.biases]


def test_each_box_level_bounds_every_network_outside_its_set_over_the_box(verified):
    stack = load_networks(verified)
    tree = _tree(verified)
    release = tree.release_bounds()
    checked = 0
    for node in range(len(tree)):
        lo, hi = tree.box(node)
        for c, found in tree.residual[node].items():
            assert len(found.positions) <= M
            betas = {j: exact_singleton(_net(stack, 0), _net(stack, j), c, lo, hi)[0] for j in range(1, len(stack))}
            outside = [b for j, b in betas.items() if j not in set(found.positions.tolist()) and b is not None]
            if outside:
                assert Fraction(release[node, c]) >= max(outside), (node, c)
            for j, bound in zip(found.positions.tolist(), found.bounds.tolist()):  # members' stored bounds are sound
                assert betas[j] is None or Fraction(bound) >= betas[j]
            checked += 1
    assert checked >= 3 * len(tree.leaves())
    # not vacuous: boxes choose sets of their own, and some box's level is below the domain's
    root = tree.residual[0]
    assert any(not np.array_equal(tree.residual[i][c].positions, root[c].positions)
               for i in tree.leaves() for c in tree.residual[i])
    assert (release[tree.leaves()] < release[0]).any()


def test_every_release_agrees_with_all_networks_exactly_also_at_one_ulp_from_each_box_level(verified):
    stack = load_networks(verified)
    clf = LabelOnlyClassifier.from_run(verified, epsilon=1.0)
    assert clf.rule == "regions+residual"
    xs = np.random.default_rng(0).random((300, 2))
    points = [_near_some_boundary(stack, np.random.default_rng(1).random((5000, 2)), clf)]
    n_conf = lambda x: class_margin(stack, 0, x, clf.decide(x)[0])  # noqa: E731
    tree = clf.regions
    for level in np.unique(tree.release_bounds()[tree.leaves()]):
        if np.isfinite(level):
            points += crossings(n_conf, xs[:60], float(level) + clf.confidence_error)
    members = np.unique(np.concatenate([r.positions for r in tree.residual_sets()]))
    for j in members:  # a member's own decision boundary
        points += crossings(lambda x, j=int(j): class_margin(stack, j, x, clf.decide(x)[0]), xs[:60], 0.0)
    # and the random rows: near the levels the members (leakers moved in by the rounds among them)
    # often disagree, so the probes alone may release nothing
    allx = np.vstack([*points, xs])
    released = released_rows_agree_exactly(clf, stack, allx)
    assert released > 50
    # per-box sets release more than the domain's bounds alone, and the check does work
    noised = clf.decide(xs)[1]
    assert noised.sum() < clf.with_global_bounds().decide(xs)[1].sum()
    leaves = clf._lookup.locate(xs)
    cls = clf.decide(xs)[0]
    above = class_margin(stack, 0, xs, cls) > clf.region_thresholds[leaves, cls]
    assert (above & noised).any()


def _near_some_boundary(stack, xs: np.ndarray, clf) -> np.ndarray:
    """The rows where some network's float margin for N's label is below 1e-6: the only ones whose
    exact replay can disagree (these networks' float error is far below that)."""
    cls = clf.decide(xs)[0]
    close = np.zeros(len(xs), dtype=bool)
    for j in range(len(stack)):
        close |= class_margin(stack, j, xs, cls) <= 1e-6
    return xs[close]


def test_released_by_level_by_check_and_noised_do_the_same_work(verified):
    stack = load_networks(verified)
    probe = LabelOnlyClassifier.from_run(verified, epsilon=0.0)
    xs = np.random.default_rng(9).random((3000, 2))
    cls, noised = probe.decide(xs)
    leaves = probe._lookup.locate(xs)
    sets = probe.regions.residual
    top = np.array([max(sets[leaf][c].bounds.tolist(), default=-np.inf) if c in sets[leaf] else -np.inf
                    for leaf, c in zip(leaves.tolist(), cls.tolist())])  # the box's members' highest bound
    assert_four_outcomes_do_the_same_work(
        lambda: LabelOnlyClassifier.from_run(verified, epsilon=0.0, options=ClassifierOptions(seed=0)),
        xs, noised, class_margin(stack, 0, xs, cls), probe.region_thresholds[leaves, cls], top)


def test_a_row_is_checked_by_the_set_of_its_own_box(verified, tmp_path):
    """A leaf whose set is one network outside the domain's set, with a level that releases every
    input: the leaf's rows that this network labels otherwise are noised, the others released."""
    run = _copy(verified, tmp_path)
    doc = _doc(run)
    tree = _tree(run)
    stack = load_networks(run)
    xs = np.random.default_rng(4).random((4000, 2))
    cls, leaves = LabelOnlyClassifier.from_run(run, epsilon=1.0).decide(xs)[0], tree.locate(xs)
    counts = {(leaf, c, j): (int((class_margin(stack, j, xs[here], cls[here]) < 0).sum()), int(here.sum()))
              for leaf in tree.leaves() for c in range(3)
              if (here := (leaves == leaf) & (cls == c)).any()
              for j in doc["residual"]["networks"] if j not in doc["residual"]["classes"][str(c)]["positions"]}
    mixed = {key: d for key, (d, n) in counts.items() if 0 < d < n}  # it disagrees on some rows, not all
    leaf, c, j = max(mixed, key=mixed.get)
    xs, cls = xs[(leaves == leaf) & (cls == c)], cls[(leaves == leaf) & (cls == c)]
    doc["regions"]["nodes"][leaf]["bounds"][str(c)]["residual"] = {"level": -1.0, "positions": [j], "bounds": [1.0]}
    (run / "bounds.json").write_text(json.dumps(doc))
    noised = LabelOnlyClassifier.from_run(run, epsilon=1.0).decide(xs)[1]
    disagrees = class_margin(stack, j, xs, cls) < 0
    assert disagrees.any() and (~disagrees).any()
    assert np.array_equal(noised, disagrees | (np.abs(class_margin(stack, j, xs, cls)) < 1e-9))


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _damage_set_outside_the_file(doc: dict) -> None:
    outside = sorted(set(range(1, 11)) - set(doc["residual"]["networks"]))
    leaf = next(n for n in doc["regions"]["nodes"] if n["split"] is None)
    leaf["bounds"]["0"]["residual"] = {"level": 0.0, "positions": outside[:1], "bounds": [1.0]}


def _damage_too_many(doc: dict) -> None:
    leaf = next(n for n in doc["regions"]["nodes"] if n["split"] is None)
    networks = doc["residual"]["networks"][: M + 1]
    leaf["bounds"]["0"]["residual"] = {"level": 0.0, "positions": networks, "bounds": [1.0] * len(networks)}


def _damage_no_residual_section(doc: dict) -> None:
    del doc["residual"]


def _damage_unsorted_set(doc: dict) -> None:
    leaf = next(n for n in doc["regions"]["nodes"] if n["split"] is None and "residual" in n["bounds"]["1"])
    leaf["bounds"]["1"]["residual"]["positions"] = leaf["bounds"]["1"]["residual"]["positions"][::-1]


@pytest.mark.parametrize("damage,message", [
    (_damage_set_outside_the_file, "names a network the residual file does not hold"),
    (_damage_too_many, f"holds more than {M} networks"),
    (_damage_no_residual_section, "has residual sets but there is no residual section"),
    (_damage_unsorted_set, "positions must be ascending")])
def test_a_region_set_the_run_does_not_back_is_refused_in_one_line(verified, tmp_path, damage, message):
    run = _copy(verified, tmp_path)
    doc = _doc(run)
    damage(doc)
    (run / "bounds.json").write_text(json.dumps(doc))
    with pytest.raises(LucidError, match=message):
        LabelOnlyClassifier.from_run(run, epsilon=1.0)


def test_a_box_keeps_the_lower_of_its_inherited_and_its_own_level_capped_by_the_parent_bound():
    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    tree.bound_upper[0] = np.array([0.5, 0.5])
    tree.record_residual(0, 0, ClassResidual(0.3, np.array([4, 7]), np.array([0.5, 0.4])))
    left, right = tree.split(0, 0, 0.5)
    assert tree.residual[left][0].level == 0.3  # inherited: sound over any sub-box
    tree.record_residual(left, 0, ClassResidual(0.4, np.array([2]), np.array([0.45])))
    assert tree.residual[left][0].positions.tolist() == [4, 7]  # its own level is higher: the parent's set stays
    tree.record_residual(right, 0, ClassResidual(0.1, np.array([2]), np.array([0.45])))
    assert tree.residual[right][0].positions.tolist() == [2]
    tree.record_residual(right, 1, ClassResidual(0.9, np.array([1]), np.array([0.95])))
    assert tree.residual[right][1].level == 0.5  # capped by the parent's bound over every network
    again = read_regions(tree.to_json(), np.zeros(2), np.ones(2), 2, "here")
    assert again.sets_digest() == tree.sets_digest()
    assert np.array_equal(again.release_bounds(), tree.release_bounds())


def test_a_screened_box_sets_aside_its_m_highest_and_its_level_is_the_largest_of_the_rest():
    bounds = np.array([-np.inf, 0.3, -np.inf, 0.9, 0.1, 0.9, 0.5])  # position 0 is N
    positions = np.arange(1, 7)
    found = split_off(bounds, positions, 2)
    assert found.positions.tolist() == [3, 5] and found.level == 0.5 and found.bounds.tolist() == [0.9, 0.9]
    everything = split_off(bounds, positions, 6)  # networks screened harmless never take a place
    assert everything.positions.tolist() == [1, 3, 4, 5, 6] and everything.level == -np.inf
