"""The server-wide total budget and choosing epsilon from a target (E, delta) over Q answers.

- `total_budget` caps the ledger's all-clients row ('*', the memo's draws given to clients) by
  its worst-case charge, refuses like a per-client budget, and stays exact when two processes
  race on one memo file;
- `plan_epsilon` / `lucid serve --target-epsilon` / `lucid budget --plan` pick the largest
  per-answer epsilon (a 6-digit decimal) whose Q-fold composition is at most (E, delta).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from lucid.access import BudgetExceeded, ClassifierOptions, LabelOnlyClassifier, optimal_composition, plan_epsilon
from lucid.errors import LucidError
from lucid.network import confidence, load_networks
from serve_helpers import OFFSET, SCALE  # the run of the `run_dir` fixture (conftest.py)

BETA = np.array([0.3, np.inf, -1.0])


def to_orig(xn: np.ndarray) -> np.ndarray:
    return np.asarray(xn) / SCALE + OFFSET


def split_by_branch(run_dir) -> tuple[np.ndarray, np.ndarray]:
    """Network-space inputs the fixture's bounds release, and ones they noise (from the IR)."""
    xn = np.random.default_rng(5).random((400, 2))
    scores = load_networks(run_dir).forward(xn)[0]
    noised = ~(confidence(scores) > BETA[scores.argmax(1)])
    assert noised.sum() >= 30 and (~noised).sum() >= 30
    return xn[~noised], xn[noised]


# -- the total budget -------------------------------------------------------------------------
def test_the_total_budget_caps_all_clients_whatever_the_branch(run_dir, tmp_path):
    rel, noi = split_by_branch(run_dir)
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=tmp_path / "m.sqlite",
                                       options=ClassifierOptions(seed=0, total_budget=4.0))
    first = clf.predict(to_orig(np.vstack([rel[:2], noi[:1]])), client="a")
    clf.predict(to_orig(noi[1:2]), client="b")  # four draws: the total of 4 is reached exactly
    # Any new input is refused now, for any client, released or noised, alone or in a batch ...
    for client, probe in [("a", rel[5:6]), ("b", noi[5:6]), ("c", rel[6:7]), ("c", np.vstack([rel[:1], noi[6:7]]))]:
        with pytest.raises(BudgetExceeded, match="total privacy budget of 4 ") as refused:
            clf.predict(to_orig(probe), client=client)
        assert "\n" not in str(refused.value)
    # ... while inputs already drawn are answered, also to a client that never asked them: no new
    # draw, so the all-clients row does not grow (the client's own row does).
    assert clf.predict(to_orig(rel[:2]), client="c").tolist() == first[:2].tolist()
    assert len(clf.memo) == 4  # refused requests stored nothing
    totals = {t.client: t for t in clf.ledger()}
    assert (totals["*"].answers, totals["*"].charged) == (4, 4.0)
    assert (totals["c"].answers, totals["c"].refused) == (2, 2)
    assert (totals["a"].refused, totals["b"].refused) == (1, 1)
    clf.close()
    # The total survives a restart, and the per-client budget is still checked (first).
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=tmp_path / "m.sqlite",
                                       options=ClassifierOptions(total_budget=4.0, budget=2.0))
    with pytest.raises(BudgetExceeded, match="total"):
        clf.predict(to_orig(noi[7:8]), client="new")
    with pytest.raises(BudgetExceeded, match="for this client"):
        clf.predict(to_orig(noi[:1]), client="c")  # drawn for a, new to c, who holds 2 already
    clf.close()
    for bad in (-1.0, float("nan"), float("inf"), "lots"):
        with pytest.raises(LucidError, match="total privacy budget"):
            LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(total_budget=bad))


