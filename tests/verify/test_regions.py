"""Region-wise decision bounds (`lucid verify --regions K`, lucid/regions/tree.py, lucid/verify/regions.py).

The oracle: on tiny 2-D runs the exact beta*_{c,{i}} of every network over every box is computed
by polygon enumeration (tests/helpers/bruteforce.py, no code shared with lucid), and every verified box's
upper bound must be >= the largest of them; every released input must agree with all networks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bab_fixtures import write_tiny_run
from bruteforce import exact_for

from lucid.access.classifier import ClassifierOptions, LabelOnlyClassifier
from lucid.access.evaluate import leaking_set
from lucid.access.memo import Memo
from lucid.analysis.problem import VerificationProblem
from lucid.verify import verify_run
from lucid.errors import LucidError
from lucid.regions import MAX_DEPTH, RegionTree
from lucid.regions.one_box import BoxVerifier
from lucid.regions.reader import read_regions
from lucid.rundir import open_run


def random_tree(seed: int, d: int = 3, splits: int = 12, classes: int = 2) -> RegionTree:
    rng = np.random.default_rng(seed)
    tree = RegionTree(np.zeros(d), np.ones(d), classes)
    for _ in range(splits):
        leaf = int(rng.choice(tree.leaves()))
        lo, hi = tree.box(leaf)
        if rng.random() < 0.3:  # a carve, its sides on the grid, often on the box's own faces
            a = np.where(rng.random(d) < 0.5, lo, np.round(lo + (hi - lo) * rng.uniform(0, 0.4, d), 3))
            b = np.where(rng.random(d) < 0.5, hi, np.round(hi - (hi - lo) * rng.uniform(0, 0.4, d), 3))
            a, b = np.maximum(a, lo), np.minimum(b, hi)
            if np.all(a <= b) and not (np.array_equal(a, lo) and np.array_equal(b, hi)):
                tree.carve(leaf, a, b)
            continue
        f = int(rng.integers(d))
        if hi[f] - lo[f] < 1e-6:
            continue
        # thresholds on a coarse grid, so that test points can sit exactly on them
        t = float(np.round(lo[f] + (hi[f] - lo[f]) * rng.uniform(0.2, 0.8), 3))
        if lo[f] < t < hi[f]:
            tree.split(leaf, f, t)
    for i in range(len(tree)):  # parents come before their children: caps apply in order
        own = rng.uniform(0, 1, classes)
        tree.bound_upper[i] = own if i == 0 else np.minimum(own, tree.bound_upper[tree.parent[i]])
    return tree


# --- the partition ----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_every_point_boundaries_included_reaches_exactly_one_leaf_whose_box_holds_it(seed):
    tree = random_tree(seed)
    rng = np.random.default_rng(100 + seed)
    X = rng.random((3000, 3))
    # points exactly on every threshold plane, and on the domain's faces and corners
    planes = [(tree.feature[i], tree.threshold[i]) for i in range(len(tree)) if tree.feature[i] >= 0]
    planes += [(f, side[f]) for i, box in tree.carved.items() for side in box for f in range(3)]
    assert tree.carved  # the seeds make carves too
    for k, (f, t) in enumerate(planes[:140]):
        X[k * 20:(k + 1) * 20, f] = t
    X[-8:] = np.array(np.meshgrid([0, 1], [0, 1], [0, 1])).reshape(3, -1).T
    leaf = tree.locate(X)
    leaves = set(tree.leaves())
    assert set(leaf.tolist()) <= leaves
    # exactly one: the half-open boxes (x >= threshold goes right) of the leaves are disjoint and
    # cover the domain; recompute membership independently from the boxes and the rule
    member = np.zeros((len(X), len(tree)), dtype=bool)
    for i in leaves:
        inside = np.ones(len(X), dtype=bool)
        node = i
        while tree.parent[node] >= 0:
            p = tree.parent[node]
            if p in tree.carved:
                a, b = tree.carved[p]
                within = np.all((X >= a) & (X <= b), axis=1)
                inside &= within if node == tree.children[p][1] else ~within
            else:
                f, t = tree.feature[p], tree.threshold[p]
                inside &= (X[:, f] >= t) if node == tree.children[p][1] else (X[:, f] < t)
            node = p
        member[:, i] = inside
        lo, hi = tree.box(i)
        assert np.all((X[leaf == i] >= lo) & (X[leaf == i] <= hi))  # the verified closed box holds it
    assert (member.sum(axis=1) == 1).all()
    assert (member[np.arange(len(X)), leaf]).all()
    # one row at a time (the single-query path) gives the same leaves
    assert all(tree.locate(X[k:k + 1])[0] == leaf[k] for k in range(0, len(X), 37))


def test_lookup_walks_the_same_number_of_steps_for_every_leaf():
    tree = random_tree(3)
    lookup = tree.lookup_arrays()
    depths = {tree.depth_of(i) for i in tree.leaves()}
    assert len(depths) > 1 and lookup.depth == max(depths)
    # a leaf's children are itself: walking further never leaves it, so a shallow leaf costs
    # the same `depth` steps as the deepest one
    for i in tree.leaves():
        assert tuple(lookup.children[i]) == (i, i) and math.isinf(lookup.threshold[i])


def test_split_rules_and_bound_caps():
    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    with pytest.raises(ValueError):
        tree.split(0, 0, 1.0)  # on the box's face: not inside
    with pytest.raises(ValueError):
        tree.split(0, 2, 0.5)  # no such feature
    tree.record(0, np.array([0.5, 0.2]), np.array([0.1, -np.inf]))
    left, right = tree.split(0, 0, 0.5)
    assert np.array_equal(tree.bound_upper[left], [0.5, 0.2])  # starts from the parent's bound
    tree.record(left, np.array([0.9, 0.1]), np.array([0.3, 0.05]))  # a child cannot exceed its parent
    assert np.array_equal(tree.bound_upper[left], [0.5, 0.1])
    assert tree.bound_lower[0][0] == 0.3 and tree.bound_lower[0][1] == 0.05  # a leak is the parent's too
    assert np.array_equal(tree.leaf_upper(), [0.5, 0.2])
    node = 0
    for _ in range(MAX_DEPTH):
        lo, hi = tree.box(node)
        node = tree.split(node, 1, float(lo[1] + (hi[1] - lo[1]) / 2))[0] if tree.is_leaf(node) else \
            tree.children[node][0]
    with pytest.raises(ValueError):
        tree.split(node, 1, float(np.mean(tree.box(node)[0][1] + tree.box(node)[1][1]) / 2))


def test_a_box_verified_again_caps_every_box_below_it():
    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    none = np.full(2, -np.inf)
    tree.record(0, np.array([2.0, 1.0]), none)
    left, right = tree.split(0, 0, 0.5)
    rest, carved = tree.carve(right, np.array([0.6, 0.1]), np.array([0.9, 0.4]))
    tree.record(carved, np.array([0.5, 0.3]), none)
    tree.record(0, np.array([1.5, 0.2]), none)  # the root's branch-and-bound, continued later
    assert [tree.bound_upper[i].tolist() for i in (left, right, rest, carved)] == [
        [1.5, 0.2], [1.5, 0.2], [1.5, 0.2], [0.5, 0.2]]


def test_a_cut_short_box_is_continued_for_the_noised_points_of_the_leaves_verified_over_it():
    from lucid.regions.choice import box_owner, box_to_continue

    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    rest, carved = tree.carve(0, np.array([0.5, 0.5]), np.array([0.9, 0.9]))
    rest2, carved2 = tree.carve(rest, np.array([0.0, 0.0]), np.array([0.2, 0.2]))
    assert [box_owner(tree, i) for i in (rest2, carved2, carved)] == [0, carved2, carved]
    points = np.array([[0.3, 0.1], [0.1, 0.9], [0.4, 0.4], [0.6, 0.6], [0.7, 0.7], [0.8, 0.8], [0.1, 0.1]])
    classes = np.array([1, 0, 1, 1, 1, 0, 1])
    noised = np.array([True, True, True, True, True, True, True])
    leaf_of = tree.locate(points)
    # the rest of both carves is verified over the domain: its points count for the root
    assert box_to_continue(tree, leaf_of, noised, classes, {0: {0, 1}}) == (0, [0, 1], 1)
    # a box with more noised points of classes cut short goes first; only those classes continue
    assert box_to_continue(tree, leaf_of, noised, classes, {0: {0}, carved: {1}}) == (carved, [1], 2)
    assert box_to_continue(tree, leaf_of, noised & (leaf_of != rest2), classes, {0: {0, 1}}) is None
    assert box_to_continue(tree, leaf_of, noised, classes, {carved2: {0, 1}}) == (carved2, [1], 1)


def test_json_round_trip_and_one_line_refusals():
    tree = random_tree(1)
    doc = json.loads(json.dumps(tree.to_json()))
    back = read_regions(doc, np.zeros(3), np.ones(3), 2, "bounds.json")
    assert back.digest() == tree.digest()
    assert all(np.array_equal(a, b) for a, b in zip(back.bound_upper, tree.bound_upper))
    X = np.random.default_rng(0).random((500, 3))
    assert np.array_equal(back.locate(X), tree.locate(X))

    def refused(mutate, domain=(np.zeros(3), np.ones(3))) -> str:
        bad = json.loads(json.dumps(doc))
        mutate(bad)
        with pytest.raises(LucidError) as err:
            read_regions(bad, *domain, 2, "bounds.json")
        assert "\n" not in str(err.value)
        return str(err.value)

    split_node = next(n for n in doc["nodes"] if n["split"])
    assert "partition" in refused(lambda d: d["nodes"][split_node["id"]]["split"].update(threshold=7.0))
    assert "box" in refused(lambda d: None, domain=(np.zeros(3), np.full(3, 2.0)))  # another domain
    assert "finite" in refused(lambda d: d["nodes"][0]["bounds"]["0"].update(upper="inf"))
    assert "lucid-regions/1" in refused(lambda d: d.update(format="lucid-regions/0"))
    assert "0..n-1" in refused(lambda d: d["nodes"].__setitem__(1, {**d["nodes"][1], "id": 99}))
    # a child's stated bound above its parent's is capped, never trusted
    raised = json.loads(json.dumps(doc))
    child = split_node["split"]["left"]
    raised["nodes"][child]["bounds"]["0"]["upper"] = 50.0
    capped = read_regions(raised, np.zeros(3), np.ones(3), 2, "bounds.json")
    assert capped.bound_upper[child][0] <= capped.bound_upper[split_node["id"]][0]


# --- verification against the exact per-box oracle -------------------------------------------------
@pytest.fixture(scope="module")
def region_run(tmp_path_factory):
    import lucid.verify.regions as regions

    path = write_tiny_run(tmp_path_factory.mktemp("regions") / "run", networks=6, seed=4, spread=(0.03, 0.08, 0.2))
    with pytest.MonkeyPatch.context() as patch:
        # boxes screened first, then deepened, as on real runs (the root proves this tiny one exactly,
        # after which every box would get its branch-and-bound at once)
        patch.setattr(regions, "screen_first", lambda tree, classes, settings: True)
        verify_run(path, regions=7, time_limit=60, workers=1, progress=False)
    return path


def test_every_box_bound_is_above_the_exact_leaking_confidence_in_that_box(region_run):
    run = open_run(region_run)
    doc = json.loads((region_run / "bounds.json").read_text())
    tree = read_regions(doc["regions"], *run.domain, run.num_classes, "bounds.json")
    # every leaf is verified but the rest of a carved box (verified over its parent's box, it keeps
    # the parent's bound, checked below like every other)
    assert len(tree.leaves()) > 1 and all(tree.verified[i] for i in tree.leaves() if not tree.inherits_box(i))
    assert_every_box_bound_holds(region_run)


def assert_every_box_bound_holds(path: Path) -> None:
    """Every node's bound of RUN/bounds.json is at least the exact leaking confidence in its box,
    and its lower bound at most that; the top-level bound at least the domain's exact bound."""
    run = open_run(path)
    doc = json.loads((path / "bounds.json").read_text())
    tree = read_regions(doc["regions"], *run.domain, run.num_classes, "bounds.json")
    stack = VerificationProblem.from_run(run, bounds="interval").stack
    checked = 0
    for node in range(len(tree)):
        lo, hi = tree.box(node)
        for c in range(run.num_classes):
            exact = max(exact_for(stack, p, c, lo, hi) for p in range(1, len(stack)))
            upper = tree.bound_upper[node][c]
            assert upper >= exact - 1e-9 or (upper == -1.0 and exact == -np.inf), (node, c, upper, exact)
            if np.isfinite(tree.bound_lower[node][c]):
                assert tree.bound_lower[node][c] <= exact + 1e-9  # a lower bound is a real leak here
            checked += 1
    assert checked == len(tree) * run.num_classes
    # the top-level bound is the leaves' maximum, and at least the exact bound of the domain
    for c in range(run.num_classes):
        exact = max(exact_for(stack, p, c, *run.domain) for p in range(1, len(stack)))
        top = doc["bounds"][str(c)]["upper"]
        assert top is None or top >= exact - 1e-9 or (top == -1.0 and exact == -np.inf)


