"""The screen: a sound upper bound on beta*_{c,{i}} for every single network at once, without a
solver (bound propagation of the difference intervals), so most networks never reach a MILP."""

from __future__ import annotations

import numpy as np

from lucid.analysis.problem import VerificationProblem
from lucid.bounds.difference import WeightIntervals, difference_bounds
from lucid.bounds.interval import FP_REL
from lucid.deadline import paced


def screen_upper_bounds(problem: VerificationProblem, cls: int, positions: np.ndarray, chunk: int = 128) -> np.ndarray:
    """Cheap sound upper bounds on beta*_{cls,{i}} for each single network (bound propagation).

    If N' prefers t over c somewhere, then beta <= s_c - s_t = (s#_c - s#_t) + (d_t - d_c)
    <= du_t - dl_c with d = s# - s, and also beta <= max(s_c - s_t) over the domain; a class t
    that N' can never rank above c contributes nothing, and no such t at all means -inf.
    """
    return interval_screens(problem, [cls], positions, chunk)[0]


def interval_screens(
    problem: VerificationProblem,
    classes: list[int],
    positions: np.ndarray,
    chunk: int = 128,
    deadline: float | None = None,
) -> np.ndarray:
    """`screen_upper_bounds` for every class of `classes`, [len(classes), len(positions)]: the
    difference intervals, which do not depend on the class, are propagated once. The networks not
    reached by `deadline` (time.monotonic()) get `unscreened_bound`."""
    positions = np.asarray(positions, dtype=np.int64)
    out = np.array([np.full(len(positions), unscreened_bound(problem, c)) for c in classes]).reshape(len(classes), -1)
    C = problem.num_classes
    for part in paced(len(positions), chunk, deadline):
        start, pos = part.start, positions[part]
        ws = [w[pos] for w in problem.stack.weights]
        bs = [b[pos] for b in problem.stack.biases]
        diff = difference_bounds(
            problem.n_weights,
            problem.n_biases,
            WeightIntervals.points(ws, bs),
            problem.n_bounds,
            problem.lower,
            problem.upper,
        )
        dl, du = diff.pre.lower[-1], diff.pre.upper[-1]  # [k, C]
        hl, hu = diff.hyper.lower[-1], diff.hyper.upper[-1]
        for j, cls in enumerate(classes):
            best = np.full(len(pos), -np.inf)
            for t in range(C):
                if t == cls:
                    continue
                feasible = ~(hu[:, t] - hl[:, cls] < 0)  # not "provably < 0": NaN stays feasible
                via_diff = du[:, t] - dl[:, cls]
                via_diff = via_diff + FP_REL * (np.abs(du[:, t]) + np.abs(dl[:, cls])) + 1e-300
                cand = np.minimum(np.where(np.isnan(via_diff), np.inf, via_diff), problem.margin_upper[cls, t])
                best = np.where(feasible, np.maximum(best, cand), best)
            out[j, start : start + len(pos)] = np.where(np.isnan(best), np.inf, best)
    return out


def unscreened_bound(problem: VerificationProblem, cls: int) -> float:
    """A sound bound on beta*_{cls,{i}} for every network i, from N alone: C_N^c(x) <= s_c(x) - s_t(x)
    for every rival t, so beta* <= max_x C_N^c(x) <= min_t margin_upper[c, t]. The bound of a network
    a deadline left unscreened."""
    rivals = [t for t in range(problem.num_classes) if t != cls]
    if not rivals:
        return -np.inf
    caps = problem.margin_upper[cls, rivals]
    return float(np.min(np.where(np.isnan(caps), np.inf, caps)))


LAZY_BATCH = 256  # networks in the first symbolic pass of `Screen.highest`, twice as many in each next


