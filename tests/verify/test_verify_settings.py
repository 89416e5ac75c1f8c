"""Every `lucid verify` flag reaches, through the one typed `VerifySettings`, the part that uses it;
bad values are one error line; `--no-search` switches off every witness search."""

from __future__ import annotations

import math

import pytest
from bab_fixtures import write_tiny_run
from click.testing import CliRunner

import lucid.bab.engine
import lucid.bab.workers
import lucid.bounds.stack_screen
import lucid.bounds.input_split
import lucid.bounds.relu_split
import lucid.bounds.symbolic
import lucid.witness.search
import lucid.witness.replay
import lucid.solvers
from lucid.analysis.time_shares import node_limit
from lucid.deadline import Deadline
import lucid.analysis.analyse
import lucid.analysis.problem
import lucid.analysis.screen
from lucid.cli import cli as main
from lucid.errors import LucidError
from lucid.settings import VerifySettings


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_tiny_run(tmp_path_factory.mktemp("flags") / "run", networks=6, seed=3)


class Recorder:
    """Wraps the consumers of the settings and records what each received."""

    def __init__(self, monkeypatch):
        self.nodes: list[dict] = []  # analyse_node calls
        self.limits: list[float | None] = []  # the time limits node analyses were handed
        self.solves: list[str] = []  # backends asked to solve a MILP
        self.engines: list = []
        self.screens = 0
        self.symbolic: list[dict] = []  # symbolic_screen(s) calls: steps and device
        self.searches = {"class": 0, "node": 0, "climb": 0, "split": 0}
        self.problems: list = []
        self.displays: list[bool] = []
        original_analyse = lucid.analysis.analyse.analyse_node
        original_analyse_with = lucid.bab.workers.analyse_with
        original_solve = lucid.solvers.solve
        original_screen = lucid.analysis.screen.interval_screens
        original_symbolic = lucid.bounds.stack_screen.symbolic_screen
        original_symbolics = lucid.bounds.stack_screen.symbolic_screens
        original_from_run = lucid.analysis.problem.VerificationProblem.from_run.__func__
        recorder = self

        def analyse_node(problem, cls, positions, **kw):
            settings = kw.get("settings")
            recorder.nodes.append({"settings": settings, "encoding": settings.encoding_options(),
                                   "options": kw.get("solver_options"), "cls": cls})
            return original_analyse(problem, cls, positions, **kw)

        def analyse_with(problem, settings, cls, positions, time_limit, *args, **kw):
            recorder.limits.append(time_limit)
            return original_analyse_with(problem, settings, cls, positions, time_limit, *args, **kw)

        def solve(model, solver="highs", *args, **kw):
            if model.integrality.any():  # MILPs (the relaxation-witness heuristic solves LPs with HiGHS)
                recorder.solves.append(solver)
            return original_solve(model, solver, *args, **kw)

        def screen(*args, **kw):
            recorder.screens += 1
            return original_screen(*args, **kw)

        def symbolic(problem, cls, positions, options=lucid.bounds.symbolic.ScreenOptions(), **kw):
            recorder.symbolic.append({"steps": options.steps, "device": options.device})
            return original_symbolic(problem, cls, positions, options, **kw)

        def symbolics(*args, **kw):  # the initial screen of several classes at once: no steps
            recorder.symbolic.append({"steps": 0, "device": kw.get("device", "cpu")})
            return original_symbolics(*args, **kw)

        def counted(name, fn):
            def wrapper(*args, **kw):
                recorder.searches[name] += 1
                return fn(*args, **kw)
            return wrapper

        def from_run(cls, run, **kw):
            problem = original_from_run(cls, run, **kw)
            recorder.problems.append(problem)
            return problem

        class Engine(lucid.bab.engine.Engine):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                recorder.engines.append(self)

        class Display:
            def __init__(self, title, enabled=True):
                recorder.displays.append(enabled)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def update(self, engine):
                pass

        monkeypatch.setattr(lucid.analysis.analyse, "analyse_node", analyse_node)
        monkeypatch.setattr(lucid.bab.workers, "analyse_with", analyse_with)
        monkeypatch.setattr(lucid.solvers, "solve", solve)
        monkeypatch.setattr(lucid.analysis.screen, "interval_screens", screen)
        monkeypatch.setattr(lucid.bounds.stack_screen, "symbolic_screen", symbolic)
        monkeypatch.setattr(lucid.bounds.stack_screen, "symbolic_screens", symbolics)
        monkeypatch.setattr(lucid.analysis.analyse, "search_node_witness", counted("node", lucid.analysis.analyse.search_node_witness))
        monkeypatch.setattr(lucid.witness.search, "search_class_witness",
                            counted("class", lucid.witness.search.search_class_witness))
        monkeypatch.setattr(lucid.witness.replay, "climb", counted("climb", lucid.witness.replay.climb))
        # the splitting tier's own climbs from where an unproved network's open domains peak
        for module in (lucid.bounds.relu_split, lucid.bounds.input_split):
            monkeypatch.setattr(module, "leaks_from", counted("split", module.leaks_from))
        monkeypatch.setattr(lucid.analysis.problem.VerificationProblem, "from_run", classmethod(from_run))
        monkeypatch.setattr(lucid.bab.engine, "Engine", Engine)
        monkeypatch.setattr("lucid.bab.display.LiveDisplay", Display)


