"""Networks with NaN or infinite parameters never pass as "cannot leak".

A comparison with NaN is False, so a screen that asks "can N' rank t >= c?" as `x >= 0` would drop a
diverged network as unable to leak. Such runs are refused (train, verify, access, AGT boxes), and
every screen and bound answers a NaN network with a bound no smaller than N alone allows.
"""

from __future__ import annotations

import contextlib
import io
import subprocess

import numpy as np
import pytest
import torch
from bruteforce import tiny_stack
from synthetic_runs import write_bounds, write_synthetic_run

from lucid.access import LabelOnlyClassifier
from lucid.agt.store import AGT_FILE, load_boxes, save_boxes
from lucid.agt.train import AgtBox
from lucid.bounds.pair import PairProblem
from lucid.bounds.relu_split import split_upper_bound
from lucid.bounds.split_options import SplitControl
from lucid.errors import LucidError
from lucid.network import NetworkStack
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen, screen_upper_bounds


def lucid(*args: str) -> subprocess.CompletedProcess:
    """`lucid ARGS` through the CLI's main in this process: the one-line error and its exit status
    are main's (the command line around it runs in test_verify_cli, test_demo, ...; CI time: three
    interpreters importing torch and lucid)."""
    from lucid.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lucid: error:"), done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def poison(run_dir, position: int) -> None:
    """Put a NaN into one weight of the network at `position` of the run's networks file."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(run_dir / "networks.safetensors"))
    tensors["layers.0.weight"][position, 0, 0] = np.nan
    save_file(tensors, str(run_dir / "networks.safetensors"))


def test_a_diverging_training_stops_in_one_line_and_keeps_the_unfinished_run(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((16, 2))
    np.savetxt(tmp_path / "d.csv", np.c_[X, X[:, 0] > X[:, 1]], delimiter=",", header="a,b,y", comments="", fmt="%.6f")
    out = tmp_path / "run"
    args = ["train", str(tmp_path / "d.csv"), "--out", str(out), "--arch", "8", "--epochs", "20", "--lr", "1e6",
            "--batch-size", "4", "--no-progress"]
    line = one_line_error(lucid(*args), "diverged", "--lr", "non-finite")
    total = int(line.split(" of ")[1].split()[0])
    assert total == 13  # N and one network per training row (12 of 16 after the test split)
    assert not out.exists()
    partial = tmp_path / "run.partial"
    assert any(partial.glob("chunk-*.safetensors"))
    again = lucid(*args)  # resumable: the same command finds its chunks and stops the same way
    assert one_line_error(again, "diverged") == line
    assert not out.exists()


@pytest.fixture
def nan_run(tmp_path):
    path = write_synthetic_run(tmp_path / "run", num_classes=2, input_dim=2, hidden=(6,), train_size=5,
                               bounds={0: 0.1, 1: 0.1})
    poison(path, 3)
    return path


def test_verify_evaluate_and_the_access_layer_refuse_a_run_with_a_nan_network(nan_run):
    one_line_error(lucid("verify", str(nan_run), "--time-limit", "30"), "non-finite", "without row 2")
    assert not (nan_run / "cache").exists() or not any((nan_run / "cache").glob("networks-f64-*"))
    one_line_error(lucid("evaluate", str(nan_run), "--epsilon", "1"), "non-finite")
    with pytest.raises(LucidError, match="1 of 6 networks .* non-finite"):
        LabelOnlyClassifier.from_run(nan_run, epsilon=1.0)


def test_the_access_layer_refuses_a_nan_n(tmp_path):
    path = write_synthetic_run(tmp_path / "run", num_classes=2, input_dim=2, train_size=3, bounds={0: 0.1, 1: 0.1})
    poison(path, 0)
    with pytest.raises(LucidError, match=r"N \(trained on every row\)"):
        LabelOnlyClassifier.from_run(path, epsilon=1.0)


def test_agt_boxes_with_nan_bounds_are_refused(tmp_path):
    lower = {"layers.0.weight": torch.zeros(2, 2, dtype=torch.float64)}
    upper = {"layers.0.weight": torch.tensor([[1.0, float("nan")], [1.0, 1.0]], dtype=torch.float64)}
    save_boxes(tmp_path / AGT_FILE, [AgtBox(1, lower, upper)], algorithm="test", max_width=100.0)
    with pytest.raises(LucidError, match="k=1 has non-finite bounds"):
        load_boxes(tmp_path)


def test_every_screen_and_the_tier_bound_a_nan_network_no_lower_than_n_alone_allows():
    """With N finite and one N' NaN, every method must leave that network in play: its bound is at
    least max over the domain of N's confidence in the class (the cap any N' gets), never -inf."""
    stack = tiny_stack(3, hidden=(4, 4), classes=3, k=4, d=2)
    weights = [w.copy() for w in stack.weights]
    weights[1][2, 0, 0] = np.nan  # network at position 2, a hidden layer
    stack = NetworkStack(weights, [b.copy() for b in stack.biases], stack.removed)
    lower, upper = np.zeros(2), np.ones(2)
    problem = VerificationProblem.from_stack(stack, lower, upper)
    positions = np.arange(1, len(stack))
    for cls in range(3):
        cap = float(np.max(np.delete(problem.margin_upper[cls], cls)))
        assert np.isfinite(cap)
        assert screen_upper_bounds(problem, cls, positions)[1] >= cap
        for method in ("symbolic", "optimised"):
            screen = Screen(problem, method)
            assert screen.initial(cls, positions)[1] >= cap
            if screen.refines:
                assert screen.refine(cls, positions[1:2], cutoff=-1.0)[0] >= cap
        ws, bs = [w[2] for w in stack.weights], [b[2] for b in stack.biases]
        nw, nb = [w[0] for w in stack.weights], [b[0] for b in stack.biases]
        pair = PairProblem(nw, nb, [w[None] for w in ws], [b[None] for b in bs], problem.n_bounds.lower,
                           problem.n_bounds.upper, lower, upper)
        tier = split_upper_bound(pair, cls, -1.0, margin_upper=problem.margin_upper, control=SplitControl(0.5))
        assert tier.bound >= cap and not tier.proved


def test_without_the_nan_the_same_network_is_screened_below_the_cap():
    """The check above has power: a finite network in its place gets a bound below the cap."""
    stack = tiny_stack(3, hidden=(4, 4), classes=3, k=4, d=2)
    problem = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2))
    below = [screen_upper_bounds(problem, c, np.array([2]))[0] < np.max(np.delete(problem.margin_upper[c], c))
             for c in range(3)]
    assert any(below)
