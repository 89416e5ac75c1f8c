"""Soundness at extreme weight scales, against exact rational arithmetic (tests/helpers/exact_oracle.py).

A 2-4-4-2 ReLU stack whose layers are scaled by 1e-6 ... 1e6 (and mixed), with leave-one-out
networks 1e-7 relative away from N (about one float32 step) or one ulp away on a few parameters,
is verified by every tier; no upper bound may lie below the exact beta*_c, no lower bound above
it, and no input the access layer releases (box corners, a grid, the exact leaks and points one
ulp beside them) may get another label from any network in exact arithmetic. Scales the entry
guard refuses get one line and exit 2. The wider sweep (more seeds, both backends, every option)
is `benchmarks/extreme_scale.py`.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from exact_oracle import exact_bound, exact_label_and_agreement, exact_scores, exact_singleton

FAMILIES = {  # name: (per-layer scales, leave-one-out difference: relative noise or "ulp")
    "1e-6": ((1e-6, 1e-6, 1e-6), 1e-7),
    "1": ((1.0, 1.0, 1.0), 1e-7),
    "1e3": ((1e3, 1e3, 1e3), 1e-7),
    "1e6": ((1e6, 1e6, 1e6), 1e-7),
    "mixed": ((1e6, 1e-6, 1e3), 1e-7),
    "near-cancelling": ((1e4, 1e4, 1e4), "ulp"),
}


def scaled_tensors(scales, difference, seed: int, networks: int = 2) -> dict[str, np.ndarray]:
    """N (position 0) with layer k's weights ~ scales[k] and biases ~ prod(scales[:k+1]), and
    `networks` leave-one-out networks: N plus relative noise, or N moved one float32 step on a
    few parameters ("ulp")."""
    rng = np.random.default_rng(seed)
    sizes = [2, 4, 4, 2]
    tensors = {}
    for k in range(3):
        w_scale, b_scale = scales[k], float(np.prod(scales[:k + 1]))
        w = (rng.standard_normal((sizes[k + 1], sizes[k])) * w_scale).astype(np.float32)
        b = (rng.standard_normal(sizes[k + 1]) * b_scale).astype(np.float32)
        ws, bs = [w], [b]
        for _ in range(networks):
            if difference == "ulp":
                dw = np.where(rng.random(w.shape) < 0.3, np.nextafter(w, np.float32(np.inf)), w)
                db = np.where(rng.random(b.shape) < 0.3, np.nextafter(b, np.float32(-np.inf)), b)
            else:
                dw = (w + difference * w_scale * rng.standard_normal(w.shape)).astype(np.float32)
                db = (b + difference * b_scale * rng.standard_normal(b.shape)).astype(np.float32)
            ws.append(dw.astype(np.float32))
            bs.append(db.astype(np.float32))
        tensors[f"layers.{k}.weight"] = np.stack(ws)
        tensors[f"layers.{k}.bias"] = np.stack(bs)
    tensors["removed"] = np.arange(-1, networks, dtype=np.int64)
    return tensors


def write_scaled_run(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    networks = len(tensors["removed"]) - 1
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "networks.safetensors"))
    X = np.full((networks, 2), 0.5, dtype=np.float32)
    y = np.zeros(networks, dtype=np.int64)
    np.savez(path / "data.npz", X_train=X, y_train=y, X_test=X[:0], y_test=y[:0])
    meta = {
        "format": "lucid-run/1", "num_classes": 2, "input_dim": 2, "train_size": networks, "test_size": 0,
        "domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]}, "architecture": {"type": "mlp", "hidden": [4, 4]},
        "training": {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "epochs": 0, "batch_size": 1, "seed": 0,
                     "test_fraction": 0.0},
        "labels": [0, 1], "scaler": {"type": "affine", "offset": [0.0, 0.0], "scale": [1.0, 1.0]},
        "data": {"source": "tests/verify/test_extreme_scale.py", "feature_names": ["x0", "x1"]},
    }
    (path / "run.json").write_text(json.dumps(meta))
    return path


def _stack(tensors):
    from lucid.network import NetworkStack

    return NetworkStack([tensors[f"layers.{k}.weight"].astype(np.float64) for k in range(3)],
                        [tensors[f"layers.{k}.bias"].astype(np.float64) for k in range(3)], tensors["removed"])


def interesting(name: str) -> tuple[dict[str, np.ndarray], list]:
    """The family's first seed where some class can leak with a positive confidence (the bounds
    that matter to the access layer), and its exact bounds."""
    scales, difference = FAMILIES[name]
    for seed in range(60):
        tensors = scaled_tensors(scales, difference, seed)
        stack = _stack(tensors)
        exact = [exact_bound(stack, c, [0, 0], [1, 1]) for c in range(2)]
        if any(e is not None and e > 0 for e in exact):
            return tensors, exact
    raise AssertionError(f"no seed of family {name} leaks with a positive confidence")


def probes(stack, exact_points) -> np.ndarray:
    """Box corners, a grid, and each exact leak with its float neighbours one ulp away."""
    g = np.linspace(0.0, 1.0, 21)
    grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    near = []
    for p in exact_points:
        x = np.array([float(v) for v in p])
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                q = x.copy()
                if dx:
                    q[0] = np.nextafter(q[0], dx * np.inf)
                if dy:
                    q[1] = np.nextafter(q[1], dy * np.inf)
                near.append(np.clip(q, 0.0, 1.0))
    return np.concatenate([grid, np.array(near).reshape(-1, 2)])


def check_bounds_and_releases(run: Path, tensors, exact) -> None:
    from lucid.access.classifier import LabelOnlyClassifier

    doc = json.loads((run / "bounds.json").read_text())["bounds"]
    for c in range(2):
        entry, e = doc[str(c)], exact[c]
        upper = entry["upper"]
        if upper is not None and e is not None:
            # -1.0 stands for -inf (no input can leak), which only an exact -inf allows
            assert not (upper == -1.0 and e > -1), f"class {c}: 'cannot leak' but exact beta* = {float(e)}"
            assert Fraction(upper) >= e, f"class {c}: upper {upper!r} below exact beta* {float(e)!r}"
        if entry.get("lower") is not None:
            assert e is not None and Fraction(entry["lower"]) <= e, f"class {c}: lower {entry['lower']!r} above exact"
    stack = _stack(tensors)
    leaks = []
    for j in range(1, len(stack)):
        for c in range(2):
            net_n = ([w[0] for w in stack.weights], [b[0] for b in stack.biases])
            net_p = ([w[j] for w in stack.weights], [b[j] for b in stack.biases])
            point = exact_singleton(net_n, net_p, c, [0, 0], [1, 1])[1]
            if point is not None:
                leaks.append(point)
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
    try:
        xs = probes(stack, leaks)
        cls, noised = clf.decide(xs)
        for x, label in zip(xs[~noised], cls[~noised]):
            n_label, agree = exact_label_and_agreement(stack, x)
            assert agree and n_label == label, f"released {label} at {x.tolist()} where a network disagrees exactly"
    finally:
        clf.close()


TIERS = {
    "defaults": {},
    "naive-no-screen": {"naive": True, "screen": "none"},
    "no-search": {"search": False},
    "interval-bounds-no-split": {"bounds": "interval", "split_time": 0},
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("tier", list(TIERS))
def test_no_tier_certifies_below_the_exact_bound_at_any_scale(tmp_path, family, tier):
    from lucid.verify import verify_run

    tensors, exact = interesting(family)
    run = write_scaled_run(tmp_path / "run", tensors)
    verify_run(run, workers=1, progress=False, time_limit=20, **TIERS[tier])
    check_bounds_and_releases(run, tensors, exact)


@pytest.mark.parametrize("solver", ["scip", "gurobi"])
@pytest.mark.parametrize("family", ["1e3", "1e6"])
def test_the_other_backends_are_sound_at_extreme_scales(tmp_path, solver, family):
    """Gurobi (integrality tolerance 1e-5) certified 360.6 against the exact 393.6 at 1e3 per layer
    while only the neurons outside the band were rescaled: every one is now."""
    pytest.importorskip({"scip": "pyscipopt", "gurobi": "gurobipy"}[solver])
    from lucid.verify import verify_run

    tensors, exact = interesting(family)
    run = write_scaled_run(tmp_path / "run", tensors)
    verify_run(run, workers=1, progress=False, time_limit=20, solver=solver)
    check_bounds_and_releases(run, tensors, exact)


def test_rescaling_keeps_every_network_bit_for_bit():
    """The verifier's rescaled networks compute the same float64 scores as the stored ones."""
    from lucid.analysis.problem import VerificationProblem

    tensors, _ = interesting("mixed")
    stack = _stack(tensors)
    problem = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2), bounds="interval")
    assert problem.neuron_scales is not None  # this family is rescaled
    xs = np.random.default_rng(0).uniform(size=(200, 2))
    assert np.array_equal(problem.stack.forward(xs, use_torch=False), stack.forward(xs, use_torch=False))
    for k in range(2):
        widest = max(np.abs(problem.n_bounds.lower[k]).max(), np.abs(problem.n_bounds.upper[k]).max())
        assert widest <= 2.0**12, f"hidden layer {k} still reaches {widest}"  # the band left as it is