def test_a_cut_short_root_is_continued_once_no_split_is_left_and_its_bounds_hold(tmp_path, monkeypatch):
    """At a small K the leaves run out long before the time: the rests of the carves, verified over
    the domain, hold most of the noised public points, and the root's branch-and-bound, cut short
    at its share, goes on where it stopped (not from scratch) instead of verifying boxes without
    noised points."""
    import lucid.verify.regions as regions

    path = write_tiny_run(tmp_path / "run", networks=6, seed=4, spread=(0.03, 0.08, 0.2))
    calls, shares, real, real_time = [], [], BoxVerifier.verify, regions.box_time

    def spy(self, node, *args, continued=None, **kw):
        calls.append((node, None if continued is None else sorted(continued)))
        shares.append((args[1].seconds, self.settings.time_limit))  # (the box's deadline, the run's limit)
        return real(self, node, *args, continued=continued, **kw)

    monkeypatch.setattr(BoxVerifier, "verify", spy)
    monkeypatch.setattr(regions, "box_time", lambda left, total, node, *rest: min(left, 0.05) if node == 0 else
                        real_time(left, total, node, *rest))  # the root: 0.05 s, not its third of the run (1 s finishes it here)
    result = verify_run(path, regions=3, time_limit=60, workers=1, progress=False)
    again = [made for node, made in calls if node == 0 and made is not None]
    assert calls[0] == (0, None) and again and again[0], calls  # with the states of the classes cut short
    # each box's time is a deadline handed down; the settings keep the run's limit
    assert shares[0][0] <= 0.05 and all(seconds <= 60 and total == 60 for seconds, total in shares), shares
    assert result["regions"]["leaves"] == 3
    events = [json.loads(line) for line in (path / "verify.log.jsonl").read_text().splitlines()]
    assert len([e for e in events if e["event"] == "region" and e["box"] == 0]) == 1 + len(again)
    assert_every_box_bound_holds(path)