def verify(run_dir, monkeypatch, *flags: str):
    rec = Recorder(monkeypatch)
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--workers", "1", *flags])
    assert result.exit_code == 0, result.output
    return rec


def first_limits(rec) -> list[float | None]:
    """The node attempts' time limits as the engine handed them to the node analysis (a small
    node's MILP tiers get them less the reserve of its targeted search)."""
    return rec.limits


# flag -> a check of what the part that uses it received
CASES = {
    "--solver": (["--solver", "scip"], lambda r: r.solves and set(r.solves) == {"scip"}
                 and all(n["settings"].solver == "scip" for n in r.nodes)),
    "--workers": ([], lambda r: r.engines[0].executor.capacity == 1),
    "--time-limit": (["--time-limit", "40"], lambda r: r.engines[0].settings.time_limit == 40.0
                     and all(t is not None and t <= 40.0 for t in first_limits(r))),
    "--node-time-limit": (["--node-time-limit", "7"], lambda r: r.nodes and first_limits(r)[0] == 7.0),
    "--classes": (["--classes", "1"], lambda r: {n["cls"] for n in r.nodes} == {1}
                  and sorted(r.engines[0].states) == [1]),
    "--tau": (["--tau", "0.25"], lambda r: r.nodes and all(n["encoding"].tau == 0.25 for n in r.nodes)),
    "--gap": (["--gap", "0.5"], lambda r: r.engines[0].settings.gap == 0.5),
    "--rel-gap": (["--rel-gap", "0.2"], lambda r: r.engines[0].settings.rel_gap == 0.2),
    "--no-md": (["--no-md"], lambda r: r.nodes and all(
        not (n["encoding"].md or n["encoding"].md_pre or n["encoding"].coupling) for n in r.nodes)),
    "--no-ris": (["--no-ris"], lambda r: r.nodes and all(not n["encoding"].ris for n in r.nodes)),
    "--no-bab": (["--no-bab"], lambda r: not r.engines[0].settings.bab and len(r.nodes) <= 2),
    "--naive": (["--naive"], lambda r: r.engines[0].settings.naive and all(
        len(e) == 1 for e in [[1]] * len(r.nodes)) and len(r.nodes) >= 6),
    "--no-screen": (["--no-screen", "--split-time", "0"], lambda r: r.screens == 0 and not r.symbolic),
    "--screen": (["--screen", "interval"], lambda r: r.screens > 0 and not r.symbolic
                 and r.engines[0].settings.screen == "interval"),
    # with the interval screen the root's hyper-network node runs its node-level search (the
    # defaults test shows it does), so the check below covers node and climb searches too
    "--no-search": (["--no-search", "--screen", "interval"], lambda r: sum(r.searches.values()) == 0
                    and all(not n["encoding"].search for n in r.nodes)),
    "--bounds": (["--bounds", "interval"], lambda r: r.problems[0].bounds_method == "interval"),
    "--split-time": (["--split-time", "7"], lambda r: r.nodes and all(n["settings"].split_time == 7.0 for n in r.nodes)),
    "--quiet": (["--quiet"], lambda r: r.displays == [False]),
}