def test_ordinary_networks_are_not_rescaled():
    from bruteforce import tiny_stack
    from lucid.analysis.problem import VerificationProblem

    stack = tiny_stack(0)
    problem = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2), bounds="interval")
    assert problem.neuron_scales is None and problem.stack is stack


@pytest.mark.parametrize("scale, message", [
    (1e8, "the scores of layer 2 may reach"),  # scores ~1e24: beyond 2^68
    (1e30, "layer 0 has a parameter of magnitude"),
])
def test_scales_beyond_the_limits_are_refused_in_one_line(tmp_path, capsys, scale, message):
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.cli import main
    from lucid.errors import LucidError
    from synthetic_runs import write_bounds

    tensors = scaled_tensors((scale, scale, scale), 1e-7, 0)
    for k in range(3):  # weights alone carry the scale
        tensors[f"layers.{k}.bias"][:] = 0.0
    run = write_scaled_run(tmp_path / "run", tensors)
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", str(run), "--quiet", "--time-limit", "5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "guarantee.md" in err[0], err
    assert not (run / "bounds.json").exists()
    write_bounds(run, {0: 1.0, 1: 1.0})  # serving the same networks is refused too
    with pytest.raises(LucidError, match=message.split(" may")[0]):
        LabelOnlyClassifier.from_run(run, epsilon=1.0)


