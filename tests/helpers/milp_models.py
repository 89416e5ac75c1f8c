"""Small solver-neutral MILP models for the solver and worker tests: a model from dense arrays, and
a market-split instance that is hard for branch-and-bound."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lucid.milp.model import MilpModel

INF = np.inf


def model(A, rl, ru, cl, cu, integ, obj, offset=0.0) -> MilpModel:
    return MilpModel(
        A=sp.csr_matrix(np.asarray(A, dtype=float)),
        row_lower=np.asarray(rl, dtype=float),
        row_upper=np.asarray(ru, dtype=float),
        col_lower=np.asarray(cl, dtype=float),
        col_upper=np.asarray(cu, dtype=float),
        integrality=np.asarray(integ, dtype=bool),
        objective=np.asarray(obj, dtype=float),
        objective_offset=offset,
    )


def market_split(seed: int, m: int = 4, n: int = 30) -> MilpModel:
    """Cornuejols-Dawande market split with a planted solution: optimum 0, hard for B&B."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, size=(m, n)).astype(float)
    planted = rng.integers(0, 2, size=n).astype(float)
    d = a @ planted
    # a x + s+ - s- = d; maximise -(s+ + s-)
    A = np.hstack([a, np.eye(m), -np.eye(m)])
    return model(A, d, d, np.zeros(n + 2 * m), np.concatenate([np.ones(n), np.full(2 * m, INF)]),
                 np.arange(n + 2 * m) < n, np.concatenate([np.zeros(n), -np.ones(2 * m)]))
