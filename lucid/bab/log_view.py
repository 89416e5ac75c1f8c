"""Reading a verification log back: anytime curves, node statistics, the branch-and-bound tree
(the boxes of `lucid verify --regions K`: lucid/regions/log_view.py)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from lucid.atomic import write_atomic
from lucid.bab.events import parse_float
from lucid.errors import LucidError


def anytime_curves(events: list[dict]) -> dict[int, list[tuple[float, float | None, float | None]]]:
    """Per class: [(t, lower, upper)] at every anytime update, in log order. With --residual M the
    upper is the level and the lower its floor, the (M+1)-th largest leak (lucid/bab/order_statistic.py)."""
    curves: dict[int, list] = defaultdict(list)
    for e in events:
        if e.get("class") is not None and e.get("event") == "anytime":
            curves[int(e["class"])].append((float(e["t"]), parse_float(e.get("lower")), parse_float(e.get("upper"))))
    return dict(curves)


def node_summary(events: list[dict]) -> dict[int, dict]:
    """Per class: solved/split/closed counts, time per node, statuses, final bounds if finished."""
    out: dict[int, dict] = defaultdict(
        lambda: {"solved": 0, "split": 0, "closed": 0, "node_seconds": [], "statuses": defaultdict(int), "done": None}
    )
    for e in events:
        c = e.get("class")
        if c is None:
            continue
        s = out[int(c)]
        kind = e.get("event")
        if kind == "solved":
            s["solved"] += 1
            s["node_seconds"].append(float(e.get("seconds") or 0.0))
            s["statuses"][str(e.get("status"))] += 1
        elif kind in ("split", "closed"):
            s[kind] += 1
        elif kind == "class_done":
            s["done"] = e
    return dict(out)


PROFILE_COLUMNS = ("total", "split", "search", "obbt", "milp_root", "milp_tree")


def slowest_nodes(events: list[dict], count: int) -> list[dict]:
    """The `count` slowest node analyses (one per `solved` event, retries apart), slowest first:
    class, node, size, seconds, status, the node's profile (`lucid.analysis.analyse._profiled`:
    seconds per tier and each tier's bound) and the bounds the engine kept."""
    rows: list[dict[str, Any]] = []
    for e in events:
        if e.get("event") != "solved" or e.get("class") is None:
            continue
        prof = (e.get("stats") or {}).get("profile") or {}
        rows.append(
            {
                "class": int(e["class"]),
                "node": int(e["node"]),
                "size": int(e.get("size") or 0),
                "seconds": float(e.get("seconds") or 0.0),
                "status": e.get("status"),
                "upper": parse_float(e.get("upper")),
                "lower": parse_float(e.get("lower")),
                **{k: prof.get(k) for k in PROFILE_COLUMNS},
                "split_upper": parse_float(prof.get("split_upper")),
                "milp_upper": parse_float(prof.get("milp_upper")),
                "race": prof.get("race"),
            }
        )
    rows.sort(key=lambda r: -r["seconds"])
    return rows[:count]


def bab_tree(events: list[dict]):
    """The branch-and-bound tree as a networkx DiGraph (node key 'c<class>:<id>')."""
    import networkx as nx

    g = nx.DiGraph()
    for e in events:
        if e.get("class") is None or "node" not in e:
            continue
        key = f"c{e['class']}:{e['node']}"
        attrs = g.nodes[key] if key in g else {}
        if key not in g:
            g.add_node(key, cls=int(e["class"]), node=int(e["node"]), size=int(e.get("size") or 0), state="queued")
            attrs = g.nodes[key]
        kind = e["event"]
        if kind in ("queued", "started", "solved", "split", "closed", "final", "retry"):
            attrs["state"] = kind
        for name in ("upper", "lower", "milp_upper"):
            v = e.get(name)
            if v is not None:
                attrs[name] = float(v)  # GraphML has no null: absent means unknown
        if e.get("status") is not None:
            attrs["status"] = str(e["status"])
        if e.get("seconds") is not None and kind == "solved":
            attrs["seconds"] = float(e["seconds"])
        if kind == "queued" and e.get("parent") is not None:
            g.add_edge(f"c{e['class']}:{e['parent']}", key)
    return g


def write_tree(events: list[dict], path: str | Path) -> int:
    import networkx as nx

    g = bab_tree(events)
    for _, attrs in g.nodes(data=True):
        for k, v in list(attrs.items()):
            if isinstance(v, float) and math.isinf(v):
                attrs[k] = 1e308 if v > 0 else -1e308  # GraphML readers choke on inf
    write_atomic(path, lambda tmp: nx.write_graphml(g, tmp))
    return g.number_of_nodes()


def plot_curves(events: list[dict], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = anytime_curves(events)
    fig, axes = plt.subplots(1, max(1, len(curves)), figsize=(5 * max(1, len(curves)), 3.6), squeeze=False)
    for ax, (c, pts) in zip(axes[0], sorted(curves.items()), strict=False):
        t = [p[0] for p in pts]
        up = [p[2] if p[2] is not None and math.isfinite(p[2]) else math.nan for p in pts]
        lo = [p[1] if p[1] is not None else math.nan for p in pts]
        ax.step(t, up, where="post", label="upper (proved)")
        ax.step(t, lo, where="post", label="lower (witness)")
        ax.set_title(f"class {c}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("iDP decision bound")
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)


def figure_format(path: str | Path) -> str:
    """The format a figure path's suffix names (png without one); an unknown suffix is the user's
    typo, so it is one error line (checked before any work) rather than matplotlib's traceback."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    if suffix not in FigureCanvasBase.get_supported_filetypes():
        raise LucidError(f"cannot write a figure as .{suffix} ({path}); use e.g. .png, .pdf or .svg")
    return suffix


def save_figure(fig, path: str | Path) -> None:
    suffix = figure_format(path)
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=suffix, dpi=110))
