"""CBC backend: PuLP's bundled `cbc` binary run on an MPS file, its dual bound read from the log.

PuLP does not expose CBC's dual bound, so we run the same binary PuLP ships directly (the model
goes in as one MPS file written by HiGHS — no per-row Python) and read the bound from the log:

* stopped on a limit: `Partial search - best objective U (best possible L)` — L is the bound;
* optimal with zero gaps: `Search completed - best objective U` — the search closed, L = U;
  with nonzero gaps L >= U - gap where CBC stopped because gap <= abs or <= rel*|U or L|,
  hence gap <= abs + rel*max(|U|,1)/(1-rel);
* LP (no integers): the optimal objective of the solution file.

Pitfalls handled (each found by tests/solvers/test_solvers.py):
* CBC's preprocessing (Cgl) drops objective constants from the objective it logs (a model with
  optimum -7.9 logs "best objective -6.9"), so it runs with `-preprocess off -presolve off`
  and the model's objective offset never goes to CBC (we add it back ourselves);
* as a guard, a replayed incumbent's objective must match the logged U, else the log is not in
  the model's space and nothing is claimed (+inf);
* CBC minimises -objective here, so the reported upper bound is -L; printed numbers are rounded
  (`%.8g`), so every bound is widened by one unit in its last significant digit.
Anything else (no bound line, unbounded, stopped for another reason) gives +inf. CBC's solution
file is replayed by `solve()` like every incumbent and dropped when infeasible.
"""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np

from lucid.errors import SolverError
from lucid.milp.model import MilpModel
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT, SolveResult, SolverOptions
from lucid.solvers.solution_check import REPLAY_TOLERANCE, replay_solution

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_PARTIAL = re.compile(r"Partial search - best objective \S+ \(best possible " + _NUM + r"\)")
_PARTIAL_BEST = re.compile(r"Partial search - best objective " + _NUM)
_COMPLETED = re.compile(r"Search completed - best objective " + _NUM)
_RESULT = re.compile(r"^Result - (.*)$", re.MULTILINE)
_NODES = re.compile(r"Enumerated nodes:\s+(\d+)")
_SOL_HEADER = re.compile(r"objective value " + _NUM)


def cbc_path() -> str:
    import pulp

    solver = pulp.PULP_CBC_CMD(msg=False)
    if not solver.available():
        raise SolverError("cbc: PuLP's bundled CBC binary is not available: pip install pulp")
    return solver.path


def _unit(text: str, significant: int = 0) -> float:
    """Twice the worst rounding error of the printed number `text`: one unit in its last digit.

    CBC's log messages print `%.8g` (so "-9" means -9 to 8 significant digits, trailing zeros
    stripped): with `significant`, the unit is never finer than that many significant digits.
    """
    d = Decimal(text)
    _sign, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):
        return math.inf
    unit = Decimal(1).scaleb(exponent)
    if significant and d.is_zero():
        unit = Decimal(0)  # %g prints any nonzero value with its exponent, so "0" is exact
    elif significant and len(digits) < significant:
        unit = Decimal(1).scaleb(d.adjusted() - significant + 1)
    return float(unit) + 1e-12


def upper_from_min_bound(text: str, significant: int = 0) -> float:
    """Sound max-sense upper bound from a printed min-sense lower bound of -objective."""
    return -float(text) + _unit(text, significant)


LOG_DIGITS = 8  # CBC's %.8g in Cbc0001I/Cbc0005I messages


def _read_solution(path: Path, n: int) -> np.ndarray | None:
    if not path.is_file():
        return None
    x = np.zeros(n)
    lines = path.read_text().splitlines()
    for line in lines[1:]:
        parts = line.replace("**", " ").split()
        if len(parts) >= 3:
            x[int(parts[0])] = float(parts[2])
    return x