class Screen:
    """The screen a verification asked for (`VerifySettings.screen`), for the engine.

    `initial` bounds every network once per class; `refine` (the "optimised" screen only) is
    called by the engine for the networks a node is about to solve that are still above the
    class's cutoff, and returns bounds no larger than `initial`'s. Every value is a sound upper
    bound on beta*_{c,{i}}, so the engine may take the minimum of any of them."""

    def __init__(
        self, problem: VerificationProblem, method: str, device: str = "cpu", classes: list[int] | None = None
    ) -> None:
        """classes: the classes `initial` will be asked for. The first call screens them all at
        once (the class-independent work shared, `interval_screens`, `symbolic_screens`) and keeps
        the bounds for the others' calls on the same positions."""
        if method not in ("interval", "symbolic", "optimised"):
            raise ValueError(f"no screen for method {method!r}")
        self.problem = problem
        self.method = method
        self.device = device
        self.classes = None if classes is None else [int(c) for c in classes]
        self._kept: tuple[bytes, dict[int, np.ndarray]] | None = None  # (positions, class -> bounds)

    def initial(self, cls: int, positions: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """Every network's bound (`deadline`, a time.monotonic() value: the networks the symbolic
        screen did not reach by then keep their interval bound, those the interval screen did not
        reach `unscreened_bound`)."""
        positions = np.asarray(positions, dtype=np.int64)
        key = positions.tobytes()
        if self._kept is not None and self._kept[0] == key and cls in self._kept[1]:
            return self._kept[1].pop(cls)  # each class asks once: no need to keep it
        classes = self.classes if self.classes is not None and cls in self.classes else [cls]
        bounds = interval_screens(self.problem, classes, positions, deadline=deadline)
        if self.method != "interval":
            from lucid.bounds.stack_screen import symbolic_screens

            bounds = np.minimum(
                bounds, symbolic_screens(self.problem, classes, positions, device=self.device, deadline=deadline)
            )
        self._kept = (key, {c: b for c, b in zip(classes, bounds, strict=True) if c != cls})
        return bounds[classes.index(cls)]

    def highest(
        self, classes: list[int], positions: np.ndarray, prior: dict[int, np.ndarray] | None = None, rank: int = 1
    ) -> dict[int, np.ndarray]:
        """Per class, a sound bound for every network of `positions` whose `rank` largest are the
        `rank` largest of `initial`'s (taken with `prior`: per class, other sound bounds per
        position), at less cost: only a box's bound is needed here (with residual sets of M
        networks, its M + 1 highest: rank M + 1), not each network's tightest. The interval screen
        bounds every network; the symbolic one, ten times dearer, only those whose bound could
        still be among the `rank` largest, highest first, until no network's bound exceeds the
        `rank`-th largest found. A network left with its interval (or prior) bound is at or below it."""
        positions = np.asarray(positions, dtype=np.int64)
        bounds = interval_screens(self.problem, classes, positions)
        for j, c in enumerate(classes):
            if prior is not None and c in prior:
                bounds[j] = np.minimum(bounds[j], prior[c])
        if self.method == "interval" or positions.size == 0:
            return dict(zip(classes, bounds, strict=True))
        from lucid.bounds.stack_screen import symbolic_screens

        done = np.zeros(len(positions), dtype=bool)
        highest = np.full(len(classes), -np.inf)  # per class, the rank-th largest bound found
        batch = max(LAZY_BATCH, 2 * rank)
        while True:
            above = ~done & (bounds > highest[:, None]).any(axis=0)
            if not above.any():
                return dict(zip(classes, bounds, strict=True))
            # each class's highest bounds first, `batch` networks in all
            order = np.argsort(-np.where(above, bounds, -np.inf), axis=1, kind="stable")
            take = np.unique(order[:, : max(1, batch // len(classes))])
            take = take[above[take]]
            tightened = symbolic_screens(self.problem, classes, positions[take], device=self.device)
            bounds[:, take] = np.fmin(bounds[:, take], tightened)  # a NaN screen keeps the interval bound
            done[take] = True
            if done.sum() >= rank:
                highest = -np.partition(-bounds[:, done], rank - 1, axis=1)[:, rank - 1]
            batch *= 2  # few passes however many networks stay above

    @property
    def refines(self) -> bool:
        return self.method == "optimised"

    def refine(self, cls: int, positions: np.ndarray, cutoff: float, deadline: float | None = None) -> np.ndarray:
        """The optimised screen's bounds, until `deadline` (time.monotonic(); +inf for the networks
        it did not reach)."""
        from lucid.bounds.stack_screen import symbolic_screen
        from lucid.bounds.symbolic import ScreenOptions

        return symbolic_screen(
            self.problem, cls, positions, ScreenOptions.optimised(self.device), cutoff=cutoff, deadline=deadline
        )
