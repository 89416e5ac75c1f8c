"""The residual check (`lucid verify --residual M`): the level, the stored sets and the release rule,
each against an independent computation in exact rational arithmetic (tests/helpers/exact_oracle.py)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from bab_fixtures import write_tiny_run
from exact_oracle import exact_singleton
from release_probes import (assert_four_outcomes_do_the_same_work, class_margin, crossings,
                            released_rows_agree_exactly)
from lucid.access import ClassifierOptions, LabelOnlyClassifier
from lucid.access.evaluate import leaking_set
from lucid.verify import verify_run
from lucid.errors import LucidError
from lucid.network import load_networks
from lucid.residual import ClassResidual, write_residual
from lucid.rundir import write_bounds

M = 3
FAST = {"workers": 1, "progress": False, "split_time": 0}  # the split tier adds 30 s here and nothing to the bounds


def _lucid(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucid", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> Path:
    run = write_tiny_run(tmp_path_factory.mktemp("residual") / "run", networks=10, classes=3, seed=6,
                         spread=(0.01, 0.03, 0.08))
    verify_run(run, residual=M, time_limit=60, **FAST)
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _section(run: Path) -> dict:
    return json.loads((run / "bounds.json").read_text())["residual"]


def _net(stack, j):
    return [w[j] for w in stack.weights], [b[j] for b in stack.biases]


def _exact_betas(stack, cls: int) -> list[Fraction | None]:
    """beta*_{cls,{j}} of every leave-one-out network j (None: no input makes it leak)."""
    return [exact_singleton(_net(stack, 0), _net(stack, j), cls, [0.0, 0.0], [1.0, 1.0])[0]
            for j in range(1, len(stack))]


def test_the_level_bounds_every_network_outside_the_set_and_upper_bounds_all(verified):
    stack = load_networks(verified)
    doc = json.loads((verified / "bounds.json").read_text())
    section = doc["residual"]
    assert section["size"] == M and (verified / section["file"]).exists()
    for key, entry in section["classes"].items():
        c = int(key)
        betas = _exact_betas(stack, c)
        members = set(entry["positions"])
        assert len(members) <= M
        outside = [b for j, b in enumerate(betas, start=1) if j not in members and b is not None]
        level = entry["level"]
        if outside:
            assert level is not None and Fraction(level) >= max(outside)
        for j, bound in zip(entry["positions"], entry["bounds"]):  # each member's stored bound is sound
            assert betas[j - 1] is None or (bound is not None and Fraction(bound) >= betas[j - 1])
        # the class's upper covers every network, so a reader without the residual rule stays sound
        every = [b for b in betas if b is not None]
        upper = doc["bounds"][key]["upper"]
        assert not every or Fraction(upper) >= max(every)
        # the set is the M highest screened bounds: the level is not above a member's bound
        assert level is None or not entry["bounds"] or min(b for b in entry["bounds"]) >= level - 1e-12


def test_every_release_agrees_with_all_networks_exactly_also_at_one_ulp_from_each_bound(verified):
    stack = load_networks(verified)
    clf = LabelOnlyClassifier.from_run(verified, epsilon=1.0)
    rng = np.random.default_rng(0)
    xs = rng.random((300, 2))
    points = [xs]
    section = _section(verified)
    n_conf = lambda x: class_margin(stack, 0, x, clf.decide(x)[0])  # noqa: E731
    for entry in section["classes"].values():
        for level in [entry["level"], *entry["bounds"]]:
            if level is not None:
                points += crossings(n_conf, xs[:80], float(level) + clf.confidence_error)
                points += crossings(n_conf, xs[:80], float(level))
    for j in np.unique(np.concatenate([e["positions"] for e in section["classes"].values()])):  # a member's own boundary
        points += crossings(lambda x, j=int(j): class_margin(stack, j, x, clf.decide(x)[0]), xs[:80], 0.0)
    allx = np.vstack(points)
    assert len(allx) > 300
    released = released_rows_agree_exactly(clf, stack, allx)
    assert released > 50  # the rule releases most inputs, not a vacuous pass
    # the check does work: some input above the level is noised because a member disagrees
    cls, noised = clf.decide(xs)
    above = ~(clf.residual_thresholds[cls] >= class_margin(stack, 0, xs, cls))
    assert (above & noised).any()


def test_a_level_one_ulp_below_the_exact_bound_flips_no_release(verified, tmp_path):
    """The stored level only ever matters through N's float error margin: a level wrong by a ulp
    (below the exact bound over the networks outside the set) still releases nothing that leaks."""
    run = _copy(verified, tmp_path)
    stack = load_networks(run)
    doc = json.loads((run / "bounds.json").read_text())
    for key, entry in doc["residual"]["classes"].items():
        members = set(entry["positions"])
        outside = [b for j, b in enumerate(_exact_betas(stack, int(key)), start=1) if j not in members and b is not None]
        if outside:
            entry["level"] = float(np.nextafter(float(max(outside)), -np.inf))
    (run / "bounds.json").write_text(json.dumps(doc))
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    xs = np.random.default_rng(1).random((200, 2))
    points = [xs]
    for entry in doc["residual"]["classes"].values():
        if entry["level"] is not None:
            points += crossings(lambda x: class_margin(stack, 0, x, clf.decide(x)[0]), xs[:80],
                                 entry["level"] + clf.confidence_error)
    released_rows_agree_exactly(clf, stack, np.vstack(points))


def test_with_every_network_in_the_set_the_rule_is_naive_idp(tmp_path):
    run = write_tiny_run(tmp_path / "run", networks=6, classes=2, seed=2)
    verify_run(run, residual=6, time_limit=60, **FAST)
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    xs = np.random.default_rng(3).random((2000, 2))
    leaking = leaking_set(load_networks(run), xs)
    noised = clf.decide(xs)[1]
    assert not (~noised & leaking).any()
    assert leaking.any()
    # besides the leaking set, only inputs within float error of some network's boundary are noised
    stack = load_networks(run)
    cls = clf.decide(xs)[0]
    close = np.zeros(len(xs), dtype=bool)
    for j in range(len(stack)):
        close |= class_margin(stack, j, xs, cls) <= 1e-6
    assert not (noised & ~leaking & ~close).any()


def test_the_check_does_the_same_work_for_level_check_and_noise(verified):
    """Released by the level (every member's bound below the confidence: nothing to check),
    released by the check (some member's bound at or above it: the member's own label decided),
    noised by the level and noised by a residual network that disagrees: the same draws and the
    same memo statements for every row (module docstring of lucid.access.residual_check)."""
    stack = load_networks(verified)
    probe = LabelOnlyClassifier.from_run(verified, epsilon=0.0)
    xs = np.random.default_rng(9).random((3000, 2))
    cls, noised = probe.decide(xs)
    classes = _section(verified)["classes"]
    top = np.array([max((np.inf if b is None else b for b in classes[str(c)]["bounds"]), default=-np.inf)
                    if str(c) in classes else -np.inf
                    for c in range(len(probe.residual_thresholds))])
    assert_four_outcomes_do_the_same_work(
        lambda: LabelOnlyClassifier.from_run(verified, epsilon=0.0, options=ClassifierOptions(seed=0)),
        xs, noised, class_margin(stack, 0, xs, cls), probe.residual_thresholds[cls], top[cls])


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,message", [("-1", "--residual must be a whole number >= 0"),
                                           ("1.5", "'1.5' is not a valid integer"),
                                           ("11", "--residual 11 exceeds the run's 10 leave-one-out networks")])
def test_a_bad_residual_size_is_one_line_and_exit_2(verified, tmp_path, value, message):
    run = _copy(verified, tmp_path)
    result = _lucid("verify", str(run), "--residual", value, "--quiet")
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags", [["--hyper", "agt:1"], ["--screen", "none"], ["--naive"]])
def test_options_the_residual_set_cannot_use_are_refused(verified, tmp_path, flags):
    result = _lucid("verify", str(_copy(verified, tmp_path)), "--residual", "2", *flags, "--quiet")
    assert result.returncode == 2 and "cannot be combined with --residual" in result.stderr


def _damage_missing(run: Path) -> None:
    (run / _section(run)["file"]).unlink()


def _damage_truncated(run: Path) -> None:
    path = run / _section(run)["file"]
    path.write_bytes(path.read_bytes()[:-40])


def _damage_foreign(run: Path) -> None:
    """Another run's residual file, its digest written into this bounds.json: the networks differ."""
    other = write_tiny_run(run.parent / "other", networks=10, classes=3, seed=5, spread=(0.1, 0.3, 0.6))
    doc = json.loads((run / "bounds.json").read_text())
    sets = {int(c): ClassResidual(0.0, np.asarray(e["positions"]), np.zeros(len(e["positions"])))
            for c, e in doc["residual"]["classes"].items()}
    theirs = write_residual(other, sets, M)  # the same positions, the other run's networks
    shutil.copy(other / theirs["file"], run / theirs["file"])
    doc["residual"]["file"], doc["residual"]["sha256"] = theirs["file"], theirs["sha256"]
    (run / "bounds.json").write_text(json.dumps(doc))


def _damage_non_finite(run: Path) -> None:
    doc = json.loads((run / "bounds.json").read_text())
    doc["residual"]["classes"]["0"]["level"] = "nan"
    (run / "bounds.json").write_text(json.dumps(doc))


def _damage_too_many(run: Path) -> None:
    doc = json.loads((run / "bounds.json").read_text())
    doc["residual"]["classes"]["0"]["positions"] = list(range(1, M + 2))
    doc["residual"]["classes"]["0"]["bounds"] = [1.0] * (M + 1)
    (run / "bounds.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("damage,message", [
    (_damage_missing, "is missing"), (_damage_truncated, "truncated or altered"),
    (_damage_foreign, "does not hold this run's residual networks"), (_damage_non_finite, "must be a finite number"),
    (_damage_too_many, "holds more than 3 networks")])
