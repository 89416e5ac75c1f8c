"""The boxes of `lucid verify --regions K` as `lucid log` shows them: the leaf table (thresholds in
the data's units) and a map of the boxes' bounds projected on two features."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lucid.atomic import read_json
from lucid.bab.log_view import save_figure
from lucid.errors import LucidError
from lucid.regions import RegionTree
from lucid.regions.reader import read_regions
from lucid.rundir import BOUNDS_FILE, Run, open_run, read_scaler

REGION_EVENTS = ("region", "region_split")


@dataclass(frozen=True)
class RegionView:
    """A run's region tree with what it takes to show its boxes in the data's units: the run's
    feature names and its affine scaler (thresholds are stored in the networks' input space)."""

    tree: RegionTree
    source: str  # where the tree was read: bounds.json, or the log of a run still going
    names: tuple[str, ...]
    offset: np.ndarray
    scale: np.ndarray

    def to_data(self, feature: int, value: float) -> float:
        return float(self.offset[feature] + value / self.scale[feature])

    def data_interval(self, feature: int, lo: float, hi: float) -> tuple[float, float]:
        """[lo, hi] of the network space in data units, ordered (a negative scale flips it)."""
        a, b = self.to_data(feature, lo), self.to_data(feature, hi)
        return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class RegionRow:
    """One leaf box as `lucid log` lists it."""

    box: int
    depth: int
    description: str  # the constrained features only, in data units; "whole domain" for the root
    upper: np.ndarray  # [C] +inf: nothing proved
    lower: np.ndarray  # [C] -inf: no leak found
    complete: np.ndarray  # [C]
    verified: bool
    seconds: float


def has_region_events(events: list[dict]) -> bool:
    return any(e.get("event") in REGION_EVENTS for e in events)


def load_regions(run_dir: str | Path, events: list[dict]) -> RegionView | None:
    """The run's boxes, or None when it was not verified with --regions. bounds.json is the result
    once the log's run finished (it is what `lucid serve` uses); while a run is going, or if it was
    killed, only the log knows its boxes."""
    run_dir = Path(run_dir)
    section = _bounds_regions(run_dir)
    logged = has_region_events(events)
    if section is None and not logged:
        return None
    run = open_run(run_dir)
    lower, upper = run.domain
    finished = any(e.get("event") == "finished" for e in events)
    if section is not None and (finished or not logged):
        tree = read_regions(section, lower, upper, run.num_classes, str(run_dir / BOUNDS_FILE))
        source = BOUNDS_FILE
    else:
        tree = region_tree_from_events(events, lower, upper, run.num_classes)
        source = "the log: the run has not finished"
    offset, scale = _display_scaler(run)
    names = (run.meta.get("data") or {}).get("feature_names")
    if not isinstance(names, list) or len(names) != run.input_dim:  # else it names nothing reliably
        names = [f"x{i}" for i in range(run.input_dim)]
    return RegionView(tree, source, tuple(str(n) for n in names), offset, scale)


def _bounds_regions(run_dir: Path) -> dict | None:
    path = run_dir / BOUNDS_FILE
    if not path.exists():
        return None
    doc = read_json(path, missing=f"{path} does not exist", unreadable=f"{path} is corrupt")
    return doc.get("regions") if isinstance(doc, dict) else None


def _display_scaler(run: Run) -> tuple[np.ndarray, np.ndarray]:
    offset, scale = read_scaler(run)
    # A zero scale (a constant feature) has no data units to map back to: show network units.
    zero = scale == 0
    return np.where(zero, 0.0, offset), np.where(zero, 1.0, scale)


def region_tree_from_events(events: list[dict], lower: np.ndarray, upper: np.ndarray, num_classes: int) -> RegionTree:
    """The boxes as the log has them so far: splits in log order, each box's bounds from its
    `region` event; a box not verified yet keeps its parent's bound, as the verifier's tree does."""
    tree = RegionTree(lower, upper, num_classes)
    for e in events:
        try:
            if e.get("event") == "region_split":
                _replay_split(tree, e)
            elif e.get("event") == "region":
                _replay_box(tree, e)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed line (hand-edited log) must not hide the rest of the tree
    return tree


def _replay_split(tree: RegionTree, e: dict) -> None:
    node = int(e["box"])
    # Killed between logging a split and checkpointing it, a resumed run logs the split again.
    if 0 <= node < len(tree) and tree.is_leaf(node):
        if "lower" in e:  # a carve
            tree.carve(node, np.asarray(e["lower"], dtype=np.float64), np.asarray(e["upper"], dtype=np.float64))
        else:
            tree.split(node, int(e["feature"]), float(e["threshold"]))


def _replay_box(tree: RegionTree, e: dict) -> None:
    node = int(e["box"])
    if not 0 <= node < len(tree):
        return
    ones = np.ones(tree.num_classes, dtype=bool)
    if e.get("skipped"):  # every class's bound was already <= 0 here: kept, nothing to do
        tree.record(node, tree.bound_upper[node], tree.bound_lower[node], 0.0, ones)
    else:
        # Mirrors the verifier: a class absent from the event was not searched in this box and
        # keeps its inherited bound (<= 0, so it is complete); lower: no leak found there.
        upper = tree.bound_upper[node].copy()
        complete = ~(upper > 0)
        lower = np.full(tree.num_classes, -np.inf)
        for key, value in (e.get("upper") or {}).items():
            upper[int(key)] = np.inf if value is None else float(value)
        for key, value in (e.get("lower") or {}).items():
            lower[int(key)] = -np.inf if value is None else float(value)
        for key, value in (e.get("complete") or {}).items():
            complete[int(key)] = bool(value)
        tree.record(node, upper, lower, 0.0, complete)
    tree.seconds[node] += float(e.get("seconds") or 0.0)  # a screened box is logged again when deepened


def describe_box(view: RegionView, node: int) -> str:
    """The features the box constrains, in data units: `x0 < 0.5, 0.1 <= x1 < 0.27`. Network
    space: a box holds x >= lo where a right split cut it and x < hi where a left split did."""
    tree = view.tree
    if tree.inherits_box(node):  # the rest of a carved box: its parent's box, less the carved one
        parent = tree.parent[node]
        return f"{describe_box(view, parent)}, outside box {tree.children[parent][1]}"
    lo, hi = tree.box(node)
    # a carved box is closed: its upper sides hold their bound, where the carve set them
    closed = hi < tree.box(tree.parent[node])[1] if tree.is_carved_box(node) else np.zeros(len(lo), dtype=bool)
    terms = [_feature_term(view, f, lo[f], hi[f], closed[f]) for f in range(len(lo))]
    return ", ".join(t for t in terms if t) or "whole domain"


def _feature_term(view: RegionView, f: int, lo: float, hi: float, closed: bool = False) -> str:
    tree, name = view.tree, view.names[f]
    low = (_num(view.to_data(f, lo)), ">=") if lo > tree.lower[f] else None
    high = (_num(view.to_data(f, hi)), "<=" if closed else "<") if hi < tree.upper[f] else None
    if view.scale[f] < 0:  # a negative scale reverses the order: x_net >= t is x_data <= t'
        low, high = ((high[0], ">=" if closed else ">") if high else None), ((low[0], "<=") if low else None)
    if low and high:
        return f"{low[0]} {'<=' if low[1] == '>=' else '<'} {name} {high[1]} {high[0]}"
    if low:
        return f"{name} {low[1]} {low[0]}"
    if high:
        return f"{name} {high[1]} {high[0]}"
    return ""


def _num(v: float) -> str:
    return f"{v:.5g}"


def region_rows(view: RegionView) -> list[RegionRow]:
    """One row per leaf box, by box id; with residual sets a box's upper is its level (what an
    input's confidence must exceed there)."""
    tree = view.tree
    release = tree.release_bounds()
    return [
        RegionRow(
            box=i,
            depth=tree.depth_of(i),
            description=describe_box(view, i),
            upper=release[i],
            lower=tree.bound_lower[i],
            complete=tree.complete[i],
            # bounds.json stores a box's summed seconds rounded to ms: the log's sum, shown
            # the same way, must not round a half-way figure the other way
            verified=tree.verified[i],
            seconds=round(tree.seconds[i], 3),
        )
        for i in tree.leaves()
    ]


def parse_features(text: str, view: RegionView) -> tuple[int, int]:
    """`--features i,j`: two different features of the run, by index or by name."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise LucidError(f"--features takes two features, e.g. --features 0,1; got {text!r}")
    d = len(view.names)
    chosen = []
    for part in parts:
        if part.lstrip("-").isdigit():
            f = int(part)
            if not 0 <= f < d:
                raise LucidError(f"--features: feature {f} is out of range (the run has {d} features: 0..{d - 1})")
        elif part in view.names:
            f = view.names.index(part)
        else:
            raise LucidError(f"--features: {part!r} is neither a feature index nor one of the run's feature names")
        chosen.append(f)
    if chosen[0] == chosen[1]:
        raise LucidError(f"--features: give two different features, got {text!r}")
    return chosen[0], chosen[1]


def default_features(tree: RegionTree) -> tuple[int, int]:
    """The two features split most often (ties: the lower index), in index order; features never
    split fill up from index 0 so that a tree with one split still gets a 2-D picture."""
    counts = Counter(f for f in tree.feature if f >= 0)
    ranked = sorted(range(len(tree.lower)), key=lambda f: (-counts[f], f))
    if len(ranked) < 2:
        raise LucidError("the region plot needs two features; this run has one")
    return tuple(sorted(ranked[:2]))  # type: ignore[return-value]


def default_class(tree: RegionTree) -> int:
    """The class whose leaf bounds differ most (finite bounds only; ties: the lower class): the
    one whose picture shows most about where the boxes help."""
    leaves = np.array([tree.bound_upper[i] for i in tree.leaves()])
    spreads = []
    for c in range(tree.num_classes):
        finite = leaves[:, c][np.isfinite(leaves[:, c])]
        spreads.append(float(finite.max() - finite.min()) if len(finite) else -1.0)
    return int(np.argmax(spreads))


def region_rectangles(
    view: RegionView, features: tuple[int, int], cls: int
) -> list[tuple[int, float, float, float, float, float]]:
    """(box, x0, x1, y0, y1, bound of `cls`) per leaf, projected on `features` in data units,
    lowest bound first and +inf last: drawn in this order, where boxes overlap in the projection
    the visible colour is the highest bound of any box there (the worst case over the other
    features). A box that does not constrain a feature spans the domain on it."""
    fx, fy = features
    out = []
    for i in view.tree.leaves():
        lo, hi = view.tree.box(i)
        x0, x1 = view.data_interval(fx, lo[fx], hi[fx])
        y0, y1 = view.data_interval(fy, lo[fy], hi[fy])
        out.append((i, x0, x1, y0, y1, float(view.tree.bound_upper[i][cls])))
    return sorted(out, key=lambda r: (r[5], r[0]))


def plot_regions(view: RegionView, path: str | Path, features: tuple[int, int], cls: int, title: str = "") -> None:
    """The leaf boxes projected on two features, coloured by their bound for class `cls`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    rects = region_rectangles(view, features, cls)
    finite = [r[5] for r in rects if math.isfinite(r[5])]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi <= lo:  # one value: widen so the colour bar has a range to show
        lo, hi = lo - 0.5, hi + 0.5
    norm, cmap = Normalize(lo, hi), "viridis"
    mappable = ScalarMappable(norm=norm, cmap=cmap)
    fig = Figure(figsize=(6.4, 5.0))
    FigureCanvasAgg(fig)  # the Agg canvas, without pyplot's global backend state
    ax = fig.subplots()
    for _, x0, x1, y0, y1, bound in rects:
        colour = mappable.to_rgba(bound) if math.isfinite(bound) else "lightgrey"  # type: ignore[arg-type]  # a scalar
        ax.add_patch(
            Rectangle(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                facecolor=colour,
                edgecolor="white",
                linewidth=0.6,
                hatch=None if math.isfinite(bound) else "//",
            )
        )
    fx, fy = features
    ax.set_xlim(*view.data_interval(fx, view.tree.lower[fx], view.tree.upper[fx]))
    ax.set_ylim(*view.data_interval(fy, view.tree.lower[fy], view.tree.upper[fy]))
    ax.set_xlabel(view.names[fx])
    ax.set_ylabel(view.names[fy])
    # Boxes cut on other features overlap in this projection; say which of them shows.
    overlap = any(f >= 0 and f not in features for f in view.tree.feature)
    ax.set_title(
        f"{title + ': ' if title else ''}{len(rects)} boxes, class {cls}"
        + ("\n(where boxes overlap: the highest bound)" if overlap else ""),
        fontsize=9,
    )
    fig.colorbar(mappable, ax=ax, label=f"iDP decision bound, class {cls}")
    if len(finite) < len(rects):
        ax.legend(
            handles=[Patch(facecolor="lightgrey", hatch="//", label="no bound proved")], loc="upper right", fontsize=8
        )
    fig.tight_layout()
    save_figure(fig, path)