def test_a_screened_box_bound_is_above_the_exact_leaking_confidence_in_that_box(region_run):
    """Boxes below the root are screened before any branch-and-bound: the bound the screen alone
    proves (the log's `screen_only` events) must hold over the box too."""
    run = open_run(region_run)
    stack = VerificationProblem.from_run(run, bounds="interval").stack
    events = [json.loads(line) for line in (region_run / "verify.log.jsonl").read_text().splitlines()]
    screened = [e for e in events if e["event"] == "region" and e.get("screen_only")]
    assert screened
    for e in screened:
        lo, hi = np.array(e["box_lower"]), np.array(e["box_upper"])
        for c, upper in e["upper"].items():
            exact = max(exact_for(stack, p, int(c), lo, hi) for p in range(1, len(stack)))
            assert upper is None or upper >= exact - 1e-9 or (upper == -1.0 and exact == -np.inf), (e["box"], c)
            low = e["lower"][c]
            assert low is None or low <= exact + 1e-9


def test_regions_release_no_leaking_input_and_noise_less_than_the_global_bound(region_run):
    run = open_run(region_run)
    clf = LabelOnlyClassifier(run, epsilon=1.0, memo=Memo(None))
    assert clf.regions is not None
    g = np.linspace(0, 1, 161)
    X = np.array(np.meshgrid(g, g)).reshape(2, -1).T  # includes every 1/160 plane and the faces
    X = np.vstack([X, np.random.default_rng(1).random((4000, 2))])
    tree = clf.regions
    planes = [(tree.feature[i], tree.threshold[i]) for i in range(len(tree)) if tree.feature[i] >= 0]
    planes += [(f, side[f]) for box in tree.carved.values() for side in box for f in range(2)]
    assert tree.carved
    for k, (f, t) in enumerate(planes):  # and points on every split plane and carved box's face
        plane = np.random.default_rng(k).random((200, 2))
        plane[:, f] = t
        X = np.vstack([X, plane])
    _, noised = clf.decide(X)
    leaking = leaking_set(VerificationProblem.from_run(run, bounds="interval").stack, X)
    assert not (leaking & ~noised).any()
    global_clf = LabelOnlyClassifier(run, epsilon=1.0, memo=Memo(None)).with_global_bounds()
    _, noised_global = global_clf.decide(X)
    assert not (noised & ~noised_global).any()  # a box's bound never exceeds the global one
    assert noised.sum() < noised_global.sum()  # and here the regions release more


