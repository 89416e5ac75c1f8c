"""`lucid log RUN`: render a verification log (table), follow it live, plot it, export the tree.

A run verified with `--regions K` also gets a table of its leaf boxes, and `--plot` draws those
boxes projected on two features (`--features`), coloured by one class's bound (`--class`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lucid.errors import LucidError

if TYPE_CHECKING:  # the report module pulls in numpy and the run directory code: only when used
    from lucid.regions.log_view import RegionView


def _fmt(v) -> str:
    from lucid.bab.display import fmt

    return fmt(v)


def _render(events: list[dict], max_rows: int, regions: RegionView | None = None):
    from rich.console import Group
    from rich.table import Table

    from lucid.bab.log_view import anytime_curves, node_summary

    curves = anytime_curves(events)
    summary = node_summary(events)
    # the domain's set as each class ended (a box's: the region table)
    residual = {e["class"]: e for e in events if "box" not in e and e.get("event") == "residual"}
    parts = []
    for c in sorted(set(curves) | set(summary)):
        pts = curves.get(c, [])
        s = summary.get(c, {})
        secs = s.get("node_seconds", [])
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.get("statuses", {}).items())) or "-"
        done = s.get("done")
        state = (
            "running"
            if done is None
            else ("complete" if done.get("complete") else "stopped")
            + f" ({done.get('reason')}"
            + (f" in {done['stopped_in']})" if done.get("stopped_in") else ")")
        )
        table = Table(
            title=(
                f"class {c}: {state}; nodes solved {s.get('solved', 0)}, split {s.get('split', 0)}, "
                f"closed {s.get('closed', 0)}; seconds/node mean {sum(secs) / len(secs) if secs else 0:.2f} "
                f"max {max(secs) if secs else 0:.2f}; statuses: {statuses}"
            ),
            title_justify="left",
            caption=_residual_caption(residual.get(c)),
            caption_justify="left",
        )
        for col in ("t [s]", "lower", "upper", "gap", "upper/lower"):
            table.add_column(col, justify="right")
        shown = (
            pts if len(pts) <= max_rows else [pts[int(i * (len(pts) - 1) / (max_rows - 1))] for i in range(max_rows)]
        )
        for t, lo, up in shown:
            gap = None if lo is None or up is None else up - lo
            ratio = "-" if lo is None or up is None or lo <= 0 else f"{up / lo:.4f}"
            table.add_row(f"{t:.2f}", _fmt(lo), _fmt(up), _fmt(gap), ratio)
        parts.append(table)
    if regions is not None:
        parts.append(_region_table(regions))
    return Group(*parts)


def _residual_caption(event: dict | None) -> str | None:
    """With --residual M: what the upper column is, who holds the level, and the set's bounds."""
    if event is None:
        return None
    ranked = event.get("bounds") or []
    shown = ", ".join(_fmt(b) for b in ranked[:8]) + (f", … {_fmt(ranked[-1])}" if len(ranked) > 8 else "")
    holder = event.get("holder")
    held = (
        "no network is left outside the set"
        if holder is None
        else f"held by the network without row {holder['row']} (bound {_fmt(holder['bound'])}, best leak "
        f"{_fmt(holder['leak'])})"
    )
    level = event.get("level")
    leaking = sum(1 for v in event.get("leaks") or [] if level is not None and v is not None and v > level)
    return (
        f"upper is the level L_c, the ({event.get('size')}+1)-th largest network bound, {held}; the set's "
        f"{len(event.get('positions') or [])} networks (checked at query time), proven bounds highest first: "
        f"{shown or '-'}; {leaking} of them leak above the level."
    )


