"""Every installed MILP backend on small hand-made models with independently known optima."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
from milp_models import market_split, model
from scipy.optimize import linprog

from lucid.milp.model import MilpModel
from lucid.errors import LucidError, SolverError, UnsoundSolverResult
from lucid.solvers import (
    ERROR,
    INFEASIBLE,
    OPTIMAL,
    TIME_LIMIT,
    SolveResult,
    SolverOptions,
    available_solvers,
    check_result,
    resolve_solver,
    solve,
)
from lucid.solvers.solution_check import replay_solution

INF = np.inf
INSTALLED = [name for name, ok in available_solvers().items() if ok]


def knapsack() -> MilpModel:
    # max 5a + 4b + 3c, 2a + 3b + c <= 5, binary: a = b = 1 gives 9 (a + c gives 8).
    return model([[2, 3, 1]], [-INF], [5], [0, 0, 0], [1, 1, 1], [1, 1, 1], [5, 4, 3])


def mixed() -> MilpModel:
    # x in Z[-3,3], y in [0,2.5], z free; x + y <= 3.7; -1 <= x - y <= 1 (ranged); z - 2x = 1.
    # max x + 2y + 0.5z + 3 = 2x + 2y + 3.5: x=3 infeasible (y>=2, y<=0.7); x=2, y=1.7 -> 10.9.
    return model(
        [[1, 1, 0], [1, -1, 0], [-2, 0, 1]],
        [-INF, -1, 1],
        [3.7, 1, 1],
        [-3, 0, -INF],
        [3, 2.5, INF],
        [1, 0, 0],
        [1, 2, 0.5],
        offset=3.0,
    )


def random_milp(seed: int, n_int: int = 7, n_cont: int = 3, m: int = 6) -> MilpModel:
    rng = np.random.default_rng(seed)
    n = n_int + n_cont
    A = np.round(rng.uniform(-2, 3, size=(m, n)), 2)
    A[rng.random((m, n)) < 0.3] = 0.0
    x0 = np.concatenate([rng.integers(0, 2, n_int), rng.uniform(0, 1, n_cont)])
    act = A @ x0  # planted feasible point, so the model is feasible
    return model(
        A,
        np.where(rng.random(m) < 0.3, act - rng.uniform(0, 1, m), -INF),
        act + rng.uniform(0, 1, m),
        np.zeros(n),
        np.concatenate([np.ones(n_int), np.full(n_cont, 2.0)]),
        np.arange(n) < n_int,
        np.round(rng.normal(size=n), 2),
    )


def brute_force(m: MilpModel) -> float:
    """Exact optimum: enumerate the binaries, one LP (scipy) over the continuous rest each."""
    ints = np.flatnonzero(m.integrality)
    conts = np.flatnonzero(~m.integrality)
    A = m.A.toarray()
    best = -math.inf
    for values in itertools.product([0, 1], repeat=len(ints)):
        fixed = A[:, ints] @ np.array(values, dtype=float)
        Ac = A[:, conts]
        ub_rows = np.isfinite(m.row_upper)
        lb_rows = np.isfinite(m.row_lower)
        A_ub = np.vstack([Ac[ub_rows], -Ac[lb_rows]])
        b_ub = np.concatenate([m.row_upper[ub_rows] - fixed[ub_rows],
                               -(m.row_lower[lb_rows] - fixed[lb_rows])])
        res = linprog(-m.objective[conts], A_ub=A_ub, b_ub=b_ub,
                      bounds=list(zip(m.col_lower[conts], m.col_upper[conts])), method="highs")
        if res.status == 0:
            best = max(best, -res.fun + m.objective[ints] @ np.array(values) + m.objective_offset)
    return best


@pytest.fixture(params=INSTALLED)
def backend(request) -> str:
    return request.param


def test_knapsack_and_mixed_known_optima(backend):
    for mdl, expected in ((knapsack(), 9.0), (mixed(), 10.9)):
        r = solve(mdl, backend, SolverOptions(time_limit=20))
        assert r.status == OPTIMAL, (backend, r.message)
        assert r.upper_bound == pytest.approx(expected, abs=1e-6)
        assert r.incumbent == pytest.approx(expected, abs=1e-6)
        assert replay_solution(mdl, r.solution).ok(1e-6)
        assert r.solver == backend


def test_bound_focus_changes_the_search_not_the_optimum(backend):
    for seed in (0, 1):
        mdl = random_milp(seed)
        exact = brute_force(mdl)
        r = solve(mdl, backend, SolverOptions(time_limit=20, focus="bound"))
        assert r.status == OPTIMAL, (backend, r.message)
        assert r.upper_bound == pytest.approx(exact, abs=1e-6)


def test_unknown_focus_is_refused():
    with pytest.raises(ValueError, match="focus"):
        SolverOptions(focus="fast")


def test_mixed_solution_is_the_unique_optimum(backend):
    r = solve(mixed(), backend, SolverOptions(time_limit=20))
    np.testing.assert_allclose(r.solution, [2.0, 1.7, 5.0], atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_milps_match_brute_force_and_agree(seed):
    mdl = random_milp(seed)
    exact = brute_force(mdl)
    bounds = {}
    for name in INSTALLED:
        r = solve(mdl, name, SolverOptions(time_limit=20))
        assert r.status == OPTIMAL, (name, r.message)
        assert r.upper_bound >= exact - 1e-6, name  # soundness
        bounds[name] = r.upper_bound
    for name, ub in bounds.items():
        assert ub == pytest.approx(exact, abs=1e-6), (name, bounds, exact)


def test_pure_lp(backend):
    # max x + y, x + 2y <= 4, 3x + y <= 6, x, y >= 0: vertex (1.6, 1.2) -> 2.8
    mdl = model([[1, 2], [3, 1]], [-INF, -INF], [4, 6], [0, 0], [INF, INF], [0, 0], [1, 1])
    r = solve(mdl, backend, SolverOptions(time_limit=20))
    assert r.status == OPTIMAL
    assert r.upper_bound == pytest.approx(2.8, abs=1e-6)
    assert r.upper_bound >= 2.8 - 1e-9


def test_infeasible_gives_minus_infinity(backend):
    mdl = model([[1, 1]], [3], [INF], [0, 0], [1, 1], [1, 1], [1, 1])
    r = solve(mdl, backend, SolverOptions(time_limit=20))
    assert r.status == INFEASIBLE, r.message
    assert r.upper_bound == -math.inf
    assert r.solution is None and r.incumbent is None


def test_lp_unbounded_but_mip_infeasible_never_gets_a_finite_bound(backend):
    # 2x = 1 has no integer solution; y is unbounded above, so the LP relaxation is unbounded.
    mdl = model([[2, 0], [0, 1]], [1, 0], [1, INF], [0, -INF], [10, INF], [1, 0], [0, 1])
    r = solve(mdl, backend, SolverOptions(time_limit=20))
    assert (r.status, r.upper_bound) in ((INFEASIBLE, -math.inf), (ERROR, math.inf)), r
    assert r.solution is None or not replay_solution(mdl, r.solution).ok(1e-6)


def test_unbounded_mip_reports_nothing_proved(backend):
    mdl = model([[-1, 1]], [0], [INF], [0, 0], [1, INF], [1, 0], [0, 1])  # max y, y - x >= 0
    r = solve(mdl, backend, SolverOptions(time_limit=20))
    assert r.status == ERROR, r
    assert r.upper_bound == math.inf


def test_time_limit_keeps_a_sound_dual_bound(backend):
    mdl = market_split(3)
    r = solve(mdl, backend, SolverOptions(time_limit=0.5))
    assert r.status in (TIME_LIMIT, OPTIMAL), r
    assert r.upper_bound >= 0.0 - 1e-9  # the planted solution has objective 0
    if r.status == TIME_LIMIT:
        assert r.seconds < 15
    if r.incumbent is not None:
        assert r.upper_bound >= r.incumbent


NODE_LIMIT = {
    "highs": {"mip_max_nodes": 1},
    "gurobi": {"NodeLimit": 1},
    "scip": {"limits/nodes": 1},
    "cbc": {"maxNodes": 1},
}


def test_other_limits_prove_nothing(backend):
    r = solve(market_split(4), backend, SolverOptions(time_limit=20), **NODE_LIMIT[backend])
    assert r.status == ERROR, r
    assert r.upper_bound == math.inf


def test_unknown_solver_lists_valid_names():
    with pytest.raises(LucidError, match="valid solvers: auto, highs, gurobi, cbc, scip"):
        solve(knapsack(), "cplex")


def test_missing_backend_names_pip_package(monkeypatch):
    import lucid.solvers.registry as registry

    monkeypatch.setattr(registry, "available_solvers",
                        lambda: {"highs": True, "gurobi": False, "cbc": True, "scip": True})
    with pytest.raises(SolverError, match="pip install gurobipy"):
        solve(knapsack(), "gurobi")


def test_bound_below_replayed_incumbent_is_refused():
    mdl = knapsack()
    lying = SolveResult(status=OPTIMAL, upper_bound=8.0, incumbent=9.0,
                        solution=np.array([1.0, 1.0, 0.0]), solver="fake")
    with pytest.raises(UnsoundSolverResult):
        check_result(mdl, lying)


def test_infeasible_incumbent_is_dropped():
    mdl = knapsack()
    bad = SolveResult(status=TIME_LIMIT, upper_bound=20.0, incumbent=12.0,
                      solution=np.array([1.0, 1.0, 1.0]), solver="fake")  # 2+3+1 > 5
    r = check_result(mdl, bad)
    assert r.solution is None and r.incumbent is None and r.upper_bound == 20.0


def test_incumbent_objective_is_recomputed_not_trusted():
    mdl = knapsack()
    r = check_result(mdl, SolveResult(status=TIME_LIMIT, upper_bound=9.5, incumbent=9.4,
                                      solution=np.array([1.0, 1.0, 0.0]), solver="fake"))
    assert r.incumbent == 9.0


def test_highs_model_build_is_vectorised():
    rng = np.random.default_rng(0)
    n, m = 5000, 10000
    A = sp.random(m, n, density=5 / n, format="csr", random_state=rng)
    big = MilpModel(A=A, row_lower=np.full(m, -INF), row_upper=np.ones(m),
                    col_lower=np.zeros(n), col_upper=np.ones(n),
                    integrality=np.arange(n) < 1000, objective=rng.normal(size=n))
    r = solve(big, "highs", SolverOptions(time_limit=0.01))
    assert r.stats["build_seconds"] < 1.0
    assert r.upper_bound >= (r.incumbent if r.incumbent is not None else -INF)


def test_auto_prefers_highs_when_gurobi_licence_is_too_small():
    n = 2500  # the pip licence stops at 2000 variables
    big = MilpModel(A=sp.csr_matrix((1, n)), row_lower=np.zeros(1), row_upper=np.ones(1),
                    col_lower=np.zeros(n), col_upper=np.ones(n), integrality=np.zeros(n, bool),
                    objective=np.ones(n))
    from lucid.solvers.gurobi_backend import licence_covers

    if available_solvers()["gurobi"] and licence_covers(n, 1):
        pytest.skip("this Gurobi licence is not size-limited")
    assert resolve_solver("auto", big) == "highs"
    if available_solvers()["gurobi"]:
        with pytest.raises(SolverError, match="--solver highs"):
            solve(big, "gurobi")


@pytest.mark.skipif(not available_solvers()["gurobi"], reason="gurobipy not installed")
def test_auto_picks_gurobi_for_a_small_model():
    assert resolve_solver("auto", knapsack()) == "gurobi"
    assert solve(knapsack(), "auto").solver == "gurobi"


def _ranged_chain(n: int, m: int, ranged: int) -> MilpModel:
    """max sum x, x in [0, 1]^n, m two-entry rows x_i - x_{i+1}; the first `ranged` are two-sided."""
    rows = np.arange(m)
    A = sp.csr_matrix((np.tile([1.0, -1.0], m), (np.repeat(rows, 2), np.stack([rows % (n - 1), rows % (n - 1) + 1], 1).ravel())),
                      shape=(m, n))
    lower = np.where(rows < ranged, -0.25, -np.inf)
    upper = np.full(m, 0.25)
    return MilpModel(A=A, row_lower=lower, row_upper=upper, col_lower=np.zeros(n), col_upper=np.ones(n),
                     integrality=np.arange(n) < 5, objective=-np.linspace(1.0, 2.0, n))


@pytest.mark.skipif(not available_solvers()["gurobi"], reason="gurobipy not installed")
def test_gurobi_ranged_rows_keep_both_sides_and_count_once():
    # 900 columns and 1500 rows, 1000 of them ranged: one constraint each (plus a slack column),
    # so the model is (1900, 1500) for Gurobi and fits a 2000 x 2000 licence; as two
    # inequalities per ranged row it would have 2500 constraints and not.
    from lucid.solvers.gurobi_backend import gurobi_size

    model = _ranged_chain(900, 1500, 1000)
    assert gurobi_size(model) == (1900, 1500)
    g, h = solve(model, "gurobi"), solve(model, "highs")
    assert g.status == h.status == "optimal"
    assert g.upper_bound == pytest.approx(h.upper_bound, abs=1e-6)
    assert g.solution.shape == (900,)
    act = model.A @ g.solution
    assert np.all(act >= model.row_lower - 1e-6) and np.all(act <= model.row_upper + 1e-6)
    # alternate signs push x_i - x_{i+1} down: the ranged rows' lower sides must bind
    flip = MilpModel(A=model.A, row_lower=model.row_lower, row_upper=model.row_upper, col_lower=model.col_lower,
                     col_upper=model.col_upper, integrality=model.integrality,
                     objective=np.where(np.arange(900) % 2 == 0, -1.0, 1.0))
    gf, hf = solve(flip, "gurobi"), solve(flip, "highs")
    assert gf.upper_bound == pytest.approx(hf.upper_bound, abs=1e-6)
    act = flip.A @ gf.solution
    assert act[:1000].min() == pytest.approx(-0.25, abs=1e-6)


def test_auto_without_gurobi_is_highs(monkeypatch):
    import lucid.solvers.registry as registry

    monkeypatch.setattr(registry, "available_solvers",
                        lambda: {"highs": True, "gurobi": False, "cbc": True, "scip": True})
    assert resolve_solver("auto", knapsack()) == "highs"


def test_highs_thread_count_changes_and_concurrent_solves():
    """HiGHS's global scheduler would fail a solve asking for a new thread count ('Not Set')."""
    from concurrent.futures import ThreadPoolExecutor

    for threads in (1, 2, 1):
        assert solve(knapsack(), "highs", SolverOptions(threads=threads)).upper_bound == 9.0
    expected = {seed: brute_force(random_milp(seed)) for seed in range(2)}

    def run(i: int) -> tuple[int, float]:
        r = solve(random_milp(i % 2), "highs", SolverOptions(threads=1 + i % 2))
        return i % 2, r.upper_bound

    with ThreadPoolExecutor(4) as pool:
        for seed, upper in pool.map(run, range(8)):
            assert upper == pytest.approx(expected[seed], abs=1e-6)


