"""`lucid evaluate`: what LUCID's protection costs, against the naive mechanisms (paper Sec. 6).

On the run's test split, per epsilon:
  plain        N's accuracy without protection;
  lucid        Algorithm 2: noise only where N's confidence <= the class's iDP-DB (bounds.json;
               with `lucid verify --regions`, the bound of the input's box; with `--residual M`,
               the level L_c, and also where a residual network disagrees);
  lucid_global with regions or residual sets only: the same with one bound per class (side by side);
  naive_noise  the exponential mechanism on every query;
  naive_idp    every query through all n+1 networks; noise exactly where they disagree
               (the exact leaking set: sound and tight, but pays n+1 forward passes per query).
All mechanisms draw around N's label with the same exponential mechanism. Access times are the
wall time of answering the whole split in batches divided by its size (plus LUCID's
single-query time as `lucid_single_query`: the median over 200 rows of one query's wall time).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lucid.access.classifier import LabelOnlyClassifier
from lucid.access.mechanism import RandomSource, check_epsilon, exponential_mechanism, true_label_probability
from lucid.access.memo import Memo
from lucid.atomic import write_atomic
from lucid.errors import LucidError
from lucid.network import NetworkFile, NetworkStack, confidence
from lucid.rundir import open_run

_FORWARD_BUDGET_BYTES = 16 * 1024 * 1024  # activations held at once by the Naive-iDP pass
_SINGLE_QUERY_SAMPLES = 200


def parse_epsilons(text: str) -> list[tuple[str, float]]:
    """'0,0.2,1' -> [('0', 0.0), ('0.2', 0.2), ('1', 1.0)]: keys as the user wrote them."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise LucidError(f"--epsilon must be a comma-separated list of numbers, got {text!r}")
    out = []
    for t in items:
        try:
            value = float(t)
        except ValueError:
            raise LucidError(f"--epsilon: {t!r} is not a number") from None
        out.append((t, check_epsilon(value)))
    if len({k for k, _ in out}) != len(out):
        raise LucidError(f"--epsilon lists a value twice: {text!r}")
    return out