def _slowest_table(events: list[dict], count: int):
    """The slowest node analyses and their profiles (`lucid.bab.log_view.slowest_nodes`)."""
    from rich.table import Table

    from lucid.bab.log_view import PROFILE_COLUMNS, slowest_nodes

    table = Table(
        title=f"the {count} slowest node analyses (seconds per tier; - : the tier did not run)",
        title_justify="left",
        caption="race: which tier settled a singleton run with --split-race (split, milp, or - : neither)",
        caption_justify="left",
    )
    for col in (
        "class",
        "node",
        "size",
        "status",
        *PROFILE_COLUMNS,
        "split upper",
        "MILP upper",
        "upper",
        "lower",
        "race",
    ):
        table.add_column(col, justify="right")
    for r in slowest_nodes(events, count):
        secs = ["-" if r[k] is None else f"{float(r[k]):.2f}" for k in PROFILE_COLUMNS]
        table.add_row(
            str(r["class"]),
            str(r["node"]),
            str(r["size"]),
            str(r["status"]),
            *secs,
            _fmt(r["split_upper"]),
            _fmt(r["milp_upper"]),
            _fmt(r["upper"]),
            _fmt(r["lower"]),
            r["race"] or "-",
        )
    return table


WIDE_CLASSES = 4  # more classes than this: one row per box and class (a column each would not fit)


def _region_table(view: RegionView):
    """One row per leaf box: where it is, and per class `upper / lower` of its bound (with more than
    `WIDE_CLASSES` classes, one row per box and class whose bound there is below the domain's, which
    is where the boxes release more than one bound per class)."""
    from rich.table import Table

    from lucid.regions.log_view import region_rows

    tree = view.tree
    by_class = tree.num_classes > WIDE_CLASSES
    what = (
        "the classes whose bound in a box is below the domain's (the other classes of a box keep the "
        "domain's bound). bound / leak"
        if by_class
        else "class c"
    )
    table = Table(
        title=(
            f"regions: {len(tree.leaves())} boxes, depth {tree.depth} (from {view.source}; thresholds in data units)"
        ),
        title_justify="left",
        caption=(
            f"{what}: the bound proved in the box / the best leak found there (- : none); * : its "
            "verification stopped before it finished (the bound is still sound). seconds - : not "
            "verified yet, the box keeps its parent's bound."
            + (
                " With --residual M the bound is the box's level over the networks outside its own "
                "residual sets (those are checked at query time)."
                if tree.residual_sets()
                else ""
            )
        ),
        caption_justify="left",
    )
    classes = ["class", "bound / leak"] if by_class else [f"class {c}" for c in range(tree.num_classes)]
    for name in ("box", "depth", *classes, "seconds"):
        table.add_column(name, justify="right", no_wrap=by_class or name.startswith("class "))
    # Last, so that on a narrow terminal only the longest column wraps and the numbers stay aligned.
    table.add_column("box constraints")
    domain = tree.release_bounds()[0]
    for row in region_rows(view):
        seconds = f"{row.seconds:.2f}" if row.verified else "-"
        if not by_class:
            table.add_row(
                str(row.box),
                str(row.depth),
                *(_bound_cell(row, c) for c in range(tree.num_classes)),
                seconds,
                row.description,
            )
            continue
        for c in (c for c in range(tree.num_classes) if row.upper[c] < domain[c]):
            table.add_row(str(row.box), str(row.depth), str(c), _bound_cell(row, c), seconds, row.description)
    return table


def _bound_cell(row, c: int) -> str:
    """`upper / lower` of class `c` in a box, `*` where its verification stopped before it finished."""
    return f"{_fmt(row.upper[c])} / {_fmt_lower(row.lower[c])}{'' if row.complete[c] else ' *'}"


def _fmt_lower(v: float) -> str:
    return "-" if v == float("-inf") else _fmt(v)  # -inf: no leak found in this box


def _regions_or_none(run_dir: Path, events: list[dict]) -> RegionView | None:
    from lucid.regions.log_view import load_regions

    return load_regions(run_dir, events)


def _region_plot_choice(view: RegionView, features: str | None, cls: int | None) -> tuple[tuple[int, int], int]:
    """(features, class) of the region plot: the user's, checked, or the defaults."""
    from lucid.regions.log_view import default_class, default_features, parse_features

    chosen = default_features(view.tree) if features is None else parse_features(features, view)
    c = default_class(view.tree) if cls is None else cls
    if not 0 <= c < view.tree.num_classes:
        raise LucidError(
            f"--class {c} is out of range (the run has {view.tree.num_classes} classes: 0..{view.tree.num_classes - 1})"
        )
    return chosen, c