def test_highs_runs_on_a_scheduler_started_elsewhere_with_other_threads():
    """Another module calling highspy first (threads=3) must not make our solves fail."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import highspy, numpy as np, scipy.sparse as sp
        from lucid.milp.model import MilpModel
        from lucid.solvers.mps import to_highs_lp
        from lucid.solvers import SolverOptions, solve
        m = MilpModel(A=sp.csr_matrix([[2.0, 3.0, 1.0]]), row_lower=np.array([-np.inf]),
                      row_upper=np.array([5.0]), col_lower=np.zeros(3), col_upper=np.ones(3),
                      integrality=np.ones(3, bool), objective=np.array([5.0, 4.0, 3.0]))
        h = highspy.Highs(); h.silent(); h.setOptionValue("threads", 3)
        h.passModel(to_highs_lp(m)); h.run()
        print(solve(m, "highs", SolverOptions(threads=1)).upper_bound)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) == 9.0


def test_cross_check_keeps_the_largest_proved_bound(monkeypatch):
    """A lying backend (bound below the optimum, no incumbent) is caught by a '+' cross-check."""
    from lucid.solvers import registry

    def liar(model, options, backend_options):
        return SolveResult(status=OPTIMAL, upper_bound=7.0, solver="cbc")  # true optimum is 9

    monkeypatch.setitem(registry.BACKENDS, "cbc", registry.Backend("pulp", "pulp", lambda: liar))
    assert solve(knapsack(), "cbc").upper_bound == 7.0  # the lie alone goes through unnoticed
    checked = solve(knapsack(), "cbc+highs")
    assert checked.upper_bound == pytest.approx(9.0, abs=1e-6)
    assert checked.incumbent == pytest.approx(9.0, abs=1e-6)
    assert checked.solver == "cbc+highs" and set(checked.stats["cross_check"]) == {"cbc", "highs"}


def test_cross_check_spec_errors():
    with pytest.raises(LucidError, match="unknown solver 'nosuch'"):
        solve(knapsack(), "highs+nosuch")
    with pytest.raises(LucidError, match="invalid solver"):
        solve(knapsack(), "highs+")



def test_highs_prints_nothing_on_stdout_before_it_is_asked_to():
    """HiGHS writes a banner to the C-level stdout when a process makes its first instance; LUCID's
    solves must not (it would land in `lucid verify`'s progress display and in piped stdout)."""
    import subprocess
    import sys

    code = (
        "import numpy as np, scipy.sparse as sp\n"
        "from lucid.milp.model import MilpModel\n"
        "from lucid.solvers import solve, SolverOptions\n"
        "m = MilpModel(A=sp.csr_matrix(np.array([[1.0, 1.0]])), row_lower=np.array([-np.inf]),\n"
        "              row_upper=np.array([1.5]), col_lower=np.zeros(2), col_upper=np.ones(2),\n"
        "              integrality=np.array([True, True]), objective=np.array([1.0, 2.0]))\n"
        "r = solve(m, 'highs', SolverOptions())\n"
        "print(round(r.upper_bound, 6))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "2.0\n"