def leaking_set(
    stack: NetworkStack | NetworkFile, x: np.ndarray, progress: Callable[[int, int], None] | None = None
) -> np.ndarray:
    """True where not all n+1 networks give x N's label (the exact leaking set), chunked by networks
    (a `NetworkFile` is streamed: one chunk of networks in memory at a time)."""
    k = len(stack)
    widest = max(stack.layer_sizes)
    chunk = max(1, int(_FORWARD_BUDGET_BYTES // max(1, len(x) * widest * 8)))
    reference = None
    disagree = np.zeros(len(x), dtype=bool)
    for start in range(0, k, chunk):
        part = stack.select(slice(start, min(k, start + chunk)))
        labels = part.forward(x).argmax(axis=-1)  # [chunk, B]
        if reference is None:
            reference = labels[0]  # position 0 is N
        disagree |= (labels != reference).any(axis=0)
        if progress is not None:
            progress(min(k, start + chunk), k)
    return disagree


def evaluate_run(
    run_dir: str | Path,
    epsilons: list[tuple[str, float]],
    seed: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the JSON result, plot data) for a run directory with bounds.json."""
    run = open_run(run_dir)
    data = run.data()
    if "X_test" not in data or "y_test" not in data or len(data["X_test"]) == 0:
        raise LucidError(f"{run.path / 'data.npz'} has no test split to evaluate on")
    y = np.asarray(data["y_test"], dtype=np.int64)
    clf = LabelOnlyClassifier(run, epsilon=epsilons[0][1] if epsilons else 0.0, memo=Memo(None))
    # The test split is stored in network space; clip it into the verified box, as --clip would.
    x = np.clip(np.asarray(data["X_test"], dtype=np.float64), clf.domain_lower, clf.domain_upper) + 0.0
    n_cls, noised = clf.decide(x)
    rng = RandomSource(seed)

    report = progress or None
    stack = NetworkFile(run.path, run.meta)
    started = time.perf_counter()
    leaking = leaking_set(stack, x, (lambda d, t: report("Naive-iDP", d, t)) if report else None)
    naive_idp_ms = (time.perf_counter() - started) * 1e3 / len(x)

    accuracy: dict[str, Any] = {"plain": float(np.mean(n_cls == y)), "lucid": {}, "naive_noise": {}, "naive_idp": {}}
    noised_fraction = {"lucid": float(noised.mean()), "naive_noise": 1.0, "naive_idp": float(leaking.mean())}
    global_clf = None
    if clf.rule != "global":  # the same run with one bound per class, side by side
        global_clf = clf.with_global_bounds()
        accuracy["lucid_global"] = {}
        noised_fraction["lucid_global"] = float(global_clf.decide(x)[1].mean())
    lucid_ms = []
    for key, eps in epsilons:
        clf.epsilon, clf.memo, clf.rng = eps, Memo(None), RandomSource(None if seed is None else rng_seed(seed, key))
        t0 = time.perf_counter()
        lucid_labels = clf.predict_network_space(x)
        lucid_ms.append((time.perf_counter() - t0) * 1e3 / len(x))
        accuracy["lucid"][key] = float(np.mean(lucid_labels == y))
        if global_clf is not None:
            global_clf.epsilon, global_clf.memo, global_clf.rng = (
                eps,
                Memo(None),
                RandomSource(None if seed is None else rng_seed(seed, "global:" + key)),
            )
            accuracy["lucid_global"][key] = float(np.mean(global_clf.predict_network_space(x) == y))
        accuracy["naive_noise"][key] = float(np.mean(exponential_mechanism(n_cls, run.num_classes, eps, rng) == y))
        idp_labels = n_cls.copy()
        idp_labels[leaking] = exponential_mechanism(n_cls[leaking], run.num_classes, eps, rng)
        accuracy["naive_idp"][key] = float(np.mean(idp_labels == y))
        if report:
            report("LUCID", len(accuracy["lucid"]), len(epsilons))

    masks = {"lucid": noised, "naive_noise": np.ones_like(noised), "naive_idp": leaking}
    if global_clf is not None:
        masks["lucid_global"] = global_clf.decide(x)[1]
    correct = n_cls == y
    result = {
        # which rule "lucid" is, where it is not the global bounds (then also in "lucid_global")
        **({"rule": clf.rule} if clf.rule != "global" else {}),
        **({"residual_size": clf.residual.size} if clf.residual is not None else {}),
        "accuracy": accuracy,
        # the mean over the mechanism's draws, exactly: one draw's accuracy varies by a point or more
        # on a few hundred test inputs, which hides differences between the mechanisms
        "expected_accuracy": {
            name: {key: expected_accuracy(correct, mask, eps, run.num_classes) for key, eps in epsilons}
            for name, mask in masks.items()
        },
        "noised_fraction": noised_fraction,
        "access_ms": {
            "lucid": float(np.median(lucid_ms)),
            "naive_idp": float(naive_idp_ms),
            "lucid_single_query": _time_single(clf, x),
        },
    }
    # A test input LUCID releases although some N_-i disagrees is a concrete counterexample to
    # the bounds (beta_c below the iDP-DB): the caller must warn loudly.
    # the threshold the rule compares with: with residual sets (one per class) the level L_c
    levels = clf.residual is not None and clf.regions is None
    plot_data = {
        "confidence": _confidences(clf, x),
        "classes": n_cls,
        "bounds": clf.residual_levels if levels else clf.bounds,
        "bound_name": "level" if levels else "iDP-DB",
        "labels": clf.labels,
        "noised": noised,
        "regions": clf.regions is not None,
        "released_but_leaking": int(np.sum(~noised & leaking)),
    }
    return result, plot_data


def expected_accuracy(correct: np.ndarray, noised: np.ndarray, epsilon: float, num_classes: int) -> float:
    """Accuracy averaged over the exponential mechanism's draws: a released answer is N's label; a
    noised one is N's label with probability p (`true_label_probability`), each other label with
    (1 - p) / (C - 1)."""
    p = true_label_probability(epsilon, num_classes)
    other = (1.0 - p) / max(1, num_classes - 1)
    per_input = np.where(noised, np.where(correct, p, other), correct.astype(np.float64))
    return float(per_input.mean())


def rng_seed(seed: int, key: str) -> int:
    """A distinct, reproducible seed per (seed, epsilon) so LUCID's draws differ across epsilons."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little")


def _confidences(clf: LabelOnlyClassifier, x: np.ndarray) -> np.ndarray:
    return confidence(clf.scores(x))


def _time_single(clf: LabelOnlyClassifier, x: np.ndarray) -> float:
    """The median over rows of one query's wall time: a typical query's latency, which a few calls
    hit by a garbage collection or a busy core would move in a mean."""
    rows = x[: min(len(x), _SINGLE_QUERY_SAMPLES)]
    times = []
    for i in range(len(rows)):
        t0 = time.perf_counter()
        clf.predict_network_space(rows[i : i + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def markdown_table(result: dict[str, Any], epsilons: list[tuple[str, float]]) -> str:
    acc = result["accuracy"]

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    regions = "lucid_global" in acc  # LUCID is then region-wise or residual, next to its global bounds
    rule = {
        "residual": f"residual M = {result.get('residual_size')}",
        "regions": "regions",
        "regions+residual": f"regions, residual M = {result.get('residual_size')}",
    }.get(result.get("rule", ""), "regions")
    head = f"| ε | N (no privacy) | LUCID ({rule}) | LUCID (global) |" if regions else "| ε | N (no privacy) | LUCID |"
    lines = [head + " Naive-Noise | Naive-iDP |", "|---|---|---|---|---|" + ("---|" if regions else "")]
    for key, _ in epsilons:
        glob = f" {pct(acc['lucid_global'][key])} |" if regions else ""
        lines.append(
            f"| {key} | {pct(acc['plain'])} | {pct(acc['lucid'][key])} |{glob} {pct(acc['naive_noise'][key])} "
            f"| {pct(acc['naive_idp'][key])} |"
        )
    nf, ms = result["noised_fraction"], result["access_ms"]
    cols = f"| | LUCID ({rule}) | LUCID (global) |" if regions else "| | LUCID |"
    glob_nf = f" {pct(nf['lucid_global'])} |" if regions else ""
    dash = " – |" if regions else ""
    lines += [
        "",
        cols + " Naive-Noise | Naive-iDP |",
        "|---|---|---|---|" + ("---|" if regions else ""),
        f"| test inputs noised | {pct(nf['lucid'])} |{glob_nf} {pct(nf['naive_noise'])} | {pct(nf['naive_idp'])} |",
        f"| access time per query (batched) | {ms['lucid']:.4f} ms |{dash} – | {ms['naive_idp']:.4f} ms |",
        f"| access time, single query | {ms['lucid_single_query']:.4f} ms |{dash} – | – |",
    ]
    return "\n".join(lines)


def sorted_by_confidence(plot_data: dict[str, Any], c: int) -> tuple[np.ndarray, np.ndarray]:
    """Class `c`'s test inputs (N's label): their confidences in ascending order, and whether each
    was released, as the classifier decided it (by its box's bound with --regions)."""
    mine = np.flatnonzero(plot_data["classes"] == c)
    order = np.argsort(plot_data["confidence"][mine], kind="stable")
    return plot_data["confidence"][mine][order], ~plot_data["noised"][mine][order]


def plot_confidences(plot_data: dict[str, Any], path: str | Path) -> None:
    """The paper's Figure 6: N's test-set confidences per class, with the iDP-DB as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounds, labels, regions = plot_data["bounds"], plot_data["labels"], plot_data.get("regions", False)
    n = len(bounds)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for c, ax in enumerate(axes[0]):
        mine, released = sorted_by_confidence(plot_data, c)
        ranks = np.arange(len(mine))
        beta = bounds[c]
        ax.scatter(ranks[released], mine[released], s=6, color="tab:blue", label="released")
        ax.scatter(ranks[~released], mine[~released], s=6, color="tab:orange", label="noised")
        if math.isfinite(beta):  # with regions each input has its box's bound, at most this one
            ax.axhline(
                beta,
                color="tab:red",
                linestyle="--",
                label=f"{'largest box bound' if regions else plot_data.get('bound_name', 'iDP-DB')} = {beta:.3g}",
            )
        elif not released.any():
            ax.text(0.5, 0.95, "no bound proved: all noised", transform=ax.transAxes, ha="center", va="top")
        share = 100 * released.mean() if len(mine) else 0.0
        ax.set_title(f"class {labels[c]}: {len(mine)} inputs, {share:.1f} % released")
        ax.set_xlabel("test inputs N labels with this class (sorted)")
        ax.set_ylabel("confidence (score − runner-up)")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format=suffix, dpi=120))
    except ValueError as exc:  # unknown image format
        raise LucidError(f"--plot: cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)