def test_a_damaged_residual_file_is_refused_in_one_line(verified, tmp_path, damage, message):
    run = _copy(verified, tmp_path)
    damage(run)
    with pytest.raises(LucidError, match=message):
        LabelOnlyClassifier.from_run(run, epsilon=1.0)
    result = _lucid("serve", str(run), "--epsilon", "1", "--port", "0")
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_resumed_verification_keeps_its_sets_and_a_plain_one_removes_the_file(verified, tmp_path):
    run = _copy(verified, tmp_path)
    before = _section(run)
    verify_run(run, residual=M, time_limit=60, resume=True, **FAST)
    after = _section(run)
    assert {k: v["positions"] for k, v in after["classes"].items()} == {
        k: v["positions"] for k, v in before["classes"].items()}
    with pytest.raises(LucidError):  # another M is another verification
        verify_run(run, residual=M - 1, resume=True, **FAST)
    doc = json.loads((run / "bounds.json").read_text())  # a later verification without --residual
    write_bounds(run, doc["bounds"], solver=doc["solver"], options=doc["options"])
    assert "residual" not in json.loads((run / "bounds.json").read_text())
    assert not list(run.glob("residual-*.safetensors"))
    assert LabelOnlyClassifier.from_run(run, epsilon=1.0).rule == "global"