def test_a_total_refusal_over_http_is_a_429_with_one_fixed_message(run_dir):
    from lucid.access.server import ServiceOptions, create_app

    rel, noi = split_by_branch(run_dir)
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(total_budget=2.0))
    keys = {"alice": "a-token", "bob": "b-token"}

    async def ask() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(clf, options=ServiceOptions(api_keys=keys)))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            out = []
            for token, rows in [("a-token", rel[:1]), ("b-token", noi[:1]), ("a-token", rel[1:2]),
                                ("b-token", noi[1:2]), ("b-token", rel[:1])]:
                out.append(await client.post("/v1/predict", json={"inputs": to_orig(rows).tolist()},
                                             headers={"authorization": f"Bearer {token}"}))
            return out

    answers = asyncio.run(ask())
    clf.close()
    assert [r.status_code for r in answers] == [200, 200, 429, 429, 200]
    assert answers[2].content == answers[3].content  # the same for a released and a noised input
    assert set(answers[2].json()) == {"error"} and "total privacy budget" in answers[2].json()["error"]


_RACER = """
import json, sys, time
from pathlib import Path
import numpy as np
from lucid.access import BudgetExceeded, ClassifierOptions, LabelOnlyClassifier

run, memo, client, kind, cap, inputs, ready, go = sys.argv[1:9]
options = ClassifierOptions(budget=float(cap)) if kind == "client" else ClassifierOptions(total_budget=float(cap))
clf = LabelOnlyClassifier.from_run(run, epsilon=0.5, memo=memo, options=options)
rows = np.load(inputs)
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.001)
answered = refused = 0
for row in rows:
    try:
        clf.predict(row[None, :], client=client)
        answered += 1
    except BudgetExceeded:
        refused += 1
clf.close()
print(json.dumps({"answered": answered, "refused": refused}))
"""


