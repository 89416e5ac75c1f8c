"""`lucid verify` end to end with the real node analyser (lucid.analysis.analyse.analyse_node) on tiny runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bab_fixtures import write_tiny_run
from lucid.verify import verify_run
from lucid.bab.events import read_events


# Safety margins differ between the MILPs of different node sets (the margin grows with the model's
# big-M constants, see lucid.analysis.soundness.safety_margin), so two exact runs may differ by a few 1e-6.
MARGIN_SLACK = 1e-5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return write_tiny_run(tmp_path_factory.mktemp("run") / "run", networks=12, seed=2)


def bounds_of(result: dict) -> dict[str, tuple]:
    return {c: (b["upper"], b["lower"]) for c, b in result["bounds"].items()}


@pytest.fixture(scope="module")
def naive_no_ris(tiny_run) -> dict:
    """The reference: one MILP per network, no pruning (paper's Naive), exact encoding."""
    return verify_run(tiny_run, workers=1, ris=False, naive=True, search=False, progress=False)


def test_bab_equals_naive_max_without_ris(tiny_run, naive_no_ris):
    result = verify_run(tiny_run, workers=1, ris=False, progress=False)
    for c, b in result["bounds"].items():
        ref = naive_no_ris["bounds"][c]
        assert b["complete"] and ref["complete"]
        assert abs(b["upper"] - ref["upper"]) <= max(1e-6, MARGIN_SLACK), (c, b, ref)
        # sound against every replayed witness, and lower bounds only from witnesses
        assert b["lower"] is not None and b["lower"] <= b["upper"]
        assert ref["lower"] <= b["upper"] + 1e-12 and b["lower"] <= ref["upper"] + 1e-12
    saved = json.loads((tiny_run / "bounds.json").read_text())
    assert saved["format"] == "lucid-bounds/1" and saved["bounds"] == result["bounds"]
    events = read_events(tiny_run / "verify.log.jsonl")
    for c in result["bounds"]:
        ups = [float(e["upper"]) for e in events if e["event"] == "anytime" and e["class"] == int(c)]
        assert ups and all(b <= a for a, b in zip(ups, ups[1:])), ups
        for e in events:
            if e["event"] == "anytime" and e["lower"] is not None:
                assert float(e["lower"]) <= float(e["upper"])
    solved = [e for e in events if e["event"] == "solved"]
    assert solved and all({"node", "parent", "size", "upper", "status", "stats", "t", "class"} <= set(e) for e in solved)


def test_ris_bound_is_at_least_the_exact_max(tiny_run, naive_no_ris):
    # MILPs only (no screening, no witness search, no ReLU-splitting tier: 4.5 s of this test's 5 on
    # these networks; its soundness: test_relu_split, test_verifier), so the tree is explored by the
    # encoder's bounds
    result = verify_run(tiny_run, workers=1, ris=True, screen=False, search=False, split_time=0, progress=False)
    for c, b in result["bounds"].items():
        exact = naive_no_ris["bounds"][c]["upper"]
        assert b["upper"] >= exact - MARGIN_SLACK
        print(f"class {c}: RiS excess over the exact bound = {b['upper'] - exact:.3g}")


def test_no_bab_hyper_network_bound_dominates(tiny_run, naive_no_ris):
    result = verify_run(tiny_run, workers=1, bab=False, ris=False, screen=False, progress=False)
    for c, b in result["bounds"].items():
        assert b["nodes"] == 1
        assert b["upper"] >= naive_no_ris["bounds"][c]["upper"] - MARGIN_SLACK


def test_dask_local_cluster_equals_local(tiny_run, naive_no_ris):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        # (without the ReLU-splitting tier, which is not what the scheduler changes: CI time)
        result = verify_run(tiny_run, scheduler=cluster.scheduler_address, ris=False, search=False,
                            split_time=0, progress=False)
    assert result["options"]["scheduler"] == cluster.scheduler_address
    for c, b in result["bounds"].items():
        assert b["complete"]
        assert abs(b["upper"] - naive_no_ris["bounds"][c]["upper"]) <= MARGIN_SLACK


def _lucid(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucid", *args], capture_output=True, text=True, **kw)


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pids: set[int]) -> set[int]:
    """The processes among `pids` that still exist and are not zombies."""
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile
            continue
        if state != "Z":
            out.add(p)
    return out


def _start_and_wait_for_workers(run: Path, args: list[str]) -> tuple[subprocess.Popen, set[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "lucid", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    ckpt = run / "verify.checkpoint.json"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if sum(c["solved"] for c in json.loads(ckpt.read_text())["classes"].values()) >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    assert proc.poll() is None, "verification finished before it could be stopped: enlarge the fixture"
    workers = _children(proc.pid)
    assert len(workers) >= 2
    return proc, workers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_driver_leaves_no_worker_behind(tmp_path, how):
    """SIGTERM is handled like Ctrl-C (checkpoint, one line, exit 130); after SIGKILL, which cannot be
    handled, the workers still end with their driver instead of solving MILPs for nobody."""
    run = write_tiny_run(tmp_path / "run", networks=24, seed=5)
    args = ["verify", str(run), "--workers", "2", "--no-ris", "--no-screen", "--no-search", "--quiet"]
    proc, workers = _start_and_wait_for_workers(run, args)
    os.kill(proc.pid, how)
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(workers), f"orphaned workers {_alive(workers)}"
    if how == signal.SIGTERM:
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
        state = json.loads((run / "verify.checkpoint.json").read_text())
        assert sum(c["solved"] for c in state["classes"].values()) >= 2
        # the checkpoint reads back (a full resume: test_kill_and_resume...; a second is enough
        # to read it: CI time)
        resumed = _lucid(*args, "--resume", "--time-limit", "1")
        assert resumed.returncode == 0, resumed.stderr


def test_kill_and_resume_gives_the_same_bounds(tmp_path):
    run = write_tiny_run(tmp_path / "run", networks=16, seed=5)
    args = ["verify", str(run), "--workers", "1", "--no-ris", "--no-screen", "--no-search", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "lucid", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    ckpt = run / "verify.checkpoint.json"
    deadline = time.monotonic() + 90
    solved = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            state = json.loads(ckpt.read_text())
            solved = sum(c["solved"] for c in state["classes"].values())
        except (OSError, ValueError):
            pass
        if solved >= 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "verification finished before it could be killed: enlarge the fixture"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(ckpt.read_text())
    assert not all(c["done"] for c in killed_at["classes"].values())

    # the resume in this process (the CLI's --resume: test_a_stopped_driver_leaves_no_worker_behind;
    # CI time), with the options of the killed command, which a resume must match
    opts = dict(workers=1, ris=False, screen=False, search=False, progress=False)
    verify_run(run, resume=True, **opts)
    after = json.loads((run / "bounds.json").read_text())
    events = read_events(run / "verify.log.jsonl")
    assert any(e["event"] == "resumed" for e in events)
    for c in after["bounds"]:  # across the kill and the resume, the anytime upper never rises
        ups = [float(e["upper"]) for e in events if e["event"] == "anytime" and e["class"] == int(c)]
        assert all(b <= a for a, b in zip(ups, ups[1:])), ups
    assert sum(e["event"] == "solved" for e in events) >= solved

    reference = verify_run(run, **opts)
    for c, b in reference["bounds"].items():
        assert after["bounds"][c]["complete"]
        assert abs(after["bounds"][c]["upper"] - b["upper"]) <= 1e-9 or (
            after["bounds"][c]["upper"] == b["upper"])
        assert after["bounds"][c]["lower"] == pytest.approx(b["lower"], abs=1e-9) if b["lower"] is not None \
            else after["bounds"][c]["lower"] is None


# --- bad input -------------------------------------------------------------------------------------
def run_main(args, capsys) -> tuple[int, str]:
    from lucid.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    return exc.value.code, err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--classes", "7"], "unknown class 7"),
        (["--classes", "x"], "not an integer"),
        (["--solver", "nosuch"], "unknown solver"),
        (["--time-limit", "0"], "--time-limit must be a positive"),
        (["--node-time-limit", "-1"], "--node-time-limit must be a positive"),
        (["--workers", "0"], "--workers must be a positive"),
        (["--rel-gap", "-0.1"], "--rel-gap must be a non-negative"),
        (["--split-time", "-5"], "--split-time must be a non-negative"),
    ],
)
def test_bad_options_are_one_line_errors(tiny_run, capsys, extra, message):
    code, err = run_main(["verify", str(tiny_run), "--quiet", *extra], capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_or_corrupt_run_dir(tmp_path, capsys):
    code, err = run_main(["verify", str(tmp_path / "nope"), "--quiet"], capsys)
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    code, err = run_main(["verify", str(bad), "--quiet"], capsys)
    assert code == 2 and "corrupt" in err and err.count("\n") == 1
    assert not (bad / "bounds.json").exists()


def test_solver_not_installed(tiny_run, capsys, monkeypatch):
    import lucid.solvers.registry

    monkeypatch.setattr(lucid.solvers.registry, "available_solvers",
                        lambda: {"highs": True, "gurobi": False, "cbc": True, "scip": True})
    code, err = run_main(["verify", str(tiny_run), "--solver", "gurobi", "--quiet"], capsys)
    assert code == 2 and "not installed" in err


def test_corrupt_foreign_or_mismatched_checkpoint(tmp_path, capsys):
    run = write_tiny_run(tmp_path / "run", networks=4, seed=1)
    code, err = run_main(["verify", str(run), "--resume", "--quiet"], capsys)
    assert code == 2 and "nothing to resume" in err
    verify_run(run, workers=1, progress=False, classes="0")
    ckpt = run / "verify.checkpoint.json"
    good = ckpt.read_text()
    code, err = run_main(["verify", str(run), "--resume", "--classes", "0", "--tau", "0.5", "--quiet"], capsys)
    assert code == 2 and "different options" in err and "tau" in err
    ckpt.write_text(good[: len(good) // 2])
    code, err = run_main(["verify", str(run), "--resume", "--classes", "0", "--quiet"], capsys)
    assert code == 2 and "corrupt" in err
    other = write_tiny_run(tmp_path / "other", networks=4, seed=9)
    (other / "verify.checkpoint.json").write_text(good)
    code, err = run_main(["verify", str(other), "--resume", "--classes", "0", "--quiet"], capsys)
    assert code == 2 and "different networks" in err
    # a finished checkpoint resumes to the same bounds without solving anything
    ckpt.write_text(good)
    before = json.loads((run / "bounds.json").read_text())["bounds"]
    again = verify_run(run, workers=1, progress=False, classes="0", resume=True)
    assert again["bounds"]["0"]["upper"] == before["0"]["upper"]


def test_process_pool_equals_in_process(tiny_run, naive_no_ris):
    # (without the ReLU-splitting tier, which runs inside a worker like the rest of a node: the pool
    # with the tier: the stopped-driver tests; CI time)
    result = verify_run(tiny_run, workers=2, ris=False, classes="1", search=False, split_time=0, progress=False)
    assert list(result["bounds"]) == ["1"] and result["options"]["workers"] == 2
    b = result["bounds"]["1"]
    assert b["complete"] and abs(b["upper"] - naive_no_ris["bounds"]["1"]["upper"]) <= MARGIN_SLACK


def test_resume_continues_a_run_cut_by_its_time_limit(tmp_path, naive_no_ris):
    run = write_tiny_run(tmp_path / "run", networks=12, seed=2)  # same networks as tiny_run
    opts = dict(workers=1, ris=False, screen=False, search=False, progress=False)
    first = verify_run(run, time_limit=0.01, **opts)  # a quiet machine may finish one class even so
    assert not all(b["complete"] for b in first["bounds"].values())
    for c, b in first["bounds"].items():  # anytime bounds are sound (null = nothing proved yet)
        assert b["upper"] is None or b["upper"] >= naive_no_ris["bounds"][c]["upper"] - MARGIN_SLACK
    second = verify_run(run, resume=True, **opts)
    for c, b in second["bounds"].items():
        assert b["complete"] and abs(b["upper"] - naive_no_ris["bounds"][c]["upper"]) <= MARGIN_SLACK


@pytest.mark.parametrize("rel_gap", [0.3, 2.0])
def test_relative_gap_is_sound_and_within_the_gap(tiny_run, naive_no_ris, rel_gap):
    result = verify_run(tiny_run, workers=1, rel_gap=rel_gap, progress=False)
    for c, b in result["bounds"].items():
        exact = naive_no_ris["bounds"][c]["upper"]
        assert b["complete"]
        assert b["upper"] >= exact - MARGIN_SLACK  # never below the true bound
        assert b["lower"] <= exact + 1e-12
        assert b["upper"] <= b["lower"] + rel_gap * abs(b["lower"]) + 1e-9
        assert b["exact"] == ("gap" not in b["reason"])  # a finish that used the tolerance says so
        if b["upper"] > b["lower"] + 1e-4:  # beyond any safety margin: the tolerance was used
            assert not b["exact"]


@pytest.fixture(scope="module")
def three_class_naive(tmp_path_factory):
    """A 3-class tiny run and its bounds by one MILP per network (computed once for every screen)."""
    run = write_tiny_run(tmp_path_factory.mktemp("screens") / "run", networks=6, seed=5, classes=3)
    return run, verify_run(run, workers=1, ris=False, naive=True, search=False, progress=False)


@pytest.mark.parametrize("screen", ["none", "interval", "symbolic", "optimised"])
def test_every_screen_gives_the_naive_bounds(tmp_path, screen, three_class_naive):
    """Each screen only removes networks it proves harmless: the bounds stay the exact ones of one
    MILP per network (three classes, so the symbolic screen's rival mixing is exercised)."""
    source, naive = three_class_naive
    run = tmp_path / "run"
    run.mkdir()
    for name in ("run.json", "networks.safetensors", "data.npz"):
        shutil.copy(source / name, run / name)
    # without the ReLU-splitting tier, which only costs time on these random networks (its soundness
    # under each screen is tested in test_verifier and test_relu_split)
    result = verify_run(run, workers=1, ris=False, screen=screen, split_time=0, progress=False)
    assert result["options"]["screen"] == screen
    for c, b in result["bounds"].items():
        ref = naive["bounds"][c]
        assert b["complete"]
        if ref["upper"] is None or b["upper"] is None:
            assert ref["upper"] == b["upper"]
        else:
            assert abs(b["upper"] - ref["upper"]) <= MARGIN_SLACK, (c, b, ref)