def test_one_row_and_a_batch_take_the_same_decision(verified):
    """A single row uses its class's stack as a view, a batch groups its rows by class: the same answers."""
    clf = LabelOnlyClassifier.from_run(verified, epsilon=1.0)
    xs = np.random.default_rng(11).random((300, 2))
    cls, batch = clf.decide(xs)
    single = np.array([clf.decide(xs[i : i + 1])[1][0] for i in range(len(xs))])
    assert (single == batch).all() and 0 < batch.sum() < len(xs) and len(set(cls.tolist())) > 1


def _assert_levels_bound_the_networks_outside_exactly(run: Path) -> None:
    """Each class's stored level is at or above the exact bound of every network outside its set."""
    stack = load_networks(run)
    for key, entry in _section(run)["classes"].items():
        members = set(entry["positions"])
        outside = [b for j, b in enumerate(_exact_betas(stack, int(key)), start=1) if j not in members and b is not None]
        if outside:
            assert entry["level"] is not None and Fraction(entry["level"]) >= max(outside)


def _optimal_level(betas: list[Fraction | None], size: int) -> Fraction | None:
    """The lowest level any set of `size` networks can have: the (size+1)-th largest exact bound."""
    known = sorted((b for b in betas if b is not None), reverse=True)
    return known[size] if len(known) > size else None


