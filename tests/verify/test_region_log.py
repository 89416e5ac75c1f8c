"""`lucid log` on a run verified with `--regions K`: the table of leaf boxes, the box plot, bad options."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from bab_fixtures import write_tiny_run
from lucid.bab.display import fmt
from lucid.regions.log_view import (
    RegionView,
    default_class,
    default_features,
    describe_box,
    region_rectangles,
)
from lucid.cli import cli, main
from lucid.regions import RegionTree

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WIDE = {"COLUMNS": "250"}  # no wrapped cells, so every table row is one line


@pytest.fixture(scope="module")
def region_run(tmp_path_factory):
    from lucid.verify import verify_run

    run = write_tiny_run(tmp_path_factory.mktemp("regions") / "run", networks=8, seed=3)
    verify_run(run, regions=6, time_limit=30, workers=1, split_time=0, progress=False)  # the tree is what matters
    return run


def _leaves(run) -> list[dict]:
    nodes = json.loads((run / "bounds.json").read_text())["regions"]["nodes"]
    return [n for n in nodes if n["split"] is None]


def _depth(nodes: dict[int, dict], i: int) -> int:
    return 0 if nodes[i]["parent"] is None else 1 + _depth(nodes, nodes[i]["parent"])


def _expected_box(node: dict, nodes: dict[int, dict]) -> str:
    # The fixture's domain is [0, 1]^2 with the identity scaler: data units are network units.
    parent = None if node["parent"] is None else nodes[node["parent"]]
    carve = parent is not None and "box" in parent["split"]
    if carve and node["id"] == parent["split"]["left"]:  # the rest of a carved box
        return f"{_expected_box(parent, nodes)}, outside box {parent['split']['right']}"
    terms = []
    for f, (lo, hi) in enumerate(zip(node["lower"], node["upper"])):
        below = "<=" if carve and hi < parent["upper"][f] else "<"  # a carved box is closed
        if lo > 0 and hi < 1:
            terms.append(f"{lo:.5g} <= x{f} {below} {hi:.5g}")
        elif lo > 0:
            terms.append(f"x{f} >= {lo:.5g}")
        elif hi < 1:
            terms.append(f"x{f} {below} {hi:.5g}")
    return ", ".join(terms) or "whole domain"


def _expected_rows(run) -> dict[int, list[str]]:
    nodes = {n["id"]: n for n in json.loads((run / "bounds.json").read_text())["regions"]["nodes"]}
    rows = {}
    for leaf in _leaves(run):
        cells = [str(leaf["id"]), str(_depth(nodes, leaf["id"]))]
        for c in sorted(leaf["bounds"], key=int):
            b = leaf["bounds"][c]
            up = "+inf" if b["upper"] is None else fmt(b["upper"])
            low = "-" if b["lower"] is None else fmt(b["lower"])
            cells.append(f"{up} / {low}{'' if b['complete'] else ' *'}")
        cells += [f"{leaf['seconds']:.2f}" if leaf["verified"] else "-", _expected_box(leaf, nodes)]
        rows[leaf["id"]] = cells
    return rows


def _table_rows(output: str) -> dict[int, list[str]]:
    """The region table's body rows (their first cell is a box id), cell by cell."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 2 and cells[0].isdigit() and cells[1].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_table_lists_exactly_the_leaves_with_their_bounds(region_run):
    out = CliRunner(env=WIDE).invoke(cli, ["log", str(region_run)])
    assert out.exit_code == 0, out.output
    leaves = _leaves(region_run)
    assert 1 < len(leaves) <= 6
    assert f"regions: {len(leaves)} boxes" in out.output and "from bounds.json" in out.output
    assert _table_rows(out.output) == _expected_rows(region_run)