def solve_cbc(model: MilpModel, options: SolverOptions, extra: dict[str, object] | None = None) -> SolveResult:
    from lucid.solvers.mps import write_mps

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lucid-cbc-") as tmp:
        mps, sol = Path(tmp) / "model.mps", Path(tmp) / "solution.txt"
        write_mps(replace(model, objective_offset=0.0), mps, minimise=True)
        args = [
            cbc_path(),
            str(mps),
            "-preprocess",
            "off",
            "-presolve",
            "off",
            "-threads",
            str(int(options.threads)),
            "-ratioGap",
            repr(float(options.mip_rel_gap)),
            "-allowableGap",
            repr(float(options.mip_abs_gap)),
            "-timeMode",
            "elapsed",
        ]
        if options.time_limit is not None:
            args += ["-sec", repr(float(max(options.time_limit, 0.0)))]
        for key, value in (extra or {}).items():
            args += [f"-{key}", str(value)]
        args += ["-solve", "-solution", str(sol)]
        build_seconds = time.perf_counter() - t0
        # CBC checks its own -sec limit; the subprocess timeout is only a backstop.
        timeout = None if options.time_limit is None else 2 * options.time_limit + 60
        try:
            # an argument list, no shell: PuLP's bundled cbc and file names of our own temporary folder
            # check=False: CBC's exit status says nothing the log does not (its status is read from it)
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
        except subprocess.TimeoutExpired as exc:
            raise SolverError(f"cbc did not stop within {timeout:.0f} s") from exc
        log = proc.stdout + proc.stderr
        if options.verbose:
            print(log)  # noqa: T201 (options.verbose: the solver's log, as asked)
        solution = _read_solution(sol, model.num_cols)
        sol_text = sol.read_text() if sol.is_file() else ""
    return _result(model, options, log, sol_text, solution, time.perf_counter() - t0, build_seconds)


def _result(model, options, log, sol_text, solution, seconds, build_seconds) -> SolveResult:
    """Status and sound bound from CBC's log; CBC saw the model without its objective offset."""
    is_mip = bool(model.integrality.any())
    offset = float(model.objective_offset)
    result_line = _RESULT.search(log)
    header = sol_text.splitlines()[0].strip() if sol_text.strip() else "no CBC solution file"
    # The branch-and-bound ends with a "Result - ..." line; a pure LP (solved by Clp) or a MIP
    # whose first LP is already infeasible only reports in the solution file's first line.
    message = result_line.group(1).strip() if (is_mip and result_line) else header
    nodes = int(m.group(1)) if (m := _NODES.search(log)) else 0
    partial, completed = _PARTIAL.search(log), _COMPLETED.search(log)
    logged_best = None  # CBC's incumbent objective as logged (min of -objective)
    upper, code = math.inf, ERROR
    if message.startswith("Optimal"):
        code = OPTIMAL
        if not is_mip:
            m = _SOL_HEADER.search(sol_text)
            upper = upper_from_min_bound(m.group(1)) if m else math.inf
        elif completed:
            logged_best = completed.group(1)
            upper = upper_from_min_bound(logged_best, LOG_DIGITS)
            r, a = float(options.mip_rel_gap), float(options.mip_abs_gap)
            if r > 0 or a > 0:
                widen = a + r * max(abs(float(logged_best)), 1.0) / max(1.0 - r, 1e-12) + 1e-9
                upper = upper + widen if r < 1 else math.inf
        if not math.isfinite(upper):
            code = ERROR
    elif "infeasible" in message.lower():
        code, upper, solution = INFEASIBLE, -math.inf, None
    elif message.startswith("Stopped on time"):
        code = TIME_LIMIT
        if is_mip and partial:
            best = _PARTIAL_BEST.search(log)
            if best is None:  # a best objective that is not a number
                raise SolverError("cbc's log has a partial search without a numeric best objective")
            logged_best = best.group(1)
            upper = upper_from_min_bound(partial.group(1), LOG_DIGITS)
    incumbent = None
    if solution is not None and code != INFEASIBLE:
        incumbent = float(model.objective @ solution) + offset
    else:
        solution = None
    replays = solution is not None and replay_solution(model, solution).ok(REPLAY_TOLERANCE)
    if logged_best is not None and replays and _log_space_mismatch(logged_best, float(model.objective @ solution)):
        message += " (CBC's logged objective does not match its solution: bound discarded)"
        code, upper = ERROR, math.inf
    upper += offset
    return SolveResult(
        status=code,
        upper_bound=upper,
        incumbent=incumbent,
        solution=solution,
        nodes=nodes,
        seconds=seconds,
        solver="cbc",
        message=message,
        stats={"build_seconds": build_seconds},
    )


def _log_space_mismatch(logged_best: str, solution_objective: float) -> bool:
    """Whether CBC's logged incumbent (min of -objective) differs from the solution's objective."""
    tolerance = _unit(logged_best, LOG_DIGITS) + 1e-6 * max(1.0, abs(solution_objective))
    return abs(-float(logged_best) - solution_objective) > tolerance
