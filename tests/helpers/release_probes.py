"""Probes of a classifier's release decisions shared by the residual tests: inputs at neighbouring
floats on both sides of a level, and the exact replay of every released input through all networks."""

from __future__ import annotations

import numpy as np

from exact_oracle import exact_label_and_agreement


def class_margin(stack, j: int, x: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """Network j's float margin s_cls - max_{t != cls} s_t at each row of x."""
    s = stack.forward(np.atleast_2d(x))[j]
    rows = np.arange(len(s))
    own = s[rows, cls].copy()
    s[rows, cls] = -np.inf
    return own - s.max(axis=1)


def crossings(values_at, xs: np.ndarray, level: float, steps: int = 60) -> list[np.ndarray]:
    """Points on segments between random inputs where values_at(x) crosses `level`, bisected to
    neighbouring floats on both sides."""
    out = []
    for a, b in zip(xs[:-1], xs[1:]):
        va, vb = values_at(np.vstack([a, b]))
        if not np.isfinite([va, vb]).all() or (va > level) == (vb > level):
            continue
        lo, hi = (a, b) if va <= level else (b, a)
        for _ in range(steps):
            mid = (lo + hi) / 2
            if values_at(mid[None])[0] > level:
                hi = mid
            else:
                lo = mid
        out += [lo, hi]
    return out


def released_rows_agree_exactly(clf, stack, xs: np.ndarray) -> int:
    """Every row the classifier releases gets N's exact label from all networks (exact arithmetic);
    returns how many were released."""
    cls, noised = clf.decide(xs)
    for x, c in zip(xs[~noised], cls[~noised]):
        label, agree = exact_label_and_agreement(stack, x)
        assert label == c and agree, f"released {x.tolist()} although some network disagrees exactly"
    return int((~noised).sum())


def work_traces(make_classifier, groups: dict[str, np.ndarray]) -> dict[str, tuple[list[int], int]]:
    """Per group of rows: the mechanism's draws and the memo's SQL statements for five single
    queries and one repeated batch, each group on a fresh classifier from `make_classifier()`."""
    traces = {}
    for name, rows in groups.items():
        clf = make_classifier()
        calls: list[int] = []
        uniform = clf.rng.uniform
        clf.rng.uniform = lambda n, calls=calls, uniform=uniform: calls.append(n) or uniform(n)
        statements: list[str] = []
        clf.memo._db.set_trace_callback(statements.append)
        for i in range(5):
            clf.predict_network_space(rows[i : i + 1])
        clf.predict_network_space(rows[:5])  # repeats: the memo answers, nothing drawn
        clf.memo._db.set_trace_callback(None)
        traces[name] = (calls, len(statements))
        clf.close()
    return traces


def assert_four_outcomes_do_the_same_work(make_classifier, xs: np.ndarray, noised: np.ndarray, conf: np.ndarray,
                                          levels: np.ndarray, tops: np.ndarray) -> None:
    """Rows released by the level (every member's bound `tops` below N's confidence `conf`),
    released by the check, noised by the level (`levels`) and noised by the check: at least five
    of each, and the same draws and memo statements for all four groups."""
    checked, above = conf <= tops, conf > levels
    groups = {"released by level": xs[~noised & ~checked], "released by check": xs[~noised & checked],
              "noised by level": xs[~above], "noised by check": xs[above & noised]}
    assert all(len(g) >= 5 for g in groups.values()), {k: len(g) for k, g in groups.items()}
    traces = work_traces(make_classifier, groups)
    assert len(set(map(repr, traces.values()))) == 1, traces