@pytest.mark.parametrize("flag", sorted(CASES))
def test_every_verify_flag_reaches_its_consumer(run_dir, monkeypatch, flag):
    if flag == "--solver" and not lucid.solvers.available_solvers()["scip"]:
        pytest.skip("pyscipopt not installed")
    args, check = CASES[flag]
    for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (run_dir / stale).unlink(missing_ok=True)
    # without the ReLU-splitting tier but for its own flag and --no-search (the tier searches for
    # leaks too): on these networks it was most of each case's 1.8 s, and none of the other flags'
    # consumers is inside it (the defaults test below runs with it; CI time)
    with_tier = flag in ("--split-time", "--no-search")
    rec = verify(run_dir, monkeypatch, *args, *([] if with_tier else ["--split-time", "0"]))
    assert check(rec), (flag, rec.nodes[:2], rec.searches, rec.solves[:3])


def test_the_defaults_differ_from_every_flags_setting(run_dir, monkeypatch):
    """The checks above would pass vacuously if the default already had the flag's effect."""
    rec = verify(run_dir, monkeypatch)
    assert rec.engines[0].settings.screen == "optimised" and rec.symbolic and rec.symbolic[0]["steps"] == 0
    assert rec.screens > 0 and rec.searches["class"] > 0
    assert all(n["encoding"].md and n["encoding"].ris and n["encoding"].tau == 0.01 for n in rec.nodes)
    assert set(rec.solves) == {"highs"} and rec.problems[0].bounds_method == "lp" and rec.displays == [True]
    cfg = rec.engines[0].settings
    assert cfg.bab and not cfg.naive and cfg.gap == 0 and cfg.rel_gap == 0 and cfg.time_limit is None
    assert sorted(rec.engines[0].states) == [0, 1] and first_limits(rec)[0] is None
    for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (run_dir / stale).unlink(missing_ok=True)
    interval = verify(run_dir, monkeypatch, "--screen", "interval")  # the node-level searches run
    assert interval.searches["node"] + interval.searches["climb"] > 0


def test_resume_and_scheduler_reach_the_checkpoint_and_the_executor(run_dir, monkeypatch):
    import lucid.bab.dask_workers

    for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (run_dir / stale).unlink(missing_ok=True)
    verify(run_dir, monkeypatch, "--time-limit", "30")
    rec = verify(run_dir, monkeypatch, "--time-limit", "30", "--resume")
    assert rec.engines[0].settings.resume and all(cs.done for cs in rec.engines[0].states.values())
    assert rec.nodes == []  # everything was finished in the checkpoint

    seen = []

    class Dask:
        def __init__(self, problem, settings, scheduler, workers):
            seen.append((settings.scheduler, scheduler))
            raise LucidError("no cluster here")

    monkeypatch.setattr(lucid.bab.dask_workers, "DaskExecutor", Dask)
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--scheduler", "tcp://127.0.0.1:1"])
    assert isinstance(result.exception, LucidError) and seen == [("tcp://127.0.0.1:1", "tcp://127.0.0.1:1")]


