"""`lucid log RUN`: render a verification log (table), follow it live, plot it, export the tree."""

from __future__ import annotations

import time
from pathlib import Path

import click

from lucid.errors import LucidError


def _fmt(v) -> str:
    from lucid.bab.display import fmt

    return fmt(v)


def _render(events: list[dict], max_rows: int):
    from rich.console import Group
    from rich.table import Table

    from lucid.bab.report import anytime_curves, node_summary

    curves = anytime_curves(events)
    summary = node_summary(events)
    parts = []
    for c in sorted(set(curves) | set(summary)):
        pts = curves.get(c, [])
        s = summary.get(c, {})
        secs = s.get("node_seconds", [])
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.get("statuses", {}).items())) or "-"
        done = s.get("done")
        state = "running" if done is None else ("complete" if done.get("complete") else "stopped") + f" ({done.get('reason')})"
        table = Table(
            title=(f"class {c}: {state}; nodes solved {s.get('solved', 0)}, split {s.get('split', 0)}, "
                   f"closed {s.get('closed', 0)}; seconds/node mean {sum(secs) / len(secs) if secs else 0:.2f} "
                   f"max {max(secs) if secs else 0:.2f}; statuses: {statuses}"),
            title_justify="left",
        )
        for col in ("t [s]", "lower", "upper", "gap", "upper/lower"):
            table.add_column(col, justify="right")
        shown = pts if len(pts) <= max_rows else [pts[int(i * (len(pts) - 1) / (max_rows - 1))] for i in range(max_rows)]
        for t, lo, up in shown:
            gap = None if lo is None or up is None else up - lo
            ratio = "-" if lo is None or up is None or lo <= 0 else f"{up / lo:.4f}"
            table.add_row(f"{t:.2f}", _fmt(lo), _fmt(up), _fmt(gap), ratio)
        parts.append(table)
    return Group(*parts)


@click.command("log", help="Render a verification log (table, plot, branch-and-bound tree).")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--follow", is_flag=True, help="Keep watching a running verification until it finishes.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a figure of the anytime [lower, upper] curves (e.g. FILE.png).")
@click.option("--tree", "tree_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Export the branch-and-bound tree as GraphML (networkx).")
@click.option("--rows", type=int, default=20, show_default=True, help="Anytime rows shown per class.")
def command(run_dir: Path, follow: bool, plot_path: Path | None, tree_path: Path | None, rows: int) -> None:
    from rich.console import Console

    from lucid.bab.events import LOG_FILE, read_events

    if rows < 2:
        raise LucidError("--rows must be at least 2")
    path = run_dir / LOG_FILE
    if not run_dir.is_dir():
        raise LucidError(f"run directory {run_dir} does not exist")
    if not path.exists():
        raise LucidError(f"{path} does not exist (run `lucid verify {run_dir}` first)")
    try:
        events = read_events(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise LucidError(f"cannot read {path}: {exc}") from None
    console = Console()
    if follow:
        from rich.live import Live

        with Live(_render(events, rows), console=console, refresh_per_second=2) as live:
            while not any(e.get("event") == "finished" for e in events):
                time.sleep(1.0)
                events = read_events(path)
                live.update(_render(events, rows))
    else:
        console.print(_render(events, rows))
    if plot_path is not None:
        from lucid.bab.report import plot_curves

        plot_curves(events, plot_path, title=str(run_dir))
        console.print(f"wrote {plot_path}")
    if tree_path is not None:
        from lucid.bab.report import write_tree

        n = write_tree(events, tree_path)
        console.print(f"wrote {tree_path} ({n} nodes)")