def test_resume_continues_from_the_last_finished_box(tmp_path, monkeypatch):
    import lucid.verify.regions as regions

    path = write_tiny_run(tmp_path / "run", networks=3, seed=2, spread=(0.03, 0.08, 0.2))  # (3, not 5: CI time)
    calls = []  # (how, box): a box is screened first, then deepened by the branch-and-bound
    real = {"screen": BoxVerifier.screen, "verify": BoxVerifier.verify}

    def spy(how, interrupt_at=None):
        def wrapped(self, node, *args, **kw):
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            calls.append((how, node))
            return real[how](self, node, *args, **kw)
        return wrapped

    # screen first whatever the root proves (here it finishes, which would verify every box at once)
    monkeypatch.setattr(regions, "screen_first", lambda tree, classes, settings: True)
    # and let screened boxes wait for their branch-and-bound, so the interrupt finds one waiting
    monkeypatch.setattr(regions, "cheap_to_deepen", lambda *args: False)
    monkeypatch.setattr(BoxVerifier, "screen", spy("screen", 3))
    monkeypatch.setattr(BoxVerifier, "verify", spy("verify", 3))
    with pytest.raises(KeyboardInterrupt):
        verify_run(path, regions=5, time_limit=60, workers=1, progress=False)
    assert not (path / "bounds.json").exists()
    saved = json.loads((path / "verify.checkpoint.json").read_text())
    done = [n["id"] for n in saved["regions"]["nodes"] if n["verified"]]
    assert done == list(dict.fromkeys(node for _, node in calls)) and len(calls) == 3 and calls[0] == ("verify", 0)
    leaves = {n["id"] for n in saved["regions"]["nodes"] if n["split"] is None}
    assert calls[1][0] == "screen"  # the screened leaves not deepened yet wait for it
    waiting = {node for how, node in calls if how == "screen"} - {node for how, node in calls if how == "verify"}
    # a screened box's leaves wait for it, and so does the rest of a carve of a screened box (its box)
    rests = {n["split"]["left"] for n in saved["regions"]["nodes"] if n["split"] and "box" in n["split"] and n["id"] in waiting}
    assert set(saved["screened"]) == (waiting | rests) & leaves and waiting & leaves  # (not empty: one waits)
    monkeypatch.setattr(BoxVerifier, "screen", spy("screen"))
    monkeypatch.setattr(BoxVerifier, "verify", spy("verify"))
    with pytest.raises(LucidError, match="different options"):
        verify_run(path, regions=6, time_limit=60, workers=1, progress=False, resume=True)
    result = verify_run(path, regions=5, time_limit=60, workers=1, progress=False, resume=True)
    assert len(set(calls)) == len(calls)  # no box was screened or verified twice
    assert not any(how == "screen" and node in done for how, node in calls[3:])
    assert any(how == "verify" and node != 0 for how, node in calls)  # screened boxes were deepened
    nodes = result["regions"]["nodes"]
    rest = {n["split"]["left"] for n in nodes if n["split"] and "box" in n["split"]}
    assert result["regions"]["leaves"] <= 5 and all(n["verified"] for n in nodes if n["split"] is None and n["id"] not in rest)
    again = {node for _, node in calls[3:]}
    for k in done:  # the finished boxes kept their splits and bounds (a deepened one: never higher;
        for c, b in nodes[k]["bounds"].items():  # a leak found below a box raises its lower bound)
            before = saved["regions"]["nodes"][k]["bounds"][c]
            if k in again:
                assert before["upper"] is None or b["upper"] <= before["upper"]
            else:
                assert (b["upper"], b["complete"]) == (before["upper"], before["complete"])
            assert before["lower"] is None or b["lower"] >= before["lower"]
    events = [json.loads(line) for line in (path / "verify.log.jsonl").read_text().splitlines()]
    assert [e["box"] for e in events if e["event"] == "region"] == [node for _, node in calls]
    assert [bool(e.get("screen_only")) for e in events if e["event"] == "region"] == [
        how == "screen" for how, _ in calls]
    finished = next(e["t"] for e in events if e["event"] == "finished")  # the log's clock runs across resumes
    assert saved["elapsed"] > 0.5 and all(abs(b["seconds"] - finished) < 0.25 for b in result["bounds"].values())