def _check_region_options(
    features: str | None, cls: int | None, plot_path: Path | None, view: RegionView | None, events: list[dict]
) -> None:
    if features is None and cls is None:
        return
    if plot_path is None:
        raise LucidError("--features and --class choose what --plot draws: give --plot FILE too")
    if view is None and not _regions_started(events):
        _no_regions("this run has no regions")


def _regions_started(events: list[dict]) -> bool:
    """The log's latest run was started with --regions (its boxes may not be logged yet)."""
    starts = [e for e in events if e.get("event") in ("started", "resumed")]
    return bool(starts and starts[-1].get("regions"))


def _no_regions(why: str) -> None:
    raise LucidError(f"--features and --class need a run verified with `lucid verify --regions K`; {why}")


@click.command("log", help="Render a verification log (table, plot, branch-and-bound tree).")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--follow", is_flag=True, help="Keep watching a running verification until it finishes.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a figure (e.g. FILE.png): the anytime [lower, upper] curves, or for a run "
    "verified with --regions its boxes.",
)
@click.option(
    "--features",
    default=None,
    metavar="I,J",
    help="Region plot: the two features to project the boxes on (index or name) [default: the two split most often].",
)
@click.option(
    "--class",
    "cls",
    type=int,
    default=None,
    help="Region plot: the class whose bound colours the boxes [default: the class whose box bounds differ most].",
)
@click.option(
    "--tree",
    "tree_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Export the branch-and-bound tree as GraphML (networkx).",
)
@click.option("--rows", type=int, default=20, show_default=True, help="Anytime rows shown per class.")
@click.option(
    "--slowest",
    type=int,
    default=0,
    show_default=True,
    metavar="N",
    help="Also list the N slowest node analyses with where their time went (split tier, leak "
    "search, bound tightening, MILP root and tree) and the bound of each tier.",
)
def command(
    run_dir: Path,
    follow: bool,
    plot_path: Path | None,
    features: str | None,
    cls: int | None,
    tree_path: Path | None,
    rows: int,
    slowest: int,
) -> None:
    from rich.console import Console

    from lucid.bab.events import LOG_FILE, read_events

    if rows < 2:
        raise LucidError("--rows must be at least 2")
    if slowest < 0:
        raise LucidError("--slowest must be 0 or more")
    path = run_dir / LOG_FILE
    if not run_dir.is_dir():
        raise LucidError(f"run directory {run_dir} does not exist")
    if not path.exists():
        raise LucidError(f"{path} does not exist (run `lucid verify {run_dir}` first)")
    try:
        events = read_events(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise LucidError(f"cannot read {path}: {exc}") from None
    regions = _regions_or_none(run_dir, events)
    # Bad plot options fail before anything is printed or followed.
    _check_region_options(features, cls, plot_path, regions, events)
    if plot_path is not None:
        from lucid.bab.log_view import figure_format

        figure_format(plot_path)
        if regions is not None:
            _region_plot_choice(regions, features, cls)
    console = Console()
    if follow:
        from rich.live import Live

        with Live(_render(events, rows, regions), console=console, refresh_per_second=2) as live:
            while not any(e.get("event") == "finished" for e in events):
                time.sleep(1.0)
                events = read_events(path)
                regions = _regions_or_none(run_dir, events)
                live.update(_render(events, rows, regions))
    else:
        console.print(_render(events, rows, regions))
    if slowest:
        console.print(_slowest_table(events, slowest))
    if plot_path is not None:
        _write_plot(run_dir, events, regions, plot_path, features, cls)
        console.print(f"wrote {plot_path}")
    if tree_path is not None:
        from lucid.bab.log_view import write_tree

        n = write_tree(events, tree_path)
        console.print(f"wrote {tree_path} ({n} nodes)")


def _write_plot(
    run_dir: Path,
    events: list[dict],
    regions: RegionView | None,
    plot_path: Path,
    features: str | None,
    cls: int | None,
) -> None:
    from lucid.bab.log_view import plot_curves
    from lucid.regions.log_view import plot_regions

    if regions is None:
        if features is not None or cls is not None:  # a --regions run with no box logged yet
            _no_regions("no box of this run is verified yet")
        plot_curves(events, plot_path, title=str(run_dir))
        return
    chosen, c = _region_plot_choice(regions, features, cls)
    plot_regions(regions, plot_path, chosen, c, title=run_dir.name)
