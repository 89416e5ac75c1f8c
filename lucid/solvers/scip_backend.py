"""SCIP backend (PySCIPOpt): the model goes in through SCIP's own MPS reader (no per-row Python)."""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from lucid.milp.model import MilpModel
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions


def solve_scip(model: MilpModel, options: SolverOptions, extra: dict[str, object] | None = None) -> SolveResult:
    import pyscipopt

    from lucid.solvers.mps import write_mps

    t0 = time.perf_counter()
    m = pyscipopt.Model()
    if not options.verbose:
        m.hideOutput()
    with tempfile.TemporaryDirectory(prefix="lucid-scip-") as tmp:
        mps = Path(tmp) / "model.mps"
        # SCIP's MPS reader would rename columns without names; HiGHS writes c0..c{n-1}.
        named = model if len(model.names) == model.num_cols else _with_default_names(model)
        # The offset stays out of the file (MPS readers disagree on the sign of an objective
        # RHS; CBC even drops it) and is added back below.
        write_mps(replace(named, objective_offset=0.0), mps, minimise=True)
        m.readProblem(str(mps))
    columns = {v.name: j for j, v in enumerate(m.getVars())}
    order = np.array([columns[name] for name in named.names], dtype=np.int64)
    if options.time_limit is not None:
        m.setParam("limits/time", float(max(options.time_limit, 0.0)))
    m.setParam("limits/gap", float(options.mip_rel_gap))
    m.setParam("limits/absgap", float(options.mip_abs_gap))
    m.setParam("parallel/maxnthreads", int(options.threads))
    m.setParam("lp/threads", int(options.threads))
    if options.focus == "bound":
        m.setHeuristics(pyscipopt.SCIP_PARAMSETTING.OFF)
    for key, value in (extra or {}).items():
        m.setParam(key, value)
    build_seconds = time.perf_counter() - t0
    m.optimize()
    seconds = time.perf_counter() - t0

    status = m.getStatus()
    offset = float(model.objective_offset)
    variables = m.getVars()
    solution = incumbent = None
    if m.getNSols() > 0:
        best = m.getBestSol()
        values = np.array([m.getSolVal(best, v) for v in variables])
        solution = values[order]
        incumbent = -float(m.getSolObjVal(best)) + offset  # SCIP minimised -objective

    def dual_bound() -> float:
        bound = -float(m.getDualbound())
        return bound + offset if math.isfinite(bound) and abs(bound) < m.infinity() else math.inf

    if status in ("optimal", "gaplimit"):
        code, upper = OPTIMAL, dual_bound()
    elif status == "infeasible":
        code, upper, solution, incumbent = INFEASIBLE, -math.inf, None, None
    elif status == "timelimit":
        code, upper = TIME_LIMIT, dual_bound()
    else:
        # unbounded, inforunbd, userinterrupt, node/solution/memory limits, unknown
        code, upper = ERROR, math.inf
    if code == OPTIMAL and not math.isfinite(upper):
        code = ERROR
    return SolveResult(
        status=code,
        upper_bound=upper,
        incumbent=incumbent,
        solution=solution,
        nodes=int(m.getNNodes()),
        seconds=seconds,
        solver="scip",
        message=status,
        stats={"build_seconds": build_seconds},
    )


def _with_default_names(model: MilpModel) -> MilpModel:
    return replace(
        model, names=[f"c{j}" for j in range(model.num_cols)], row_names=[f"r{i}" for i in range(model.num_rows)]
    )