@pytest.mark.parametrize("family", ["1e-6", "1e6", "mixed", "near-cancelling"])
def test_the_replay_error_bound_covers_the_float_forward_pass(family):
    """forward_with_error's bound is at least |float64 score - exact score| (rational arithmetic)."""
    scales, difference = FAMILIES[family]
    stack = _stack(scaled_tensors(scales, difference, 3))
    xs = np.concatenate([np.random.default_rng(1).uniform(size=(30, 2)), [[0, 0], [0, 1], [1, 0], [1, 1]]])
    scores, error = stack.forward_with_error(xs)
    assert np.array_equal(scores, stack.forward(xs, use_torch=False))
    for j in range(len(stack)):
        for i, x in enumerate(xs):
            h = exact_scores(stack, j, x)
            for c in range(2):
                assert abs(Fraction(float(scores[j, i, c])) - h[c]) <= Fraction(float(error[j, i, c]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_replayed_leak_leaks_in_exact_arithmetic(family):
    """Replay (and repair) at the exact leaks (vertices where a network ties, so float64 and exact
    arithmetic may disagree on the side) and one ulp around them: whatever it accepts disagrees
    with N exactly, and the confidence it claims is at most N's exact confidence there."""
    from lucid.witness.replay import find_leak

    tensors, _ = interesting(family)
    stack = _stack(tensors)
    net_n = ([w[0] for w in stack.weights], [b[0] for b in stack.biases])
    accepted = 0
    for j in range(1, len(stack)):
        net_p = ([w[j] for w in stack.weights], [b[j] for b in stack.biases])
        for c in range(2):
            point = exact_singleton(net_n, net_p, c, [0, 0], [1, 1])[1]
            if point is None:
                continue
            for x in probes(stack, [point])[441:]:  # the leak and its ulp neighbours, not the grid
                found = find_leak(stack, np.array([j]), x, c, np.zeros(2), np.ones(2))
                if found is None:
                    continue
                accepted += 1
                scores = [exact_scores(stack, k, found.x) for k in (0, j)]
                assert scores[1][1 - c] >= scores[1][c], f"network {j} agrees with N exactly at {found.x.tolist()}"
                assert Fraction(found.confidence) <= scores[0][c] - scores[0][1 - c]
    # at 1e-6 every leak (scores ~1e-18) lies below replay's absolute floor of 1e-9: no witness, no
    # lower bound, nothing unsound
    assert accepted > 0 or family == "1e-6"


def test_a_parameter_box_rescales_with_the_networks_it_holds():
    """`--hyper agt:K` boxes are stored in the original units: rescaled with the problem's factors
    they are exactly the box of the rescaled networks (positive powers of two keep lo <= hi)."""
    from lucid.analysis.scaling import hidden_scales, rescale_hyper, rescale_stack
    from lucid.hyper import hyper_network

    stack = _stack(scaled_tensors((1e6, 1e-6, 1e3), 1e-7, 5, networks=4))
    everyone = np.arange(len(stack))
    box = hyper_network(stack, everyone)
    scales = hidden_scales(box, np.zeros(2), np.ones(2))
    assert scales is not None
    moved, direct = rescale_hyper(box, scales), hyper_network(rescale_stack(stack, scales), everyone)
    for a, b in zip(moved.w_lo + moved.w_hi + moved.b_lo + moved.b_hi, direct.w_lo + direct.w_hi + direct.b_lo + direct.b_hi):
        assert np.array_equal(a, b)


def test_regions_verify_a_stack_whose_rescaled_parameters_pass_the_limit(tmp_path):
    """At 2e6 per layer the stored parameters and the score bound lie inside the limits, but the
    root's rescaled stack carries each hidden neuron's factor into the next layer (up to ~9e19, past
    2^64). Each box is rebuilt from the stored networks: `--regions` verifies the stack that the
    global verification does, and every box's networks compute the stored scores."""
    from lucid.analysis.problem import VerificationProblem
    from lucid.verify import verify_run
    from lucid.regions import RegionTree
    from lucid.regions.one_box import BoxVerifier

    tensors = scaled_tensors((2e6, 2e6, 2e6), 1e-2, 0)  # networks far enough apart to leak: boxes are split
    stack = _stack(tensors)
    root = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2), bounds="interval")
    assert max(float(np.abs(w).max()) for w in root.stack.weights) > 2.0**64  # what the box once re-guarded
    tree = RegionTree(np.zeros(2), np.ones(2), 2)
    tree.split(0, 0, 0.5)
    boxes = BoxVerifier.__new__(BoxVerifier)  # problem() needs the tree and the root only
    boxes.tree, boxes.root = tree, root
    xs = np.random.default_rng(0).uniform(0.0, 0.5, size=(100, 2))
    for child in (1, 2):
        problem = boxes.problem(child)
        inside = xs + (0.5 if child == 2 else 0.0) * np.array([1.0, 0.0])
        assert np.array_equal(problem.stack.forward(inside, use_torch=False), stack.forward(inside, use_torch=False))
    run = write_scaled_run(tmp_path / "run", tensors)
    verify_run(run, regions=3, workers=1, progress=False, time_limit=20)
    doc = json.loads((run / "bounds.json").read_text())
    assert len(doc["regions"]["nodes"]) > 1  # boxes below the root were verified
    exact = [exact_bound(stack, c, [0, 0], [1, 1]) for c in range(2)]
    check_bounds_and_releases(run, tensors, exact)
