"""The report's figures, drawn with matplotlib's Agg canvas and returned as PNG bytes.

Bytes rather than files so the HTML can embed them as data URIs (no network, one file) and the
Markdown writer can put them next to its file; matplotlib's `Figure` is used directly instead of
pyplot so that drawing never touches global backend state.

Figure 6 puts confidences on a log axis: the bounds beta_c are typically 1e-3..1e-1 while
confidences reach 10 or more, and on a linear axis the line and everything below it would be
squeezed into the first pixel.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid.report.facts import BaselineFacts, EvaluationFacts, VerificationFacts

RELEASED, NOISED, BETA = "#1f77b4", "#ff7f0e", "#d62728"
_COLUMNS = 3


def _figure(panels: int, width: float = 4.4, height: float = 3.4):
    from matplotlib.figure import Figure

    cols = min(_COLUMNS, max(1, panels))
    rows = math.ceil(max(1, panels) / cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _bins(lo: float, hi: float, beta: float, count: int = 35) -> np.ndarray:
    """Log-spaced bin edges over [lo, hi] with beta_c on an edge (when inside), so that no bar
    straddles the line and mixes released with noised inputs."""
    if not (math.isfinite(beta) and lo < beta < hi):
        return np.geomspace(lo, hi, count + 1)
    left = max(1, round(count * math.log(beta / lo) / math.log(hi / lo)))
    right = max(1, count - left)
    return np.concatenate([np.geomspace(lo, beta, left + 1)[:-1], np.geomspace(beta, hi, right + 1)])


def figure6(ev: EvaluationFacts, labels: Sequence[Any]) -> bytes:
    """Paper Fig. 6: per class, N's test-set confidences against beta_c. Inputs above the line are
    released as N's label, inputs at or below it are answered by the exponential mechanism. The
    colours are the access layer's own decision per input (`evaluate_run`'s mask), so any margin
    it adds above beta_c shows as it is applied."""
    fig, axes = _figure(len(ev.betas))
    for c, ax in enumerate(axes):
        mine = ev.predicted == c
        conf, released = ev.confidence[mine], ~ev.noised[mine]
        beta = ev.betas[c]
        share = 100.0 * released.mean() if len(conf) else 0.0
        title = f"class {labels[c]}: {len(conf)} inputs, {share:.1f} % released"
        if not (math.isfinite(beta) and beta > 0):
            title += "\n" + (
                "nothing proved: every input noised"
                if not math.isfinite(beta)
                else "β ≤ 0: no input of this class can leak"
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("confidence (top score − runner-up), log scale", fontsize=9)
        ax.set_ylabel("test inputs", fontsize=9)
        if not len(conf):
            ax.text(0.5, 0.5, "N labels no test input with this class", transform=ax.transAxes, ha="center")
            continue
        positive = conf[conf > 0]
        floor = positive.min() if len(positive) else 1e-6
        if math.isfinite(beta) and beta > 0:
            floor = min(floor, beta)
        lo, hi = floor / 2.0, max(float(conf.max()), floor) * 2.0
        shown = np.clip(conf, lo * 1.01, None)  # a tie (confidence 0) is drawn at the left edge
        bins = _bins(lo, hi, beta)
        ax.hist(
            [shown[released], shown[~released]],
            bins=bins,
            stacked=True,
            color=[RELEASED, NOISED],
            label=[f"released ({int(released.sum())})", f"noised ({int((~released).sum())})"],
        )
        ax.set_xscale("log")
        if math.isfinite(beta) and beta > 0:
            name = "L" if ev.bound_name == "level" else "β"
            ax.axvline(beta, color=BETA, linestyle="--", linewidth=1.5, label=f"{name} = {beta:.3g}")
        ax.legend(loc="upper left", fontsize=8, frameon=False)
        ax.tick_params(labelsize=8)
    return _png(fig)


def accuracy_figure(ev: EvaluationFacts, baselines: BaselineFacts | None) -> bytes:
    """Test accuracy per epsilon: LUCID beside N, the naive mechanisms and the baselines that were run.
    Epsilons sit at evenly spaced positions (0 has no place on a log axis)."""
    acc = ev.result["accuracy"]
    eps = {float(k): k for k in ev.epsilons}
    for r in baselines.rows if baselines else ():
        if r.epsilon is not None and r.accuracy is not None:
            eps.setdefault(r.epsilon, f"{r.epsilon:g}")
    order = sorted(eps)
    pos = {e: i for i, e in enumerate(order)}
    fig, (ax,) = _figure(1, width=7.0, height=3.2)
    ax.axhline(100 * acc["plain"], color="black", linestyle=":", label="N (no privacy)")
    styles = {
        "lucid": ("LUCID", BETA, "o"),
        "naive_idp": ("Naive-iDP", "#2ca02c", "s"),
        "naive_noise": ("Naive-Noise", "#7f7f7f", "^"),
    }
    for key, (name, color, marker) in styles.items():
        xs = [pos[float(k)] for k in ev.epsilons]
        ax.plot(
            xs,
            [100 * acc[key][k] for k in ev.epsilons],
            marker=marker,
            color=color,
            label=name,
            linewidth=2.2 if key == "lucid" else 1.5,
            zorder=3 if key == "lucid" else 2,
        )
    palette = iter(
        ["#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#1f77b4", "#aec7e8", "#c49c94", "#f7b6d2", "#dbdb8d"]
        * 4
    )
    rows = baselines.rows if baselines else ()
    for method in baselines.methods if baselines else ():
        pts = sorted(
            (r.epsilon, r.accuracy)
            for r in rows
            if r.method == method and r.epsilon is not None and r.accuracy is not None
        )
        if pts:
            ax.plot(
                [pos[e] for e, _ in pts],
                [100 * a for _, a in pts],
                marker=".",
                linestyle="--",
                linewidth=1,
                color=next(palette),
                label=method,
            )
    ax.set_xticks(range(len(order)), [eps[e] for e in order])
    ax.set_xlabel("ε")
    ax.set_ylabel("test accuracy [%]")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return _png(fig)


def anytime_figure(verification: VerificationFacts) -> bytes | None:
    """The proved upper and witnessed lower bound of each class over the verification's time,
    from the log; None when no class has anytime updates."""
    curves = [(c, c.log.curve) for c in verification.classes if c.log is not None and c.log.curve]
    if not curves:
        return None
    fig, axes = _figure(len(curves), height=3.0)
    for (c, curve), ax in zip(curves, axes, strict=False):
        t = [p[0] for p in curve]
        lo = [math.nan if p[1] is None or not math.isfinite(p[1]) else p[1] for p in curve]
        up = [math.nan if p[2] is None or not math.isfinite(p[2]) else p[2] for p in curve]
        ax.step(t, up, where="post", color=BETA, label="upper (proved)")
        ax.step(t, lo, where="post", color=RELEASED, label="lower (witness)")
        ax.set_title(f"class {c.label}", fontsize=10)
        ax.set_xlabel("seconds", fontsize=9)
        ax.set_ylabel("iDP decision bound", fontsize=9)
        ax.legend(fontsize=8, frameon=False)
        ax.tick_params(labelsize=8)
    return _png(fig)