def test_a_time_limit_that_ends_during_a_screen_ends_the_run_with_its_bounds(tmp_path, monkeypatch):
    import time

    import lucid.verify.regions as regions

    path = write_tiny_run(tmp_path / "run", networks=5, seed=2, spread=(0.03, 0.08, 0.2))
    limit, started, screened = 5.0, time.monotonic(), []  # (CI time: 8 before; it screens after ~1.2 s)
    real = BoxVerifier.screen

    def slow_screen(self, node, *args, **kw):  # the first screen runs past the end of the run
        real(self, node, *args, **kw)
        screened.append(node)
        time.sleep(max(0.0, limit + 0.2 - (time.monotonic() - started)))

    monkeypatch.setattr(regions, "screen_first", lambda tree, classes, settings: True)
    monkeypatch.setattr(regions, "cheap_to_deepen", lambda *args: True)  # ... and asks for its branch-and-bound at once
    monkeypatch.setattr(regions, "box_time", lambda left, *args: min(left, 1.0))  # the root: a second
    monkeypatch.setattr(BoxVerifier, "screen", slow_screen)
    result = verify_run(path, regions=5, time_limit=limit, workers=1, progress=False)
    assert len(screened) == 1
    node = next(n for n in result["regions"]["nodes"] if n["id"] == screened[0])
    assert node["verified"] and all(b["upper"] is not None for b in node["bounds"].values())
    assert json.loads((path / "bounds.json").read_text())["regions"]["leaves"] >= 2
    # the screen took the rest: the box stays screened, no branch-and-bound is started past the end
    events = [json.loads(line) for line in (path / "verify.log.jsonl").read_text().splitlines()]
    assert [e.get("screen_only", False) for e in events if e["event"] == "region" and e["box"] == screened[0]] == [True]


def test_memo_refuses_bounds_over_other_regions(region_run, tmp_path):
    run = open_run(region_run)
    memo_path = tmp_path / "memo.sqlite"
    clf = LabelOnlyClassifier(run, epsilon=1.0, memo=memo_path)
    clf.predict_network_space(np.array([[0.5, 0.5]]))
    clf.close()
    original = (region_run / "bounds.json").read_text()
    try:
        doc = json.loads(original)
        del doc["regions"]
        (region_run / "bounds.json").write_text(json.dumps(doc))
        with pytest.raises(LucidError, match="other bounds"):
            LabelOnlyClassifier(run, epsilon=1.0, memo=memo_path)
    finally:
        (region_run / "bounds.json").write_text(original)
    LabelOnlyClassifier(run, epsilon=1.0, memo=memo_path).close()  # the same regions: accepted


def test_evaluate_shows_regions_next_to_the_global_bounds(region_run, tmp_path):
    from lucid.access.evaluate import evaluate_run, markdown_table, plot_confidences, sorted_by_confidence

    data = dict(np.load(region_run / "data.npz"))
    rng = np.random.default_rng(5)
    data["X_test"] = rng.random((300, 2)).astype(np.float32)
    data["y_test"] = rng.integers(0, 2, 300)
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("run.json", "networks.safetensors", "bounds.json"):
        (copy / name).write_bytes((region_run / name).read_bytes())
    np.savez(copy / "data.npz", **data)
    result, plot = evaluate_run(copy, [("0", 0.0), ("1", 1.0)], seed=0)
    nf = result["noised_fraction"]
    assert nf["lucid"] < nf["lucid_global"] and nf["naive_idp"] <= nf["lucid"]
    # --plot draws each input as its box's bound decided it, not by the domain's bound per class
    released = [sorted_by_confidence(plot, c) for c in range(2)]
    assert sum(int(r.sum()) for _, r in released) == round((1 - nf["lucid"]) * 300)
    assert any(((conf <= plot["bounds"][c]) & r).any() for c, (conf, r) in enumerate(released))
    plot_confidences(plot, tmp_path / "confidences.png")
    assert (tmp_path / "confidences.png").stat().st_size > 0
    assert set(result["accuracy"]["lucid_global"]) == {"0", "1"}
    table = markdown_table(result, [("0", 0.0), ("1", 1.0)])
    assert "LUCID (regions)" in table and "LUCID (global)" in table