@pytest.mark.parametrize("seed, networks, size, halfway", [(5, 10, 1, False), (2, 12, 3, False), (6, 10, 3, False),
                                                         (2, 12, 3, True), (6, 10, 3, True)])
def test_the_level_is_the_exact_order_statistic_of_the_networks_bounds(tmp_path, monkeypatch, seed, networks, size,
                                                                      halfway):
    """The level is the (M+1)-th largest exact beta*_{c,{i}} (up to the float margins of a proved
    bound and a replayed leak): the lowest level any set of M networks can have, found without
    rounds; a network whose leak is above it is in the set. Every network's stored bound in the
    checkpoint is sound too. `halfway`: every class backs off from the start (as after a singleton
    that could not be proved below its question), so its questions lie halfway up to the level
    until the last ones: the level still reaches the optimum."""
    run = write_tiny_run(tmp_path / "run", networks=networks, classes=2, seed=seed)
    backed_off = []
    if halfway:
        from lucid.bab.anytime import AnytimeBounds

        update = AnytimeBounds.update

        def update_and_back_off(self, cs):
            update(self, cs)
            if cs.backed_off is None and math.isfinite(cs.upper):
                self.back_off(cs)
                backed_off.append(cs.cls)

        monkeypatch.setattr(AnytimeBounds, "update", update_and_back_off)
    result = verify_run(run, residual=size, time_limit=120, **FAST)
    if halfway:
        events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
        assert sorted(e["class"] for e in events if e["event"] == "question_backed_off") == sorted(backed_off) == [0, 1]
    stack = load_networks(run)
    checkpoint = json.loads((run / "verify.checkpoint.json").read_text())
    for key, entry in _section(run)["classes"].items():
        betas = _exact_betas(stack, int(key))
        optimal, level = _optimal_level(betas, size), entry["level"]
        members = set(entry["positions"])
        outside = [b for j, b in enumerate(betas, start=1) if j not in members and b is not None]
        assert result["bounds"][key]["complete"]
        if outside:
            assert level is not None and Fraction(level) >= max(outside)  # sound
        if optimal is None:
            assert level is None or not outside
        else:
            assert Fraction(level) - optimal <= Fraction(1e-5) * (1 + abs(optimal))  # and optimal
        assert all(b is None or j in members for j, b in enumerate(betas, start=1)
                   if b is not None and optimal is not None and b > optimal + Fraction(1e-5))
        state = checkpoint["classes"][key]
        for j, bound in enumerate(state["network_bound"][1:], start=1):
            assert betas[j - 1] is None or Fraction(float(bound)) >= betas[j - 1]
        for j, leak in state["network_leak"]:
            assert betas[j - 1] is not None and Fraction(float(leak)) <= betas[j - 1]


def test_the_log_names_the_network_that_holds_the_level(verified):
    events = [json.loads(line) for line in (verified / "verify.log.jsonl").read_text().splitlines()]
    sets = {e["class"]: e for e in events if e["event"] == "residual"}
    section = _section(verified)
    assert sorted(sets) == sorted(int(k) for k in section["classes"])
    for c, e in sets.items():
        entry = section["classes"][str(c)]
        assert sorted(e["positions"]) == entry["positions"] and e["level"] == entry["level"]
        assert e["bounds"] == sorted(e["bounds"], reverse=True) and e["holder"]["bound"] == e["level"]
    shown = _lucid("log", str(verified))
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    holder = sets[0]["holder"]
    assert f"held by the network without row {holder['row']}" in text