@pytest.mark.parametrize("options, message", [
    ({"time_limit": 0}, "--time-limit must be a positive number"),
    ({"node_time_limit": -1.0}, "--node-time-limit must be a positive number"),
    ({"workers": 1.5}, "--workers must be a whole number"),
    ({"tau": math.nan}, "--tau must be a non-negative number"),
    ({"gap": -1}, "--gap must be a non-negative number"),
    ({"rel_gap": math.inf}, "--rel-gap must be a non-negative number"),
    ({"split_time": -1}, "--split-time must be a non-negative number"),
    ({"naive": True, "bab": False}, "--naive and --no-bab"),
    ({"solver": "cplex"}, "unknown solver 'cplex'"),
    ({"classes": "0,x"}, "class 'x' is not an integer"),
    ({"classes": ""}, "--classes is empty"),
    ({"bounds": "crown"}, "unknown bound method 'crown'"),
    ({"colour": "red"}, "unknown verify option(s): colour"),
    ({"screen": "crown"}, "unknown screen 'crown'"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"hyper": "agt:x"}, "unknown --hyper 'agt:x'"),
    ({"hyper": "box"}, "unknown --hyper 'box'"),
    ({"hyper": "agt:1", "resume": True}, "--resume cannot be combined with --hyper agt:1"),
    ({"hyper": "agt:2", "naive": True}, "--naive cannot be combined with --hyper agt:2"),
])
def test_bad_settings_are_one_error_line(options, message):
    with pytest.raises(LucidError) as info:
        VerifySettings.from_options(**options)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_one_error_line_before_any_work(run_dir):
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--device", "cuda"])
    assert isinstance(result.exception, LucidError) and "CUDA is not available" in str(result.exception)
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--no-screen", "--screen", "symbolic"])
    assert isinstance(result.exception, LucidError) and "contradict" in str(result.exception)


def test_screen_switch_keeps_its_old_boolean_meaning():
    assert VerifySettings(screen=False).screen == "none" and VerifySettings(screen=True).screen == "optimised"


def test_settings_are_frozen_and_serialisable():
    import dataclasses
    import json

    s = VerifySettings(classes="1,0", time_limit=5)
    assert s.classes == (0, 1) and s.time_limit == 5.0 and node_limit(s, Deadline(s.time_limit)) == 20.0
    assert node_limit(s, Deadline(600.0)) == 75.0  # a region's share of the run derives its own
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.solver = "gurobi"
    assert json.loads(json.dumps(s.to_json()))["classes"] == [0, 1]
    with pytest.raises(LucidError, match="unknown class 3"):
        s.__class__(classes="3").resolve_classes(2)


@pytest.mark.parametrize("scheduler, keeps", [(None, True), ("tcp://127.0.0.1:8786", False)])
def test_workers_keep_solver_trees_except_on_dask(monkeypatch, scheduler, keeps):
    import numpy as np

    import lucid.bab.workers
    from lucid.analysis.outcome import NodeOutcome

    seen = {}

    def analyse_node(problem, cls, positions, **kw):
        seen.update(kw)
        return NodeOutcome(upper=1.0, lower=None, witness=None, leaking_row=None, status="optimal", seconds=0.0)

    monkeypatch.setattr(lucid.analysis.analyse, "analyse_node", analyse_node)
    settings = VerifySettings(scheduler=scheduler, search=False)
    lucid.bab.workers.analyse_with(object(), settings, 0, np.array([1]), 5.0, -math.inf, 2, 3)
    assert seen["request"].keep_trees is keeps and seen["request"].attempt == 2 and seen["settings"] is settings
    assert seen["solver_options"].time_limit == 5.0 and seen["solver_options"].threads == 3


def test_the_log_records_the_whole_settings_object(run_dir, monkeypatch):
    from lucid.bab.events import read_events

    for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (run_dir / stale).unlink(missing_ok=True)
    rec = verify(run_dir, monkeypatch, "--rel-gap", "0.2", "--screen", "symbolic", "--tau", "0.05")
    started = next(e for e in read_events(run_dir / "verify.log.jsonl") if e["event"] == "started")
    assert started["settings"] == rec.engines[0].settings.to_json()
    assert started["settings"]["screen"] == "symbolic" and started["settings"]["rel_gap"] == 0.2


def test_settings_with_a_client_object_serialise_without_copying_it():
    class Client:  # stands in for a distributed.Client, which cannot be deep-copied
        def __deepcopy__(self, memo):
            raise TypeError("cannot copy a client")

        def __str__(self):
            return "<Client: tcp://10.0.0.1:8786>"

    out = VerifySettings(scheduler=Client()).to_json()
    assert out["scheduler"] == "<Client: tcp://10.0.0.1:8786>"
