"""`lucid log`: table, --follow on a finished run, --plot, --tree (GraphML of the BaB tree)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bab_fixtures import write_tiny_run
from lucid.bab.events import read_events
from lucid.cli import cli



@pytest.fixture(scope="module")
def verified_run(tmp_path_factory):
    from lucid.verify import verify_run

    run = write_tiny_run(tmp_path_factory.mktemp("log") / "run", networks=10, seed=2)
    result = verify_run(run, workers=1, ris=False, screen=False, search=False, split_time=0, progress=False)
    return run, result


def test_table_plot_and_tree(verified_run, tmp_path):
    import networkx as nx

    run, result = verified_run
    out = CliRunner().invoke(cli, ["log", str(run), "--follow", "--plot", str(tmp_path / "a.png"),
                                   "--tree", str(tmp_path / "t.graphml")])
    assert out.exit_code == 0, out.output
    assert "class 0" in out.output and "class 1" in out.output
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    g = nx.read_graphml(tmp_path / "t.graphml")
    events = read_events(run / "verify.log.jsonl")
    solved = {(e["class"], e["node"]) for e in events if e["event"] == "solved"}
    assert {(int(d["cls"]), int(d["node"])) for _, d in g.nodes(data=True) if "status" in d} == solved
    for c in result["bounds"]:
        nodes = [n for n, d in g.nodes(data=True) if int(d["cls"]) == int(c)]
        roots = [n for n in nodes if g.in_degree(n) == 0]
        assert len(roots) == 1 and int(g.nodes[roots[0]]["size"]) == 10
        for n in nodes:  # children partition (a subset of) their parent's networks
            kids = list(g.successors(n))
            if kids:
                assert sum(int(g.nodes[k]["size"]) for k in kids) <= int(g.nodes[n]["size"])
                assert all(float(g.nodes[k]["upper"]) <= float(g.nodes[n]["upper"]) + 1e-12 for k in kids)


def test_missing_log_is_a_one_line_error(tmp_path, capsys):
    from lucid.cli import main

    run = write_tiny_run(tmp_path / "run", networks=2)
    with pytest.raises(SystemExit) as exc:
        main(["log", str(run)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "verify.log.jsonl does not exist" in err and err.count("\n") == 1


def test_torn_last_line_is_ignored(verified_run, tmp_path):
    import shutil

    run, _ = verified_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with open(copy / "verify.log.jsonl", "a") as fh:
        fh.write('{"event": "solved", "t": 1')  # as left by kill -9 mid-write
    assert len(read_events(copy / "verify.log.jsonl")) == len(read_events(run / "verify.log.jsonl"))
    out = CliRunner().invoke(cli, ["log", str(copy)])
    assert out.exit_code == 0, out.output


def test_slowest_lists_each_node_profile(tmp_path):
    """A verification with the split/MILP race logs a profile per node; --slowest shows the slowest."""
    from lucid.verify import verify_run
    from lucid.bab.log_view import slowest_nodes

    run = write_tiny_run(tmp_path / "run", networks=10, seed=2)
    verify_run(run, workers=1, ris=False, search=True, split_race=True, rel_gap=0.0, progress=False)
    events = read_events(run / "verify.log.jsonl")
    solved = [e for e in events if e["event"] == "solved"]
    assert solved and all("profile" in e["stats"] for e in solved)
    rows = slowest_nodes(events, 3)
    assert [r["seconds"] for r in rows] == sorted((float(e["seconds"]) for e in solved), reverse=True)[:3]
    out = CliRunner().invoke(cli, ["log", str(run), "--slowest", "3"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "slowest node analyses" in out.output and "milp_root" in out.output
    from lucid.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["log", str(run), "--slowest", "-1"])
    assert exc.value.code == 2