def test_a_run_cut_short_resumes_to_the_same_level(verified, tmp_path):
    """A time limit that ends the search early leaves a sound, looser level; --resume continues
    from the checkpoint's per-network bounds and leaks and ends where an uninterrupted run did."""
    run = write_tiny_run(tmp_path / "run", networks=10, classes=3, seed=6, spread=(0.01, 0.03, 0.08))
    verify_run(run, residual=M, time_limit=2, **FAST)
    short = _section(run)
    state = json.loads((run / "verify.checkpoint.json").read_text())["classes"]
    assert all("network_bound" in s and s["residual_size"] == M for s in state.values())
    verify_run(run, residual=M, time_limit=60, resume=True, **FAST)
    whole = _section(verified)
    for key, entry in _section(run)["classes"].items():
        assert entry["level"] == pytest.approx(whole["classes"][key]["level"], rel=1e-6, abs=1e-9)
        if short["classes"][key]["level"] is not None:
            assert entry["level"] <= short["classes"][key]["level"]


def test_a_checkpoint_with_a_set_chosen_before_the_search_is_refused_in_one_line(verified, tmp_path):
    run = _copy(verified, tmp_path)
    path = run / "verify.checkpoint.json"
    doc = json.loads(path.read_text())
    for state in doc["classes"].values():
        for key in ("residual_size", "networks", "network_bound", "network_leak"):
            state.pop(key)
        state["residual"] = [1, 2, 3]
    path.write_text(json.dumps(doc))
    result = _lucid("verify", str(run), "--residual", str(M), "--resume", "--quiet")
    assert result.returncode == 2 and "older LUCID" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- --residual auto ----------------------------------------------------------------------------------
def _with_test_split(run: Path, rows: int = 300, seed: int = 9) -> Path:
    """The tiny run with a test split of uniform inputs (labelled by N: only the inputs matter here)."""
    data = dict(np.load(run / "data.npz"))
    x = np.random.default_rng(seed).random((rows, 2)).astype(np.float32)
    data["X_test"], data["y_test"] = x, load_networks(run).select([0]).forward(x.astype(np.float64))[0].argmax(1)
    np.savez(run / "data.npz", **data)
    meta = json.loads((run / "run.json").read_text())
    meta["test_size"] = rows
    (run / "run.json").write_text(json.dumps(meta))
    return run


def _brute_noised(stack, x: np.ndarray, bounds: dict[int, np.ndarray], m: int, error: float) -> float:
    """The rule's noised share with M = m, input by input: the M largest bounds (ties: lower
    position) form the set, the next one is the level; released iff the confidence is above
    max(level, 0) + error and every member labels the input as N does."""
    scores = stack.forward(x)
    labels = scores[0].argmax(1)
    noised = 0
    for i, c in enumerate(labels):
        b = bounds[int(c)]
        order = sorted(range(1, len(b)), key=lambda j: (-b[j], j))
        members, level = order[:m], (b[order[m]] if m < len(order) else -np.inf)
        conf = class_margin(stack, 0, x[i : i + 1], np.array([c]))[0]
        agree = all(scores[j, i].argmax() == c for j in members)
        noised += not (conf > max(level, 0.0) + error and agree)
    return noised / len(x)


