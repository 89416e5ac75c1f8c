"""`lucid verify RUN --hyper agt:K`: one MILP per class over the run's AGT box (lucid.analysis.agt_box).

The box contains every network trained without up to K rows, in particular every leave-one-out
network when K >= 1, so its bound can never be below the exact leave-one-out bound of the same
run; boxes nest in K, and so do the bounds. Bad input is one line and writes nothing."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from lucid.agt.store import AGT_FILE, load_boxes
from lucid.verify import verify_run
from lucid.bab.events import read_events
from lucid.cli import cli, main
from lucid.training import train_run

# tests/training/test_agt.py's CLI configuration: 24 training rows, boxes of width ~0.2 (k=1) and ~0.5 (k=2)
TRAIN = dict(arch="5", epochs=2, batch_size=7, lr=0.1, progress=False)


def tiny_npz(path, n=30, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g)
    y = ((X[:, 0] + 0.5 * X[:, 1] + 0.1 * torch.randn(n, generator=g)) > 0.75).long()
    np.savez(path, X=X.numpy(), y=y.numpy())
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agt-verify")
    data = tiny_npz(tmp / "d.npz")
    return {"agt2": train_run(str(data), tmp / "agt2", agt=2, **TRAIN),
            "no-loo": train_run(str(data), tmp / "no-loo", agt=1, loo=False, **TRAIN),
            "plain": train_run(str(data), tmp / "plain", **TRAIN)}


def fresh(run, tmp_path, name="run"):
    """A copy without any verification output."""
    out = tmp_path / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("bounds.json", "verify.*"))
    return out


def as_float(value, *, upper=True):
    """A bounds.json value back as a number (null upper: nothing proved; -1.0 upper: -inf)."""
    if value is None:
        return math.inf if upper else -math.inf
    return value


def test_the_k1_bound_covers_the_exact_leave_one_out_bound(runs, tmp_path):
    run = fresh(runs["agt2"], tmp_path)
    loo = verify_run(run, naive=True, ris=False, search=False, workers=1, progress=False)["bounds"]
    agt = verify_run(run, hyper="agt:1", workers=1, progress=False)
    assert agt["options"]["hyper"] == "agt:1"
    for c, entry in agt["bounds"].items():
        assert loo[c]["complete"] and loo[c]["exact"]
        assert entry["removals"] == 1 and entry["nodes"] == 1
        if entry["upper"] is None:  # a box too wide to prove anything says so
            assert not entry["complete"] or "nothing proved" in entry["reason"]
            continue
        assert entry["complete"] and entry["exact"]
        assert entry["upper"] >= as_float(loo[c]["upper"]) - 1e-6, (c, entry, loo[c])
        if loo[c]["lower"] is not None:  # a true leak of some N_-i, which lies in the box
            assert entry["upper"] >= loo[c]["lower"]
        if entry["lower"] is not None:  # the box's lower bound is a replayed leave-one-out leak
            assert entry["lower"] <= as_float(loo[c]["upper"]) and entry["lower"] <= entry["upper"]
            assert isinstance(entry["leaking_row"], int)
    events = read_events(run / "verify.log.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished" and kinds.count("class_done") == 2
    assert kinds.count("solved") == 2 and kinds.count("anytime") == 2  # what `lucid log` reads
    assert events[0]["options"]["hyper"] == "agt:1" and events[0]["removals"] == 1


def test_boxes_nest_and_the_bound_grows_with_k(runs, tmp_path):
    boxes = load_boxes(runs["agt2"])
    for name, lo in boxes[1].lower.items():
        assert torch.all(boxes[2].lower[name] <= lo) and torch.all(boxes[1].upper[name] <= boxes[2].upper[name])
    run = fresh(runs["agt2"], tmp_path)
    # Without relax-if-similar the k=1 model's feasible set lies inside the k=2 model's (nested boxes give
    # nested intervals everywhere); with it, a neuron relaxed at k=1 may be exact at k=2.
    b1 = verify_run(run, hyper="agt:1", ris=False, workers=1, progress=False)["bounds"]
    b2 = verify_run(run, hyper="agt:2", ris=False, workers=1, progress=False)["bounds"]
    for c in b1:
        assert b2[c]["removals"] == 2
        assert as_float(b2[c]["upper"]) >= as_float(b1[c]["upper"]) - 1e-6, (c, b1[c], b2[c])


def test_a_run_without_leave_one_out_networks_gets_an_upper_bound_only(runs, tmp_path):
    run = fresh(runs["no-loo"], tmp_path)
    result = verify_run(run, hyper="agt:1", workers=1, progress=False)
    for entry in result["bounds"].values():
        assert entry["lower"] is None and entry["leaking_row"] is None and entry["removals"] == 1
        assert entry["complete"]


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("which, hyper, message", [
    ("agt2", "agt:3", "stores AGT boxes for k = 1, 2 only"),
    ("agt2", "agt:x", "unknown --hyper 'agt:x'"),
    ("agt2", "foo", "unknown --hyper 'foo'"),
    ("agt2", "agt:0", "unknown --hyper 'agt:0'"),
    ("plain", "agt:1", "has no AGT boxes"),
])
def test_bad_hyper_is_one_line_and_writes_nothing(runs, tmp_path, capsys, which, hyper, message):
    run = fresh(runs[which], tmp_path)
    code, err = run_main(["verify", str(run), "--hyper", hyper, "--workers", "1", "--quiet"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    if which == "plain":
        assert str(run) in lines[0] and not (run / AGT_FILE).exists()
    assert not (run / "bounds.json").exists() and not (run / "verify.log.jsonl").exists()


def test_branch_and_bound_options_are_refused_with_a_box(runs, tmp_path, capsys):
    run = fresh(runs["agt2"], tmp_path)
    code, err = run_main(["verify", str(run), "--hyper", "agt:1", "--resume", "--rel-gap", "0.1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--resume, --rel-gap cannot be combined with --hyper agt:1" in err
    assert not (run / "bounds.json").exists()
    for flags, named in ((["--screen", "interval"], "--screen interval"), (["--no-screen"], "--screen none")):
        code, err = run_main(["verify", str(run), "--hyper", "agt:1", *flags], capsys)
        assert code == 2 and err.count("\n") == 1 and f"{named} cannot be combined with --hyper agt:1" in err
    assert not (run / "bounds.json").exists()


def test_the_cli_writes_the_kind_of_bound_and_the_access_layer_reads_it(runs, tmp_path):
    from lucid.access import LabelOnlyClassifier
    from lucid.access.evaluate import evaluate_run

    run = fresh(runs["agt2"], tmp_path)
    result = CliRunner().invoke(cli, ["verify", str(run), "--hyper", "agt:2", "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "class 0: upper" in result.output and "class 1: upper" in result.output
    doc = json.loads((run / "bounds.json").read_text())
    assert doc["format"] == "lucid-bounds/1" and doc["options"]["hyper"] == "agt:2"
    assert all(entry["removals"] == 2 for entry in doc["bounds"].values())
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    X = np.load(tiny_npz(tmp_path / "d.npz"))["X"]  # the training data, in its original units
    labels = clf.predict(X)
    assert len(labels) == len(X)
    report, _ = evaluate_run(run, [("1", 1.0)], seed=0)
    assert 0.0 <= report["accuracy"]["plain"] <= 1.0


def test_the_flags_reach_the_box_analysis(runs, tmp_path, monkeypatch):
    import lucid.analysis.agt_box

    seen = []
    original = lucid.analysis.agt_box.analyse_parameter_box

    def analyse_parameter_box(problem, cls, hyper, settings, solver_options, **kw):
        seen.append((cls, settings, solver_options))
        return original(problem, cls, hyper, settings, solver_options, **kw)

    monkeypatch.setattr(lucid.analysis.agt_box, "analyse_parameter_box", analyse_parameter_box)
    run = fresh(runs["agt2"], tmp_path)
    args = ["verify", str(run), "--hyper", "agt:2", "--workers", "1", "--quiet", "--time-limit", "40",
            "--node-time-limit", "7", "--classes", "1", "--no-search"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert [c for c, _, _ in seen] == [1]
    _, settings, options = seen[0]
    assert settings.hyper == "agt:2" and settings.removals == 2 and not settings.search
    assert options.time_limit == 7.0


def test_a_time_limited_solve_reports_its_dual_bound_as_incomplete(runs, tmp_path, monkeypatch):
    import lucid.solvers
    from lucid.solvers.base import TIME_LIMIT, SolveResult

    def stopped(model, solver="highs", options=None, **kw):  # a solver that ran out of time at dual bound 0.5
        return SolveResult(status=TIME_LIMIT, upper_bound=0.5, solver=solver)

    monkeypatch.setattr(lucid.solvers, "solve", stopped)
    run = fresh(runs["agt2"], tmp_path)
    bounds = verify_run(run, hyper="agt:1", workers=1, progress=False, search=False, time_limit=5)["bounds"]
    solved = [entry for entry in bounds.values() if entry["upper"] != -1.0]  # -1.0: no MILP, nothing can leak
    assert solved
    for entry in solved:
        assert not entry["complete"] and not entry["exact"] and "time limit" in entry["reason"]
        assert 0.5 < entry["upper"] < 0.5 + 1e-3  # the dual bound plus the safety margin
