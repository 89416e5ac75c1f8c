"""Gurobi backend (gurobipy matrix API: one addMVar + one addMConstr per row sense; ranged rows via slacks).

Gurobi gets the compact form of a model (lucid.solvers.compact: layer-0 pre-activations
substituted out) and its solution is mapped back to the model's columns, so callers never see
the difference; the size-limited licence is judged on that compact form.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import scipy.sparse as sp

from lucid.errors import SolverError
from lucid.milp.model import MilpModel
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions
from lucid.solvers.compact import inline_defined_columns

SIZE_LIMIT_ERRNO = 10010  # "Model too large for size-limited license"


def _env(verbose: bool):
    import gurobipy as gp

    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 1 if verbose else 0)
        env.start()
    except gp.GurobiError as exc:
        raise SolverError(f"gurobi: no usable licence ({exc}); use --solver highs") from exc
    return env


@functools.lru_cache(maxsize=64)
def licence_covers(num_cols: int, num_rows: int) -> bool:
    """Whether this machine's Gurobi licence can solve a model of this size (tried, not guessed)."""
    import gurobipy as gp

    try:
        with _env(False) as env, gp.Model(env=env) as m:
            x = m.addMVar(num_cols, ub=0.0)
            if num_rows:
                m.addMConstr(sp.csr_matrix((num_rows, num_cols)), x, "<", np.zeros(num_rows))
            m.optimize()
            return True
    except (gp.GurobiError, SolverError):
        return False


