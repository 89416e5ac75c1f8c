"""The symbolic screen of a verification problem's networks: `lucid.bounds.symbolic`'s bounds for
the networks at some positions of its stack, read one chunk at a time.

The verifier (`lucid.analysis.screen.Screen`) screens every network of a run, tens of thousands
of them; the bounds take a `PairProblem` of N against the networks, and this module builds it
from the problem's stack without first copying the networks screened (`_Rows`).
"""

from __future__ import annotations

import numpy as np

from lucid.bounds.pair import PairProblem
from lucid.bounds.symbolic import ScreenOptions, class_screens, singleton_upper_bounds


class _Rows:
    """`array[positions]`, gathered one chunk (`[sl]`) at a time: screening every network of a
    36 000-network run must not first copy all of them (singleton_upper_bounds reads chunks only)."""

    def __init__(self, array: np.ndarray, positions: np.ndarray) -> None:
        self.array, self.positions = array, positions
        self.shape = (len(positions),) + array.shape[1:]

    def __getitem__(self, sl: slice) -> np.ndarray:
        return self.array[self.positions[sl]]


def _stack_pair(problem, positions: np.ndarray) -> PairProblem:
    """N against the networks at `positions` of problem.stack, read one chunk at a time (`_Rows`)."""
    stack = problem.stack
    return PairProblem(
        [w[0] for w in stack.weights],
        [b[0] for b in stack.biases],
        [_Rows(w, positions) for w in stack.weights],  # type: ignore[misc]  # read by chunk, like an array
        [_Rows(b, positions) for b in stack.biases],  # type: ignore[misc]
        problem.n_bounds.lower,
        problem.n_bounds.upper,
        problem.lower,
        problem.upper,
    )


def symbolic_screen(
    problem,
    cls: int,
    positions,
    options: ScreenOptions = ScreenOptions(),
    *,
    cutoff: float | None = None,
    deadline: float | None = None,
) -> np.ndarray:
    """Drop-in for the interval screen (`screen_upper_bounds`): sound upper bounds on beta*_{cls,{i}} for the
    networks at `positions` of problem.stack ([len(positions)], -inf where no rival is reachable).

    Reads only problem.stack, .lower, .upper, .n_bounds, .margin_upper and .num_classes.
    options.steps = 0: symbolic bounds at lambda = 1; steps > 0: optimised (only the networks whose
    lambda = 1 bound is above `cutoff`, when one is given: e.g. the class's best lower bound).
    deadline (time.monotonic()): it ends near it, with +inf for the networks it did not reach."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        return np.empty(0)
    if not 0 <= cls < problem.num_classes:
        raise ValueError(f"class {cls} out of range")
    res = singleton_upper_bounds(
        _stack_pair(problem, positions), cls, problem.margin_upper, options, cutoff=cutoff, deadline=deadline
    )
    return res.bound


def symbolic_screens(
    problem, classes: list[int], positions, *, device: str = "cpu", chunk: int = 512, deadline: float | None = None
) -> np.ndarray:
    """`symbolic_screen(problem, c, positions)` for every class c of `classes` at once ([len(classes),
    len(positions)]; `class_screens`), until `deadline` (+inf for the networks not reached)."""
    positions = np.asarray(positions, dtype=np.int64)
    if any(not 0 <= c < problem.num_classes for c in classes):
        raise ValueError(f"classes {list(classes)} out of range")
    if positions.size == 0:
        return np.empty((len(classes), 0))
    return class_screens(
        _stack_pair(problem, positions),
        list(classes),
        problem.margin_upper,
        device=device,
        chunk=chunk,
        deadline=deadline,
    )
