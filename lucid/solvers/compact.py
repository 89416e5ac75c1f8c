"""Compact form of a model: columns defined by an equality row are substituted out.

A layer-0 pre-activation of an exact network is zhat = w x + b, one column and one equality row
per neuron. Substituting it into the rows that use it removes both; on a Crypto 2x100 singleton
that is 184 of 2056 rows (1872 left), which is what lets the size-limited Gurobi licence (2000
rows) take the model at all. The rows that used zhat get 7 input coefficients instead of one.

The encoder marks the columns it allows (`meta["_defined"]`): unstable neurons only, whose
column bounds [l, u] the ReLU rows already imply (a >= zhat, a <= zhat - l (1 - delta) and the
triangle's rows force l <= zhat <= u, in the LP relaxation too), so dropping the column drops
no constraint. Substitution in floating point can round a merged coefficient (two networks'
weights on the same input) or a shifted row bound; each rewritten row is widened by a
rigorous bound on that rounding times the columns' magnitudes, so the compact model's feasible
set contains the original's and its dual bound stays an upper bound on the original optimum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import scipy.sparse as sp

from lucid.milp.model import MilpModel

_U = np.finfo(np.float64).eps / 2  # unit roundoff


def _identity(solution: np.ndarray) -> np.ndarray:
    return solution


def inline_defined_columns(model: MilpModel) -> tuple[MilpModel, Callable[[np.ndarray], np.ndarray]]:
    """The compact model and a map from its solutions back to solutions of `model`.

    Returns `model` itself (and the identity) when it marks no column or a definition does
    not have the expected shape: one equality row, coefficient +-1 on its column, no other
    defined column, every other column bounded.
    """
    defined = model.meta.get("_defined")
    if not defined or len(defined[0]) == 0:
        return model, _identity
    J = np.asarray(defined[0], dtype=np.int64)
    R = np.asarray(defined[1], dtype=np.int64)
    A = sp.csr_matrix(model.A)
    m, n = A.shape
    is_j = np.zeros(n, dtype=bool)
    is_j[J] = True
    is_r = np.zeros(m, dtype=bool)
    is_r[R] = True
    D = A[R]
    coef = np.asarray(D[np.arange(len(J)), J]).ravel()
    rhs = model.row_lower[R]
    if (
        np.any(np.abs(coef) != 1.0)
        or np.any(model.row_upper[R] != rhs)
        or not np.all(np.isfinite(rhs))
        or D[:, J].nnz != len(J)  # each definition mentions only its own column
        or np.any(model.integrality[J])
        or model.objective[J].any()
    ):
        return model, _identity
    K = np.flatnonzero(~is_j)
    keep = np.flatnonzero(~is_r)
    # zhat_j = coef_j (rhs_j - D_jK x_K): multiplying by +-1 is exact
    S = sp.diags(-coef) @ D[:, K]
    t = coef * rhs
    C = A[keep]
    CJ, CK = C[:, J], C[:, K]
    new = sp.csr_matrix(CK + CJ @ S)
    shift = CJ @ t
    # rounding of every sum: gamma_k times the sum of the terms' magnitudes, k terms per sum
    terms = int(np.diff(sp.csr_matrix(CJ).indptr).max(initial=0)) + 2
    gamma = 2.0 * terms * _U / (1.0 - terms * _U)
    mag = abs(CK) + abs(CJ) @ abs(S)
    col_mag = np.maximum(np.abs(model.col_lower[K]), np.abs(model.col_upper[K]))
    touched = np.asarray(abs(CJ).sum(1)).ravel() > 0
    used = np.asarray(abs(mag[touched]).sum(0)).ravel() > 0
    if not np.all(np.isfinite(col_mag[used])):
        return model, _identity
    col_mag = np.where(np.isfinite(col_mag), col_mag, 0.0)
    lower = model.row_lower[keep] - shift
    upper = model.row_upper[keep] - shift

    def finite_abs(v: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(v), np.abs(v), 0.0)

    # ... plus the rounding of the two subtractions above and of the widening itself
    err = 2.0 * (gamma * (mag @ col_mag + abs(CJ) @ np.abs(t)) + _U * (finite_abs(lower) + finite_abs(upper))) + 1e-300
    lower = np.where(touched, lower - err, model.row_lower[keep])
    upper = np.where(touched, upper + err, model.row_upper[keep])
    new_index = np.full(n, -1, dtype=np.int64)
    new_index[K] = np.arange(len(K))
    compact = replace(
        model,
        A=new,
        row_lower=lower,
        row_upper=upper,
        col_lower=model.col_lower[K],
        col_upper=model.col_upper[K],
        integrality=model.integrality[K],
        objective=model.objective[K],
        names=[model.names[j] for j in K] if model.names else [],
        row_names=[model.row_names[r] for r in keep] if model.row_names else [],
        input_columns=new_index[model.input_columns],
        meta={k: v for k, v in model.meta.items() if not k.startswith("_")},  # column indices: stale here
    )

    def expand(solution: np.ndarray) -> np.ndarray:
        full = np.empty(n)
        full[K] = solution
        full[J] = S @ solution + t
        return full

    return compact, expand