def test_table_of_a_run_still_going_comes_from_the_log(region_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(region_run, copy)
    (copy / "bounds.json").unlink()
    log = (copy / "verify.log.jsonl").read_text().splitlines()
    without_finish = [line for line in log if json.loads(line)["event"] != "finished"]
    (copy / "verify.log.jsonl").write_text("\n".join(without_finish) + "\n")
    out = CliRunner(env=WIDE).invoke(cli, ["log", str(copy)])
    assert out.exit_code == 0, out.output
    assert "from the log" in out.output
    # Every box's bounds are in the log: the same table as bounds.json's.
    assert _table_rows(out.output) == _expected_rows(region_run)

    # Cut just after the second split: its children are not verified yet and keep their parent's
    # upper bound, with no leak of their own and not complete.
    events = [json.loads(line) for line in log]
    cut = [i for i, e in enumerate(events) if e["event"] == "region_split"][1]
    (copy / "verify.log.jsonl").write_text("\n".join(log[:cut + 1]) + "\n")
    out = CliRunner(env=WIDE).invoke(cli, ["log", str(copy)])
    assert out.exit_code == 0, out.output
    rows = _table_rows(out.output)
    splits = [e for e in events[:cut + 1] if e["event"] == "region_split"]
    made = {0} | {c for e in splits for c in e["children"]}
    assert set(rows) == made - {e["box"] for e in splits}
    nodes = {n["id"]: n for n in json.loads((region_run / "bounds.json").read_text())["regions"]["nodes"]}
    parent = nodes[splits[-1]["box"]]["bounds"]
    for child in splits[-1]["children"]:
        assert rows[child][2:4] == [f"{'+inf' if parent[c]['upper'] is None else fmt(parent[c]['upper'])} / - *"
                                    for c in ("0", "1")]
        assert rows[child][4] == "-"  # seconds: not verified yet
    verified = {e["box"] for e in events[:cut + 1] if e["event"] == "region"}
    assert all((rows[box][4] != "-") == (box in verified) for box in rows)  # the others as far as the log goes


def test_plot_draws_the_boxes_as_png(region_run, tmp_path):
    import matplotlib.image

    for args in ([], ["--features", "x1,0", "--class", "1"]):
        path = tmp_path / f"boxes{len(args)}.png"
        out = CliRunner(env=WIDE).invoke(cli, ["log", str(region_run), "--plot", str(path), *args])
        assert out.exit_code == 0, out.output
        assert f"wrote {path}" in out.output.replace("\n", "")
        assert path.read_bytes()[:8] == PNG_MAGIC
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind


@pytest.mark.parametrize("args, message", [
    (["--features", "0,5"], "feature 5 is out of range"),
    (["--features", "0"], "takes two features"),
    (["--features", "0,1,2"], "takes two features"),
    (["--features", "1,1"], "two different features"),
    (["--features", "age,0"], "'age' is neither"),
    (["--class", "2"], "--class 2 is out of range"),
    (["--class", "-1"], "--class -1 is out of range"),
    (["--class", "one"], "is not a valid integer"),
])
def test_bad_plot_options_are_one_line_errors(region_run, tmp_path, capsys, args, message):
    path = tmp_path / "never.png"
    with pytest.raises(SystemExit) as exc:
        main(["log", str(region_run), "--plot", str(path), *args])
    captured = capsys.readouterr()
    assert exc.value.code == 2
    assert captured.err.startswith("lucid: error:") and captured.err.count("\n") == 1
    assert message in captured.err
    assert captured.out == "" and not path.exists()  # checked before anything is printed or drawn


def test_features_without_plot_is_an_error(region_run, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["log", str(region_run), "--features", "0,1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--plot" in err and err.count("\n") == 1


def test_features_on_a_run_without_regions(tmp_path, capsys):
    run = write_tiny_run(tmp_path / "run", networks=2)
    (run / "verify.log.jsonl").write_text(json.dumps({"event": "started", "t": 0.0, "class": None}) + "\n")
    out = CliRunner().invoke(cli, ["log", str(run)])
    assert out.exit_code == 0, out.output
    assert "regions:" not in out.output
    with pytest.raises(SystemExit) as exc:
        main(["log", str(run), "--plot", str(tmp_path / "a.png"), "--features", "0,1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "has no regions" in err and err.count("\n") == 1
    assert not (tmp_path / "a.png").exists()


def test_follow_on_a_finished_region_run(region_run):
    out = CliRunner(env=WIDE).invoke(cli, ["log", str(region_run), "--follow"])
    assert out.exit_code == 0, out.output
    assert set(_table_rows(out.output)) == {leaf["id"] for leaf in _leaves(region_run)}


# --- the projection and the defaults, on a hand-made 3-feature tree ---------------------------------
def _view(scale: np.ndarray | None = None) -> RegionView:
    """Root split on x2 at 0.5; its left half split on x0 at 0.25, that left part again on x0."""
    tree = RegionTree(np.zeros(3), np.ones(3), num_classes=2)
    left, right = tree.split(0, 2, 0.5)
    a, b = tree.split(left, 0, 0.25)
    tree.split(a, 0, 0.1)
    for node, bounds in zip(tree.leaves(), ([0.3, 0.1], [0.2, 0.1], [0.5, 0.1], [np.inf, 0.1])):
        tree.record(node, np.array(bounds), np.full(2, -np.inf))
    scale = np.ones(3) if scale is None else scale
    return RegionView(tree, "test", ("x0", "x1", "x2"), np.zeros(3), scale)


def test_boxes_that_do_not_constrain_a_feature_span_its_axis():
    view = _view()
    rects = {r[0]: r[1:] for r in region_rectangles(view, (0, 1), cls=0)}
    right = view.tree.children[0][1]  # constrains x2 only: the whole (x0, x1) square
    assert rects[right][:4] == (0.0, 1.0, 0.0, 1.0)
    for box, (x0, x1, y0, y1, _) in rects.items():
        lo, hi = view.tree.box(box)
        assert (x0, x1) == (lo[0], hi[0]) and (y0, y1) == (0.0, 1.0)
    # Drawn lowest bound first, nothing proved (+inf) last: the worst bound shows where they overlap.
    order = [r[5] for r in region_rectangles(view, (0, 2), cls=0)]
    assert order == sorted(order) and order[-1] == np.inf


def test_defaults_pick_the_most_split_features_and_the_most_varied_class():
    view = _view()
    assert default_features(view.tree) == (0, 2)  # x0 split twice, x2 once, x1 never
    assert default_class(view.tree) == 0  # class 1's leaf bounds are all equal


def test_box_description_is_in_data_units_and_follows_a_negative_scale():
    view = _view()
    a = view.tree.children[view.tree.children[view.tree.children[0][0]][0]][1]  # 0.1 <= x0 < 0.25, x2 < 0.5
    assert describe_box(view, a) == "0.1 <= x0 < 0.25, x2 < 0.5"
    assert describe_box(view, 0) == "whole domain"
    # x_net = (x - 0) * -2: x_net < 0.5 is x > -0.25, and 0.1 <= x_net is x <= -0.05.
    flipped = _view(scale=np.array([-2.0, 1.0, -2.0]))
    assert describe_box(flipped, a) == "-0.125 < x0 <= -0.05, x2 > -0.25"


def test_with_many_classes_the_table_lists_each_box_and_class_below_the_domains_bound():
    from rich.console import Console

    from lucid.regions.log_view import RegionView
    from lucid.cli.log import WIDE_CLASSES, _region_table

    classes = WIDE_CLASSES + 2
    tree = RegionTree(np.zeros(2), np.ones(2), classes)
    none = np.full(classes, -np.inf)
    tree.record(0, np.full(classes, 5.0), none)
    left, right = tree.split(0, 0, 0.5)
    below = np.full(classes, 5.0)
    below[[1, 4]] = [0.25, -1.0]
    tree.record(left, below, none)
    view = RegionView(tree, "bounds.json", ("a", "b"), np.zeros(2), np.ones(2))
    console = Console(width=200, record=True)
    console.print(_region_table(view))
    rows = [[c.strip() for c in line.strip().strip("│").split("│")] for line in console.export_text().splitlines()]
    rows = [r for r in rows if len(r) > 3 and r[0].isdigit()]
    assert [(int(r[0]), int(r[2]), r[3]) for r in rows] == [(left, 1, f"{fmt(0.25)} / - *"), (left, 4, f"{fmt(-1.0)} / - *")]