def test_auto_chooses_the_smallest_m_meeting_the_target_on_the_test_split(tmp_path):
    run = _with_test_split(write_tiny_run(tmp_path / "run", networks=12, classes=2, seed=2))
    result = _lucid("verify", str(run), "--residual", "auto", "--max-residual", "6", "--quiet", "--workers", "1",
                    "--split-time", "0", "--time-limit", "60")
    assert result.returncode == 0, result.stderr
    doc = json.loads((run / "bounds.json").read_text())
    choice = doc["residual_choice"]
    assert choice["inputs"] == "the test split" and choice["count"] == 300 and choice["cap"] == 6
    assert f"--residual auto chose M = {choice['size']}" in result.stdout
    stack = load_networks(run)
    x = np.asarray(np.load(run / "data.npz")["X_test"], dtype=np.float64)
    naive = float(np.mean((stack.forward(x).argmax(2) != stack.forward(x)[0].argmax(1)).any(0)))
    assert choice["naive_idp"] == pytest.approx(naive, abs=1e-9)
    assert choice["target"] == pytest.approx(max(2 * naive, naive + 0.02), abs=1e-6)
    state = json.loads((run / "verify.checkpoint.json").read_text())["classes"]
    bounds = {int(c): np.array([float(v) for v in s["network_bound"]]) for c, s in state.items()}
    error = LabelOnlyClassifier.from_run(run, epsilon=1.0).confidence_error
    shares = [_brute_noised(stack, x, bounds, m, error) for m in range(choice["size"] + 1)]
    assert shares[-1] == pytest.approx(choice["noised"], abs=1e-6) and choice["met"] == (shares[-1] <= choice["target"])
    assert all(s > choice["target"] for s in shares[:-1]) or not choice["met"]  # the smallest that meets it
    # what is served is what was chosen: the classifier noises the same share of the test split
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    assert float(clf.decide(x)[1].mean()) == pytest.approx(choice["noised"], abs=1e-6)
    if choice["size"]:
        assert doc["residual"]["size"] == choice["size"]
        assert choice["networks_served"] == len(doc["residual"]["networks"])


def test_auto_with_more_cap_than_networks_says_every_network_may_be_checked(tmp_path):
    run = _with_test_split(write_tiny_run(tmp_path / "run", networks=8, classes=2, seed=3))
    result = _lucid("verify", str(run), "--residual", "auto", "--quiet", "--workers", "1", "--split-time", "0",
                    "--time-limit", "60")
    assert result.returncode == 0, result.stderr
    assert json.loads((run / "bounds.json").read_text())["residual_choice"]["every_network"] is True
    assert "every one may be checked, as Naive-iDP does" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--max-residual", "0"], "--max-residual must be a whole number >= 1"),
    (["--max-residual", "-2"], "--max-residual must be a whole number >= 1"),
    (["--max-residual", "x"], "'x' is not a valid integer"),
    (["--public-inputs", "wide.npz"], "X must have shape [rows, 2]"),
    (["--public-inputs", "nan.npz"], "X has NaN or infinite values"),
    ([], "has none: give --public-inputs"),
])
def test_auto_refuses_bad_input_in_one_line(verified, tmp_path, args, message):
    run = _copy(verified, tmp_path)  # a run without a test split
    np.savez(tmp_path / "wide.npz", X=np.zeros((4, 5)))
    np.savez(tmp_path / "nan.npz", X=np.full((4, 2), np.nan))
    args = [str(tmp_path / a) if a.endswith(".npz") else a for a in args]
    before = (run / "bounds.json").read_bytes()
    result = _lucid("verify", str(run), "--residual", "auto", *args, "--quiet")
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (run / "bounds.json").read_bytes() == before


def test_max_residual_without_auto_is_refused(verified, tmp_path):
    result = _lucid("verify", str(_copy(verified, tmp_path)), "--residual", "3", "--max-residual", "5", "--quiet")
    assert result.returncode == 2 and "--max-residual caps --residual auto only" in result.stderr