@pytest.mark.parametrize("args, message", [
    (["--regions", "0"], "--regions must be a whole number >= 1"),
    (["--public-inputs", "x.npz"], "--public-inputs only weighs the boxes"),
    (["--regions", "4", "--naive"], "--naive cannot be combined with --regions"),
    (["--regions", "-3"], "--regions must be a whole number >= 1"),
    (["--regions", "2.5"], "'2.5' is not a valid integer"),
    (["--regions", "4", "--no-bab"], "--no-bab cannot be combined with --regions"),
    (["--regions", "4", "--hyper", "agt:2"], "--hyper agt:2 cannot be combined with --regions"),
    (["--regions", "4", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler cannot be combined with --regions"),
    (["--regions", "4", "--public-inputs", "missing.npz"], "missing.npz does not exist"),
])
def test_bad_region_options_get_one_line_and_exit_2(tmp_path, capsys, args, message):
    from lucid.cli import main

    path = write_tiny_run(tmp_path / "run", networks=3, seed=1)
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(path), "--quiet", "--time-limit", "5", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (path / "bounds.json").exists()


def test_queries_in_a_shallow_and_a_deep_box_do_the_same_work_and_take_the_same_time(region_run):
    """The box an input falls in must not show in what the service does or how long it takes."""
    import time

    run = open_run(region_run)
    clf = LabelOnlyClassifier(run, epsilon=1.0, memo=Memo(None), options=ClassifierOptions(seed=0))
    tree = clf.regions
    X = np.random.default_rng(3).random((20000, 2))
    leaf = tree.locate(X)
    depth = {i: tree.depth_of(i) for i in tree.leaves()}
    shallow = min((i for i in depth if (leaf == i).sum() >= 50), key=depth.get)
    deep = max((i for i in depth if (leaf == i).sum() >= 50), key=depth.get)
    assert depth[deep] > depth[shallow]
    a, b = X[leaf == shallow][:50], X[leaf == deep][:50]
    traces = {}
    for name, rows in (("shallow", a), ("deep", b)):
        memo = Memo(None)
        clf.memo = memo.bind(1.0)
        statements: list[str] = []
        memo._db.set_trace_callback(statements.append)
        for i in range(20):
            clf.predict_network_space(rows[i:i + 1])
        memo._db.set_trace_callback(None)
        import re

        traces[name] = [re.sub(r"[xX]'[0-9a-fA-F]*'|-?\d+(\.\d+)?", "?", s) for s in statements]
    assert traces["shallow"] == traces["deep"]
    # time: single decisions, interleaved so machine load hits both alike
    times = {"shallow": [], "deep": []}
    for rep in range(3):
        for i in range(50):
            for name, rows in (("shallow", a), ("deep", b)):
                t0 = time.perf_counter()
                clf.decide(rows[i:i + 1])
                times[name].append(time.perf_counter() - t0)
    ms, md = np.median(times["shallow"]), np.median(times["deep"])
    assert abs(ms - md) <= 0.25 * max(ms, md) + 5e-6, (ms, md)


def test_a_box_target_is_a_level_to_prove_below_never_a_bound_by_itself():
    from lucid.bab.anytime import AnytimeBounds
    from lucid.regions.choice import box_targets
    from lucid.bab.invocation import Invocation
    from lucid.bab.state import ClassState
    from lucid.settings import VerifySettings

    classes_of = np.array([0, 0, 0, 0, 1, 1])
    conf = np.array([0.2, 0.5, 0.6, 0.9, 0.3, 0.4])
    targets = box_targets(classes_of, conf, [0, 1], known_lower=np.array([0.4, -np.inf]))
    # only the points above the box's known leak count; the level sits just below their low quantile
    from lucid.regions.choice import TARGET_MARGIN, TARGET_QUANTILE

    assert targets[0] == pytest.approx((1 - TARGET_MARGIN) * np.quantile([0.5, 0.6, 0.9], TARGET_QUANTILE))
    assert targets[1] == pytest.approx((1 - TARGET_MARGIN) * np.quantile([0.3, 0.4], TARGET_QUANTILE))
    assert targets[0] < 0.5 and targets[1] < 0.3  # below every point it is meant to release
    anytime = AnytimeBounds(VerifySettings(), Invocation())
    cs = ClassState(cls=0, target=0.8)
    assert anytime.tolerance(cs) == 0.0  # no leak known: no level can be claimed yet
    cs.lower = 0.5
    assert anytime.tolerance(cs) == pytest.approx(0.3) and anytime.cutoff(cs) == pytest.approx(0.8)
    cs.lower = 0.9  # a leak above the target: the class is back to exact
    assert anytime.tolerance(cs) == 0.0
    assert AnytimeBounds(VerifySettings(naive=True), Invocation()).tolerance(ClassState(cls=0, lower=0.1, target=1.0)) == 0.0


def test_rebind_drops_the_results_of_the_previous_problem():
    """After a box, a late result of its analyses must never reach the next box's engine, which
    reuses the same node keys."""
    import concurrent.futures as cf
    import threading

    from lucid.bab.workers import Executor

    ex = Executor()
    old = cf.Future()
    ex._watch((0, 0), old)
    threading.Timer(0.2, lambda: old.set_result("old box")).start()
    ex.rebind(problem=None, grace=0.0)  # waits for it here (nothing to replace in-process)
    new = cf.Future()
    ex._watch((0, 0), new)
    ex._done.put((ex._generation - 1, (0, 0), old))  # a straggler of the old problem, reported late
    new.set_result("new box")
    assert ex.completed(timeout=1.0) == [((0, 0), "new box")]


def test_the_report_says_the_bounds_are_per_box(region_run, tmp_path):
    from lucid.cli import main

    leaves = json.loads((region_run / "bounds.json").read_text())["regions"]["leaves"]
    out = tmp_path / "report.md"
    try:
        main(["report", str(region_run), "-o", str(out), "--format", "md"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    text = out.read_text()
    assert f"cut into {leaves} boxes" in text and "its own box" in text


def test_a_split_hugs_the_noised_points_with_a_margin_on_every_wide_side():
    from lucid.regions.choice import MIN_TRIM, TRIM_MARGIN, choose_split

    # P spans [0.4, 0.6] on feature 0, sits at 0 on feature 1, spans nearly all of feature 2 and
    # [0.05, 0.5] on feature 3 (its low side is too thin to cut off)
    P = np.array([[0.4, 0.0, 0.01, 0.05], [0.6, 0.0, 0.99, 0.5], [0.5, 0.0, 0.5, 0.3]])
    want_lo, want_hi = [0.4 - TRIM_MARGIN, 0, 0, 0], [0.6 + TRIM_MARGIN, TRIM_MARGIN, 1, 0.5 + TRIM_MARGIN]
    leak = {0: {"x": [0.5, 0.9, 0.5, 0.3], "value": 1.0, "row": 0}}  # only feature 1's top trim moves it
    # with room for a cut per side: axis trims, so the pieces cut off are boxes of their own
    tree = RegionTree(np.zeros(4), np.ones(4), 2)
    splits, kept = choose_split(tree, 0, P, leak, room=10)
    assert kept is P and len(splits) == 4 and all(sp.box is None for sp in splits)
    assert (splits[0].feature, splits[0].threshold) == (1, pytest.approx(TRIM_MARGIN))  # moves the leak: first
    node = 0
    for sp in splits:
        tree.split(node, sp.feature, sp.threshold)
        node = int(tree.locate(P[:1])[0])
        assert (tree.locate(P) == node).all()
    assert tree.box(node)[0] == pytest.approx(want_lo) and tree.box(node)[1] == pytest.approx(want_hi)
    # without that room: one carve of the same box
    tree = RegionTree(np.zeros(4), np.ones(4), 2)
    splits, kept = choose_split(tree, 0, P, leak, room=2)
    assert len(splits) == 1 and splits[0].box is not None
    lo, hi = splits[0].box
    assert lo == pytest.approx(want_lo) and hi == pytest.approx(want_hi)
    outside, inside = tree.carve(0, lo, hi)
    assert (tree.locate(P) == inside).all() and tree.inherits_box(outside) and not tree.inherits_box(inside)
    assert np.array_equal(tree.box(outside)[0], np.zeros(4)) and np.array_equal(tree.box(inside)[1], hi)
    # nothing left to hug in the carved box (the margin is the domain's: hugging again changes
    # nothing), and no smaller cluster: an axis cut between the two middle points, away from the leak
    splits, kept = choose_split(tree, inside, P, {0: {"x": [0.41, 0.0, 0.5, 0.3], "value": 1.0, "row": 0}}, room=10)
    assert len(splits) == 1 and splits[0].box is None and kept is P
    assert lo[splits[0].feature] < splits[0].threshold < hi[splits[0].feature]
    assert MIN_TRIM > TRIM_MARGIN


def test_a_box_its_points_span_is_carved_around_their_densest_cluster():
    from lucid.regions.choice import CLUSTER_RADII, choose_split

    rng = np.random.default_rng(0)
    tree = RegionTree(np.zeros(3), np.ones(3), 2)
    spread = rng.random((40, 3))  # spans the box: no carve around all of it
    spread[:3] = [[0, 0, 0], [1, 1, 1], [0, 1, 0.5]]
    dense = 0.5 + 0.03 * rng.random((15, 3))  # a cluster well inside
    P = np.vstack([spread, dense])
    (split,), kept = choose_split(tree, 0, P, {}, room=100)
    assert len(kept) >= len(dense) and len(kept) < len(P)
    assert np.all(np.ptp(kept, axis=0) <= 2 * CLUSTER_RADII[0])  # the cluster is within the first radius...
    outside, inside = tree.carve(0, *split.box)
    assert (tree.locate(kept) == inside).all()  # ...and lands whole in the carved box
    lo, hi = tree.box(inside)
    assert np.all(hi - lo <= 2 * CLUSTER_RADII[0] + 0.05)
    assert (tree.locate(P) == outside).any()  # the rest of P is in the rest of the box
    # points without any two within the widest radius: no carve, an axis cut
    grid = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0.5], [1, 0, 0.5]], dtype=float)
    assert max(CLUSTER_RADII) < 0.5
    (split,), kept = choose_split(RegionTree(np.zeros(3), np.ones(3), 2), 0, grid, {}, room=100)
    assert split.box is None and kept is grid


def test_a_box_under_the_rest_of_a_carve_starts_from_its_nearest_verified_ancestor():
    from lucid.regions.one_box import inherited_leaks as _inherited_leaks, nearest_screens as _nearest

    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    rest, carved = tree.carve(0, np.array([0.0, 0.0]), np.array([0.3, 0.3]))
    _, inner = tree.carve(rest, np.array([0.5, 0.5]), np.array([0.9, 0.9]))
    root_screen = {0: np.array([-np.inf, 2.0, 1.0])}
    screens = {0: root_screen, carved: {0: np.array([-np.inf, 0.5, 0.2])}}  # the rests are never verified
    assert _nearest(tree, inner, screens) is root_screen  # the rest's own box is the root's
    assert _nearest(tree, carved, screens) is root_screen
    assert _nearest(tree, 0, screens) == {}
    leaks = {0: {0: {"x": [0.6, 0.7], "value": 1.5, "row": 3}, 1: {"x": [0.1, 0.1], "value": 2.0, "row": 4}},
             rest: {0: {"x": [0.8, 0.8], "value": 1.7, "row": 5}}}
    got = _inherited_leaks(tree, inner, leaks)
    assert set(got) == {0} and got[0]["row"] == 5  # the best of the ancestors' leaks inside the box
    leaks[rest][0]["x"] = [0.95, 0.8]  # outside `inner`: the root's leak is the one inside
    assert _inherited_leaks(tree, inner, leaks)[0]["row"] == 3
    assert _inherited_leaks(tree, carved, leaks)[1]["row"] == 4


def test_a_screened_box_is_deepened_at_once_only_when_few_networks_stand_above_its_noised_points():
    from lucid.regions.choice import DEEPEN_AT_ONCE, cheap_to_deepen

    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    tree.record(0, np.array([0.8, 0.5]), np.array([-np.inf, -np.inf]))
    classes_of = np.array([0, 0, 1])
    confidences = np.array([0.3, 0.6, 0.9])  # class 1's point is released by the bound 0.5 already
    few = {0: np.r_[np.full(DEEPEN_AT_ONCE, 0.7), np.full(500, 0.1)], 1: np.full(600, 0.45)}
    assert cheap_to_deepen(tree, 0, few, classes_of, confidences)
    many = {0: np.r_[np.full(DEEPEN_AT_ONCE + 1, 0.7), np.full(500, 0.1)], 1: few[1]}
    assert not cheap_to_deepen(tree, 0, many, classes_of, confidences)
    # nothing left noised (the screen's bound releases every point): nothing to deepen for
    assert not cheap_to_deepen(tree, 0, few, classes_of, np.array([0.85, 0.9, 0.9]))
    # a leak known above every noised point: no bound can release them
    tree.record(0, np.array([0.8, 0.5]), np.array([0.7, -np.inf]))
    assert not cheap_to_deepen(tree, 0, few, classes_of, confidences)


def test_boxes_are_screened_first_only_when_the_root_left_a_class_open():
    from lucid.regions.choice import screen_first
    from lucid.settings import VerifySettings

    tree = RegionTree(np.zeros(2), np.ones(2), 3)
    settings = VerifySettings()
    tree.record(0, np.array([0.8, 0.5, 0.2]), np.full(3, -np.inf), complete=np.array([True, False, False]))
    assert screen_first(tree, [0, 1], settings)
    assert not screen_first(tree, [0], settings)  # the root's bound of every verified class is exact
    from dataclasses import replace
    assert not screen_first(tree, [0, 1], replace(settings, screen="none"))


def test_a_leaf_is_exact_only_with_no_leak_possible_or_a_leak_found_at_its_bound():
    from lucid.verify.regions import _leaves_exact

    def exact(upper: float, lower: float) -> bool:
        tree = RegionTree(np.zeros(2), np.ones(2), 1)
        a, b = tree.split(0, 0, 0.5)
        tree.record(a, np.array([-np.inf]), np.array([-np.inf]))  # no leak possible here
        tree.record(b, np.array([upper]), np.array([lower]))
        return _leaves_exact(tree, 0)

    assert exact(0.7, 0.7)  # a leak found at the bound
    assert not exact(0.7, -np.inf)  # a bound with no leak found under it
    assert not exact(0.7, 0.6)  # a gap


def test_serve_answers_by_each_inputs_box(region_run, tmp_path):
    """`lucid serve` on a run with regions: an input its box releases gets N's label, although
    the domain's bound for its class would noise it."""
    import httpx
    from serve_helpers import server

    from lucid.rundir import read_scaler

    run = open_run(region_run)
    clf = LabelOnlyClassifier(run, epsilon=0.0, memo=Memo(None))
    xn = np.random.default_rng(7).random((400, 2))
    labels, noised = clf.decide(xn)
    globally = clf.with_global_bounds().decide(xn)[1]
    gained = ~noised & globally
    assert gained.sum() >= 20  # inputs the boxes release and the per-class bounds would not (a draw each)
    offset, scale = read_scaler(run)
    with server(region_run, "--epsilon", "0", "--memo", str(tmp_path / "memo.sqlite")) as url:
        answered = httpx.post(url + "/v1/predict", json={"inputs": (xn / scale + offset).tolist()}).json()["labels"]
    expected = [clf.labels[i] for i in labels]
    assert [a for a, e, g in zip(answered, expected, ~noised) if g] == [e for e, g in zip(expected, ~noised) if g]