def _ranged(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    return np.isfinite(lower) & np.isfinite(upper) & (lower != upper)


def gurobi_size(model: MilpModel) -> tuple[int, int]:
    """(variables, constraints) of the model as this backend hands it to Gurobi.

    A ranged row lo <= a x <= hi becomes one equality a x - s = 0 with a slack s in [lo, hi]
    (what Gurobi's own range constraints do), not two inequalities: the matching dependencies
    are ranged, and splitting them pushed 1756-row models past the size-limited licence."""
    return _size(inline_defined_columns(model)[0])


def _size(compact: MilpModel) -> tuple[int, int]:
    return compact.num_cols + int(_ranged(compact.row_lower, compact.row_upper).sum()), compact.num_rows


def _add_rows(m, x, A: sp.csr_matrix, lower: np.ndarray, upper: np.ndarray) -> None:
    equal = np.isfinite(lower) & (lower == upper)
    ranged = _ranged(lower, upper)
    for sense, rows, rhs in (
        ("=", equal, lower),
        ("<", ~equal & ~ranged & np.isfinite(upper), upper),
        (">", ~equal & ~ranged & np.isfinite(lower), lower),
    ):
        idx = np.flatnonzero(rows)
        if idx.size:
            m.addMConstr(A[idx], x, sense, rhs[idx])
    idx = np.flatnonzero(ranged)
    if idx.size:
        m.addMVar(idx.size, lb=lower[idx], ub=upper[idx])  # the slacks, after every model column
        m.addMConstr(
            sp.hstack([A[idx], -sp.identity(idx.size, format="csr")], format="csr"), None, "=", np.zeros(idx.size)
        )


class GurobiTree:
    """A time-limited Gurobi MIP kept alive so that a later call continues its branch-and-bound tree.

    Gurobi resumes an interrupted solve where it stopped when `optimize()` is called again on the
    unmodified model (node count and dual bound carry on; a new TimeLimit and Threads are taken
    as they are). Without it a singleton's retry would rebuild the model and re-solve from the
    root, throwing every earlier attempt's tree away (see `lucid.analysis.kept_trees`)."""

    def __init__(self, m, env, x, model: MilpModel, compact: MilpModel, expand, seconds: float) -> None:
        self._m, self._env, self._x = m, env, x
        self.model = model  # the caller's (uninlined) model, for replaying the solution
        self._compact, self._expand = compact, expand
        self.seconds = seconds  # solver time spent in this tree so far

    def resume(self, options: SolverOptions) -> SolveResult:
        """Continue the tree for up to `options.time_limit` more seconds with `options.threads`."""
        import gurobipy as gp

        if self._m is None:
            raise SolverError("gurobi: this tree was already released")
        t0 = time.perf_counter()
        self._m.Params.Threads = int(options.threads)
        self._m.Params.TimeLimit = (
            float(max(options.time_limit, 0.0)) if options.time_limit is not None else float("inf")
        )
        try:
            self._m.optimize()
        except gp.GurobiError as exc:
            self.release()
            raise SolverError(f"gurobi failed: {exc}") from exc
        result = _model_result(self._m, self._x, self._compact, self._expand, time.perf_counter() - t0, 0.0)
        self.seconds += result.seconds
        result.stats.update(resumed=True, tree_seconds=self.seconds)
        return result

    def release(self) -> None:
        if self._m is not None:
            self._m.dispose()
            self._env.dispose()
            self._m = self._env = self._x = None


def solve_gurobi(
    model: MilpModel, options: SolverOptions, extra: dict[str, object] | None = None, keep: bool = False
) -> SolveResult:
    """`keep`: a MIP that stops at its time limit comes back with `result.tree`, a `GurobiTree`
    the caller continues or releases; otherwise everything is released here."""
    import gurobipy as gp
    from gurobipy import GRB

    t0 = time.perf_counter()
    original = model
    model, expand = inline_defined_columns(model)
    env = _env(options.verbose)
    kept = False
    try:
        m = gp.Model(env=env)
        vtype = np.where(model.integrality, GRB.INTEGER, GRB.CONTINUOUS)
        x = m.addMVar(
            model.num_cols,
            lb=np.where(np.isfinite(model.col_lower), model.col_lower, -GRB.INFINITY),
            ub=np.where(np.isfinite(model.col_upper), model.col_upper, GRB.INFINITY),
            vtype=vtype,
        )
        _add_rows(m, x, sp.csr_matrix(model.A), model.row_lower, model.row_upper)
        m.setObjective(model.objective @ x + float(model.objective_offset), GRB.MAXIMIZE)
        m.Params.Threads = int(options.threads)
        m.Params.MIPGap = float(options.mip_rel_gap)
        m.Params.MIPGapAbs = float(options.mip_abs_gap)
        if options.time_limit is not None:
            m.Params.TimeLimit = float(max(options.time_limit, 0.0))
        if options.focus == "bound":
            # no primal heuristics: the caller's lower bound comes from replayed witnesses, so
            # all the time goes to the dual bound (Heuristics=0 beats MIPFocus=3 at that,
            # benchmarks/results/idle_machine.md)
            m.Params.Heuristics = 0
        for key, value in (extra or {}).items():
            m.setParam(key, value)  # type: ignore[call-overload]  # a parameter value as the caller gave it
        build_seconds = time.perf_counter() - t0
        try:
            m.optimize()
        except gp.GurobiError as exc:
            if exc.errno == SIZE_LIMIT_ERRNO:
                raise SolverError(
                    "gurobi: model too large for the size-limited licence "
                    "({} variables, {} constraints); use --solver highs".format(*_size(model))
                ) from exc
            raise SolverError(f"gurobi failed: {exc}") from exc
        result = _model_result(m, x, model, expand, time.perf_counter() - t0, build_seconds)
        if keep and result.status == TIME_LIMIT and bool(model.integrality.any()):
            result.tree = GurobiTree(m, env, x, original, model, expand, result.seconds)
            kept = True
        return result
    finally:
        if not kept:
            env.dispose()


def _model_result(m, x, compact: MilpModel, expand, seconds: float, build_seconds: float) -> SolveResult:
    """The result in the caller's columns (the compact form's solution expanded back)."""
    result = _result(m, x, compact, seconds, build_seconds)
    result.stats["gurobi_size"] = list(_size(compact))  # (variables, constraints) it was given
    if result.solution is not None:
        result.solution = expand(result.solution)
    return result


def _result(m, x, model: MilpModel, seconds: float, build_seconds: float) -> SolveResult:
    from gurobipy import GRB

    status = m.Status
    is_mip = bool(model.integrality.any())
    solution = np.array(x.X, dtype=np.float64) if m.SolCount > 0 else None  # the model's columns, not the slacks
    incumbent = float(m.ObjVal) if m.SolCount > 0 else None
    nodes = int(m.NodeCount) if is_mip else 0

    def dual_bound() -> float:
        if not is_mip:
            return float(m.ObjVal) if status == GRB.OPTIMAL else math.inf
        bound = float(m.ObjBound)
        return bound if math.isfinite(bound) and abs(bound) < GRB.INFINITY else math.inf

    names = {
        GRB.OPTIMAL: "optimal",
        GRB.INFEASIBLE: "infeasible",
        GRB.TIME_LIMIT: "time limit",
        GRB.INF_OR_UNBD: "infeasible or unbounded",
        GRB.UNBOUNDED: "unbounded",
        GRB.NODE_LIMIT: "node limit",
        GRB.SOLUTION_LIMIT: "solution limit",
        GRB.INTERRUPTED: "interrupted",
        GRB.NUMERIC: "numerical trouble",
        GRB.SUBOPTIMAL: "suboptimal",
    }
    message = names.get(status, f"gurobi status {status}")
    if status == GRB.OPTIMAL:
        code, upper = OPTIMAL, dual_bound()
    elif status == GRB.INFEASIBLE:
        code, upper, solution, incumbent = INFEASIBLE, -math.inf, None, None
    elif status == GRB.TIME_LIMIT:
        code, upper = TIME_LIMIT, dual_bound() if is_mip else math.inf
    else:
        code, upper = ERROR, math.inf
    return SolveResult(
        status=code,
        upper_bound=upper,
        incumbent=incumbent,
        solution=solution,
        nodes=nodes,
        seconds=seconds,
        solver="gurobi",
        message=message,
        stats={"build_seconds": build_seconds, "gurobi_status": int(status)},
    )