def test_the_report_leads_with_the_levels_and_names_the_sets(verified, tmp_path):
    """`lucid report` shows what the rule uses: the level per class in the bound table (not the
    bound over every network, which moves to a note), and the rows of each class's set."""
    run = _copy(verified, tmp_path)
    out = tmp_path / "report.html"
    result = _lucid("report", str(run), "--format", "html", "--out", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "L_c = level (proved)" in text and "β_c = upper (proved)" not in text
    section = _section(run)
    for key, entry in section["classes"].items():
        assert f'id="bound-{key}-upper" data-value="{json.dumps(entry["level"])}"' in text
        assert f"class {key}: rows {', '.join(str(r) for r in entry['rows'][:8])}" in text
    assert "Over every network (what a reader without the residual check would use)" in text


def test_with_residual_sets_the_screen_refines_only_when_the_level_reaches_unrefined_networks():
    """--residual M: the optimised screen refines nothing while every network at or above the
    level is refined, then the highest unrefined ones in one batch (those at or above the level
    and the next below it), never a singleton alone (its split starts from that bound itself);
    and a refined bound only ever lowers a network's screen."""
    from lucid.bab.anytime import AnytimeBounds
    from lucid.bab.screening import RESIDUAL_REFINE_BATCH, ScreenBounds
    from lucid.bab.invocation import Invocation
    from lucid.bab.state import ClassState
    from lucid.settings import VerifySettings

    networks = 3 * RESIDUAL_REFINE_BATCH + 1
    settings = VerifySettings(residual=4)
    invocation = Invocation()
    asked: list[np.ndarray] = []

    def refine(cls, positions, level, deadline=None):
        asked.append(np.array(positions))
        return cs.screen[positions] - 0.5

    screening = ScreenBounds(networks, settings, AnytimeBounds(settings, invocation), invocation,
                             screen=lambda c, p, deadline=None: np.zeros(len(p)), refine=refine)
    cs = ClassState(cls=0, residual_size=4, lower=0.0)
    cs.network_bound, cs.network_leak = np.full(networks, np.inf), np.full(networks, -np.inf)  # (as the engine tracks them)
    cs.screen = np.concatenate([[-np.inf], np.linspace(1.0, 2.0, networks - 1)])
    everything = np.arange(1, networks)
    cs.upper = 5.0  # no network reaches the level: nothing to refine
    screening.refine(cs, everything)
    assert asked == []
    cs.upper = 1.9  # the top tenth reaches it: one batch, the highest first
    before = cs.screen.copy()
    screening.refine(cs, everything)
    assert len(asked) == 1 and len(asked[0]) == RESIDUAL_REFINE_BATCH
    assert set(asked[0]) == set(np.argsort(-before)[:RESIDUAL_REFINE_BATCH].tolist())
    assert (cs.screen <= before).all() and (cs.screen[asked[0]] < before[asked[0]]).all()
    screening.refine(cs, np.array([int(np.argmax(np.where(cs.refined, -np.inf, cs.screen)))]))  # a singleton
    assert len(asked) == 1
    cs.upper = 1.0 - 1e-9  # every network at or above the level: all the unrefined ones at once
    screening.refine(cs, everything)
    assert len(asked) == 2 and len(asked[1]) == networks - 1 - RESIDUAL_REFINE_BATCH
    assert cs.refined[1:].all()


def test_a_resumed_class_keeps_asking_halfway_after_its_back_off():
    """The back-off is part of the class state: after a checkpoint round trip (a resume, with a
    fresh `AnytimeBounds`), the class's question is the same halfway one, not the leak again."""
    from lucid.bab.anytime import AnytimeBounds
    from lucid.bab.invocation import Invocation
    from lucid.bab.state import ClassState
    from lucid.settings import VerifySettings

    settings = VerifySettings(residual=1)
    cs = ClassState(cls=0, residual_size=1, lower=0.1, upper=0.9)
    cs.network_bound = np.array([-np.inf, 0.9, 0.9, 0.95])
    cs.network_leak = np.array([-np.inf, 0.1, 0.2, 0.3])
    cs.residual = np.array([3])
    anytime = AnytimeBounds(settings, Invocation())
    asked_at_leak = anytime.cutoff(cs)
    anytime.back_off(cs)
    halfway = anytime.cutoff(cs)
    assert asked_at_leak == pytest.approx(0.2) and halfway == pytest.approx(0.2 + 0.5 * (0.9 - 0.2))
    resumed = ClassState.from_json(0, json.loads(json.dumps(cs.to_json())))
    resumed.residual = cs.residual
    assert resumed.backed_off == cs.backed_off == 0.9
    assert AnytimeBounds(settings, Invocation()).cutoff(resumed) == halfway