@pytest.mark.parametrize("kind", ["client", "total"])
def test_budgets_are_exact_when_two_processes_race(run_dir, tmp_path, kind):
    """Two processes on one memo file, one input per request, 60 distinct inputs each, against a
    cap of 40 answers (20 at epsilon 0.5): exactly 40 are answered in all, never more. `client`:
    both charge one client's budget; `total`: two clients and the total budget."""
    memo = tmp_path / "m.sqlite"
    LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=memo).close()  # create the file once
    pool = to_orig(np.random.default_rng(11).random((120, 2)))
    procs = []
    for p in range(2):
        np.save(tmp_path / f"in{p}.npy", pool[60 * p : 60 * (p + 1)])
        client = "shared" if kind == "client" else f"p{p}"
        args = [str(run_dir), str(memo), client, kind, "20", str(tmp_path / f"in{p}.npy"),
                str(tmp_path / f"ready{p}"), str(tmp_path / "go")]
        procs.append(subprocess.Popen([sys.executable, "-c", _RACER, *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{p}").exists() for p in range(2)):
        assert time.monotonic() < deadline and all(proc.poll() is None for proc in procs), \
            [proc.communicate() for proc in procs]
        time.sleep(0.01)
    (tmp_path / "go").touch()  # both start together
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sum(r["answered"] for r in results) == 40
    assert sum(r["refused"] for r in results) == 80
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=memo)
    totals = {t.client: t for t in clf.ledger()}
    assert len(clf.memo) == 40 and (totals["*"].answers, totals["*"].charged) == (40, 20.0)
    clf.close()


# -- choosing epsilon from a target -----------------------------------------------------------
def _exact_delta(eps: float, k: int, eps_prime: float) -> float:
    """delta(eps') of k-fold binary randomized response with log-ratio eps (closed form): the
    worst case of k eps-DP answers, computed without dp-accounting."""
    from scipy.stats import binom

    j = np.arange(k + 1)
    loss = eps * (k - 2 * j)
    pmf = binom.pmf(j, k, 1.0 / (1.0 + np.exp(eps)))
    return float(np.sum(pmf * np.clip(1.0 - np.exp(eps_prime - loss), 0.0, None)))


def _next_decimal(eps: float) -> float:
    """The next 6-significant-digit decimal above eps (eps is one)."""
    digits = f"{eps:.5e}"
    mantissa, exponent = digits.split("e")
    return float(f"{int(mantissa.replace('.', '')) + 1}e{int(exponent) - 5}")


@pytest.mark.parametrize("target,delta,queries", [(10.0, 1e-6, 1000), (1.0, 1e-5, 100), (4.0, 1e-6, 37),
                                                  (1.0, 1e-6, 1), (0.5, 1e-3, 2000)])
def test_the_planned_epsilon_is_the_largest_that_composes_to_the_target(target, delta, queries):
    plan = plan_epsilon(target, delta, queries)
    eps = plan.epsilon
    assert float(f"{eps:.6g}") == eps  # a 6-digit decimal: what the start line prints, reproducible
    # The accountant `lucid budget` uses, called here on its own: eps fits, the next decimal does not.
    assert optimal_composition([(eps, queries)], delta) <= target
    assert optimal_composition([(_next_decimal(eps), queries)], delta) > target
    assert plan.composed == optimal_composition([(eps, queries)], delta)
    # Sound in closed form too (the accountant is pessimistic, so never below the exact delta).
    assert _exact_delta(eps, queries, target) <= delta * (1 + 1e-6)
    assert plan.budget == pytest.approx(eps * queries, rel=1e-15) and plan.basic_epsilon == target / queries
    assert eps >= plan.basic_epsilon
    if queries >= 100:
        assert eps > 2 * plan.basic_epsilon  # the point of the accountant over basic composition


@pytest.mark.parametrize("target,delta,queries,message", [
    (0.0, 1e-6, 10, "target epsilon"), (-1.0, 1e-6, 10, "target epsilon"), (float("nan"), 1e-6, 10, "target"),
    (float("inf"), 1e-6, 10, "target"), (1.0, 0.0, 10, "delta"), (1.0, 1.0, 10, "delta"),
    (1.0, float("nan"), 10, "delta"), (1.0, 1e-6, 0, "queries"), (1.0, 1e-6, -5, "queries"),
    (1.0, 1e-6, 2.5, "queries"), (1.0, 1e-6, 10**9, "queries"),
])
def test_bad_plans_are_refused(target, delta, queries, message):
    with pytest.raises(LucidError, match=message):
        plan_epsilon(target, delta, queries)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from lucid.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_budget_plan_prints_the_plan_without_a_run(capsys, tmp_path):
    plan = plan_epsilon(10.0, 1e-6, 1000)
    code, out, err = _cli(capsys, "budget", "--plan", "--target-epsilon", "10", "--delta", "1e-6", "--queries", "1000")
    assert code == 0 and not err
    assert f"per-answer epsilon: {plan.epsilon:g}" in out and f"per-client budget: {plan.budget:.6g}" in out
    assert "basic composition alone would allow: per-answer epsilon 0.01" in out
    code, out, _ = _cli(capsys, "budget", "--plan", "--target-epsilon", "10", "--queries", "1000", "--json")
    assert code == 0 and json.loads(out) == plan.to_json()  # --delta defaults to 1e-6
    for args, message in [
        (["--target-epsilon", "0", "--queries", "10"], "target epsilon"),
        (["--target-epsilon", "nan", "--queries", "10"], "target epsilon"),
        (["--target-epsilon", "inf", "--queries", "10"], "target epsilon"),
        (["--target-epsilon", "x", "--queries", "10"], "target-epsilon"),
        (["--target-epsilon", "1", "--queries", "10", "--delta", "1"], "delta"),
        (["--target-epsilon", "1", "--queries", "10", "--delta", "0"], "delta"),
        (["--target-epsilon", "1", "--queries", "0"], "queries"),
        (["--target-epsilon", "1", "--queries", "1.5"], "queries"),
        (["--target-epsilon", "1"], "--queries"),
        ([], "--target-epsilon"),
    ]:
        code, out, err = _cli(capsys, "budget", "--plan", *args)
        assert code == 2 and not out and message in err and len(err.strip().splitlines()) == 1, (args, err)
    for args, message in [(["--target-epsilon", "1", "--queries", "3"], "--plan"), ([], "RUN"),
                          ([str(tmp_path), "--plan", "--target-epsilon", "1", "--queries", "3"], "no run")]:
        code, _, err = _cli(capsys, "budget", *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)


def _serve(run_dir: Path, args: list[str], capsys, monkeypatch) -> tuple[object, str, LabelOnlyClassifier | None]:
    """`lucid serve` in process up to where uvicorn would run: (exit code or 'started', stderr,
    the classifier it built)."""
    import uvicorn

    import lucid.access.server as server

    built: list[LabelOnlyClassifier] = []
    create_app = server.create_app

    class Started(Exception):
        pass

    def config(*a, **kw):
        raise Started

    monkeypatch.setattr(uvicorn, "Config", config)
    monkeypatch.setattr(server, "create_app", lambda clf, **kw: built.append(clf) or create_app(clf, **kw))
    code, _, err = 0, "", ""
    try:
        code, _, err = _cli(capsys, "serve", str(run_dir), "--port", "0", *args)
    except Started:
        code, err = "started", capsys.readouterr().err
    return code, err, (built[0] if built else None)


def test_serve_with_a_target_sets_epsilon_and_the_budget(run_dir, tmp_path, capsys, monkeypatch):
    rel, noi = split_by_branch(run_dir)
    plan = plan_epsilon(2.0, 1e-6, 5)
    code, err, clf = _serve(run_dir, ["--target-epsilon", "2", "--delta", "1e-6", "--queries", "5", "--memo",
                                      str(tmp_path / "m.sqlite"), "--total-budget", "100"], capsys, monkeypatch)
    assert code == "started" and "warning" not in err
    assert f"epsilon={plan.epsilon:g}" in err and f"budget {plan.budget:g} per client" in err
    assert "total budget 100" in err
    assert (clf.epsilon, clf.budget, clf.total_budget) == (plan.epsilon, plan.budget, 100.0)
    # The budget counts Q distinct answers, released or noised: the 6th new input is refused.
    clf.predict(to_orig(np.vstack([rel[:3], noi[:2]])), client="alice")
    for probe in (rel[3:4], noi[3:4]):
        with pytest.raises(BudgetExceeded):
            clf.predict(to_orig(probe), client="alice")
    clf.close()


def test_serve_refuses_bad_or_conflicting_budget_flags(run_dir, tmp_path, capsys, monkeypatch):
    memo = ["--memo", str(tmp_path / "m.sqlite")]
    for args, message in [
        (["--target-epsilon", "2", "--queries", "5", "--epsilon", "1"], "not both"),
        (["--target-epsilon", "2", "--queries", "5", "--budget", "3"], "not both"),
        (["--target-epsilon", "2"], "--queries"),
        (["--epsilon", "1", "--queries", "5"], "--target-epsilon"),
        (["--epsilon", "1", "--delta", "1e-6"], "--target-epsilon"),
        ([], "--epsilon"),
        (["--target-epsilon", "0", "--queries", "5"], "target epsilon"),
        (["--target-epsilon", "inf", "--queries", "5"], "target epsilon"),
        (["--target-epsilon", "2", "--queries", "5", "--delta", "1.5"], "delta"),
        (["--target-epsilon", "2", "--queries", "0"], "queries"),
        (["--target-epsilon", "2", "--queries", "two"], "queries"),
        (["--epsilon", "1", "--total-budget", "-3"], "total privacy budget"),
        (["--epsilon", "1", "--total-budget", "nan"], "total privacy budget"),
    ]:
        code, err, _ = _serve(run_dir, [*args, *memo], capsys, monkeypatch)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)


def test_serve_warns_only_without_both_budgets(run_dir, tmp_path, capsys, monkeypatch):
    from lucid.cli.serve import startup_warnings

    memo = ["--memo", str(tmp_path / "m.sqlite")]
    code, err, clf = _serve(run_dir, ["-e", "1", *memo], capsys, monkeypatch)
    clf.close()
    (line,) = [line for line in err.splitlines() if line.startswith("lucid: warning:")]
    assert code == "started" and "--budget" in line and "--total-budget" in line and "neighbour" in line
    for extra in (["--total-budget", "50"], ["--budget", "5"]):
        code, err, clf = _serve(run_dir, ["-e", "1", *memo, *extra], capsys, monkeypatch)
        clf.close()
        assert code == "started" and "warning" not in err, extra
    assert startup_warnings(None, "127.0.0.1", None, total_budget=5.0) == []
    assert len(startup_warnings(None, "127.0.0.1", None)) == 1
