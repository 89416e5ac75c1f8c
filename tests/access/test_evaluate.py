"""`lucid evaluate`: accuracies, noised fractions and the exact leaking set of Naive-iDP."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import lucid.access.evaluate as evaluate
from lucid.access.evaluate import evaluate_run, leaking_set, parse_epsilons
from synthetic_runs import write_bounds, write_synthetic_run
from lucid.errors import LucidError
from lucid.network import confidence, load_networks


def run_in_process(argv):
    """`lucid ARGV` through lucid.cli.main in this process (a subprocess costs seconds of imports)."""
    import contextlib
    import io

    from lucid.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code or 0
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture()
def run_dir(tmp_path):
    return write_synthetic_run(tmp_path / "run", train_size=7, test_size=150, bounds={0: 0.3, 1: None, 2: -1.0},
                               perturbation=0.15, seed=1)


def brute_force_leaking(run_dir, x):
    """One input, one network at a time: does any N_-i label x differently from N?"""
    stack = load_networks(run_dir)
    out = []
    for row in x:
        labels = [int(stack.select([k]).forward(row[None])[0, 0].argmax()) for k in range(len(stack))]
        out.append(any(label != labels[0] for label in labels))
    return np.array(out)


def test_leaking_set_is_exact_also_when_chunked(run_dir, monkeypatch):
    x = np.load(run_dir / "data.npz")["X_test"].astype(np.float64)
    expected = brute_force_leaking(run_dir, x)
    assert 0 < expected.sum() < len(x)
    monkeypatch.setattr(evaluate, "_FORWARD_BUDGET_BYTES", 150 * 8 * 8 * 3)  # 3 networks per chunk
    seen = []
    got = leaking_set(load_networks(run_dir), x, lambda done, total: seen.append((done, total)))
    assert np.array_equal(got, expected)
    assert seen[-1] == (8, 8) and len(seen) == 3


def test_results_match_an_independent_computation(run_dir):
    data = np.load(run_dir / "data.npz")
    x, y = data["X_test"].astype(np.float64), data["y_test"]
    scores = load_networks(run_dir).forward(x)[0]
    cls, conf = scores.argmax(1), confidence(scores)
    noised = ~(conf > np.array([0.3, np.inf, -1.0])[cls])
    leaking = brute_force_leaking(run_dir, x)

    result, plot = evaluate_run(run_dir, parse_epsilons("0, 0.50,2000"), seed=3)
    assert set(result) == {"accuracy", "expected_accuracy", "noised_fraction", "access_ms"}
    acc = result["accuracy"]
    assert set(acc) == {"plain", "lucid", "naive_noise", "naive_idp"}
    for name in ("lucid", "naive_noise", "naive_idp"):
        assert list(acc[name]) == ["0", "0.50", "2000"]  # keys as the user wrote them
    assert acc["plain"] == pytest.approx(np.mean(cls == y))
    # eps = 2000: the mechanism returns N's label, so every mechanism is as accurate as N.
    for name in ("lucid", "naive_noise", "naive_idp"):
        assert acc[name]["2000"] == pytest.approx(acc["plain"])
    nf = result["noised_fraction"]
    assert nf["lucid"] == pytest.approx(noised.mean())
    assert nf["naive_idp"] == pytest.approx(leaking.mean())
    assert nf["naive_noise"] == 1.0
    # eps = 0: released inputs keep N's answer, noised ones are uniform over 3 classes.
    released_correct = np.sum((cls == y) & ~noised)
    expected = (released_correct + noised.sum() / 3) / len(y)
    assert acc["lucid"]["0"] == pytest.approx(expected, abs=0.12)
    assert acc["naive_noise"]["0"] == pytest.approx(1 / 3, abs=0.12)
    # The expectation over the draws, exactly: at eps = 0 the same formula; at eps = 0.5 a noised
    # answer is N's label with probability 1 / (1 + 2 exp(-0.25)), each other label with the rest / 2.
    mean = result["expected_accuracy"]
    assert mean["lucid"]["0"] == pytest.approx(expected, abs=1e-12)
    assert mean["naive_noise"]["0"] == pytest.approx(1 / 3, abs=1e-12)
    p = 1 / (1 + 2 * np.exp(-0.25))
    by_hand = np.where(leaking, np.where(cls == y, p, (1 - p) / 2), cls == y).mean()
    assert mean["naive_idp"]["0.50"] == pytest.approx(by_hand, abs=1e-12)
    assert mean["lucid"]["2000"] == pytest.approx(acc["plain"], abs=1e-12)
    assert all(v > 0 for v in result["access_ms"].values())
    # These hand-written bounds are not sound: the evaluation must notice it.
    assert plot["released_but_leaking"] == int(np.sum(~noised & leaking)) > 0
    # Reproducible with a seed.
    again, _ = evaluate_run(run_dir, parse_epsilons("0, 0.50,2000"), seed=3)
    assert again["accuracy"] == acc


@pytest.mark.parametrize("use_torch", [False, True])
def test_both_forward_paths_match_a_plain_loop(run_dir, use_torch):
    stack = load_networks(run_dir)
    x = np.random.default_rng(0).random((40, 2))
    got = stack.forward(x, use_torch=use_torch)
    for k in range(len(stack)):
        h = x
        for i, (w, b) in enumerate(zip(stack.weights, stack.biases)):
            h = h @ w[k].T + b[k]
            h = np.maximum(h, 0.0) if i < len(stack.weights) - 1 else h
        assert np.allclose(got[k], h, rtol=0, atol=1e-12)
    ranked = stack.forward(x, float32=True)
    assert ranked.dtype == np.float64 and np.allclose(ranked, got, rtol=0, atol=1e-4)


@pytest.mark.parametrize("text", ["", "0,,1", "a", "-1", "nan", "1,1", "inf"])
def test_bad_epsilon_lists(text):
    with pytest.raises(LucidError, match="epsilon"):
        parse_epsilons(text)


def test_cli_table_json_plot_and_unsound_warning(run_dir, tmp_path):
    out_json, out_png = tmp_path / "r.json", tmp_path / "fig.png"
    cmd = [sys.executable, "-m", "lucid", "evaluate", str(run_dir), "--epsilon", "0,1",
           "--json", str(out_json), "--plot", str(out_png), "--seed", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| ε | N (no privacy) | LUCID | Naive-Noise | Naive-iDP |" in r.stdout
    assert "UNSOUND" in r.stderr
    doc = json.loads(out_json.read_text())
    assert list(doc["accuracy"]["lucid"]) == ["0", "1"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Bounds that noise everything are trivially sound: no warning.
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    r = run_in_process(cmd[3:7])
    assert r.returncode == 0 and "UNSOUND" not in r.stderr and "Naive-iDP" in r.stdout


def test_cli_bad_input_is_one_line(run_dir, tmp_path):
    def run(*args):
        return run_in_process(["evaluate", *args])

    for args, needle in [
        ([str(run_dir), "--epsilon", "x"], "epsilon"),
        ([str(run_dir), "--plot", str(tmp_path / "fig.txt")], "--plot"),
        ([str(tmp_path / "missing")], "does not exist"),
    ]:
        r = run(*args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    (run_dir / "bounds.json").unlink()
    r = run(str(run_dir))
    assert r.returncode == 2 and "lucid verify" in r.stderr
