"""2-D CNNs (`--arch "conv(...),fc(...)" --input-shape C,H,W`): the spec, T's vectorised training,
the exact dense lowering, and the pipeline (train, verify, evaluate) on a tiny image set."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from lucid.errors import LucidError
from lucid.convolution import conv2d_to_dense
from lucid.network import load_networks
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training import train_run
from lucid.training.architecture import initial_parameters, parse_arch, reference_net
from lucid.training.vectorized import _Cnn2dStep, batch_orders, train_networks

SPEC = "conv(2,3,stride=2,pad=1),fc(4)"  # on 1x4x4 images: 2x2x2 features, then 4, then the classes


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_main(args: list[str], capsys) -> tuple[int, str]:
    from lucid.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


def images(n: int = 24, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """1x4x4 images whose class is the brighter half (top: 1, bottom: 0), flattened C-H-W."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    img = rng.random((n, 1, 4, 4)) * 0.5
    img[y == 1, :, :2, :] += 0.5
    img[y == 0, :, 2:, :] += 0.5
    return img.reshape(n, 16).astype(np.float32), y.astype(np.int64)


@pytest.fixture(scope="module")
def image_data(tmp_path_factory):
    X, y = images()
    path = tmp_path_factory.mktemp("img") / "img.npz"
    np.savez(path, X=X, y=y)
    return path


@pytest.fixture(scope="module")
def tiny_run(image_data, tmp_path_factory):
    return train_run(str(image_data), tmp_path_factory.mktemp("run") / "run", arch=SPEC, input_shape="1,4,4",
                     epochs=10, batch_size=4, lr=0.5, seed=1, test_fraction=0.25, progress=False)


@pytest.fixture(scope="module")
def verified(tiny_run, tmp_path_factory):
    """A copy of tiny_run verified by `lucid verify` (the oracle test's and the round trip's first
    verification: the same networks and command; CI time)."""
    run = tmp_path_factory.mktemp("verified") / "run"
    shutil.copytree(tiny_run, run)
    from lucid.cli import main

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # (as `one_thread`, which a module's fixture comes before)
    try:
        with pytest.raises(SystemExit) as exc:
            main(["verify", str(run), "--time-limit", "60", "--workers", "1", "--quiet"])
            raise SystemExit(0)
    finally:
        torch.set_num_threads(before)
    assert not exc.value.code
    return run


# --- the spec ---------------------------------------------------------------------------------------


def test_spec_is_parsed_and_normalised():
    spec = parse_arch("conv(8,3,stride=1,pad=1), conv(8, 3, stride=2),fc(32)", "1,8,8")
    assert spec == {"type": "cnn2d", "spec": "conv(8,3,stride=1,pad=1),conv(8,3,stride=2,pad=0),fc(32)",
                    "input_shape": [1, 8, 8], "hidden": [32],
                    "conv": [{"channels": 8, "kernel": 3, "stride": 1, "pad": 1},
                             {"channels": 8, "kernel": 3, "stride": 2, "pad": 0}]}
    assert parse_arch("conv(4,2,1,0)", (3, 5, 5))["conv"] == [{"channels": 4, "kernel": 2, "stride": 1, "pad": 0}]
    assert parse_arch("fc(20),fc(20)") == parse_arch("20,20") == parse_arch("2x20")  # fc layers alone: an MLP
    assert parse_arch("cnn") == {"type": "cnn", "conv_channels": [6, 6], "kernel_size": 3, "hidden": [2]}


@pytest.mark.parametrize("arch, shape, message", [
    ("pool(2),fc(3)", "1,8,8", "unknown layer 'pool'"),
    ("conv(0,3)", "1,8,8", "needs out_channels, kernel and stride >= 1"),
    ("conv(4,3,stride=0)", "1,8,8", "needs out_channels, kernel and stride >= 1"),
    ("conv(4,3,pad=-1)", "1,8,8", "pad >= 0"),
    ("conv(4,3),fc(0)", "1,8,8", "fc(0) needs a width >= 1"),
    ("conv(4,9)", "1,8,8", "a 9x9 kernel is larger than the padded 8x8 input"),
    ("conv(4,3,stride=2),conv(4,4)", "1,8,8", "conv layer 1: a 4x4 kernel is larger than the padded 3x3 input"),
    ("fc(3),conv(4,3)", "1,8,8", "every conv(...) layer must come before the fc(...) layers"),
    ("conv(4,3)", None, "give the image shape with --input-shape"),
    ("conv(4,3,stride=2,1)", "1,8,8", "positional argument after a named one"),
    ("conv(4,3,dilation=2)", "1,8,8", "unknown or repeated argument 'dilation'"),
    ("conv(4,3),,fc(2)", "1,8,8", "cannot read --arch"),
    ("conv(4,3)", "1,8", "--input-shape must be three positive sizes"),
    ("2x5", "1,8,8", "--input-shape is for conv(...) layer lists"),
])
def test_bad_specs_are_one_error(arch, shape, message):
    with pytest.raises(LucidError) as exc:
        parse_arch(arch, shape)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("extra, message", [
    (["--arch", "conv(2,3),fc(4)", "--input-shape", "1,4,5"], "--input-shape 1,4,5 has 20 values, but the data has 16"),
    (["--arch", "conv(2,3),fc(4)"], "give the image shape with --input-shape"),
    (["--arch", "conv(2,3),fc(4)", "--input-shape", "1,4,4", "--agt", "1"], "--agt bounds MLPs and the 1-D CNN"),
    (["--arch", "conv(2,5),fc(4)", "--input-shape", "1,4,4"], "a 5x5 kernel is larger than the padded 4x4 input"),
])
def test_cli_refuses_in_one_line_and_writes_nothing(image_data, tmp_path, capsys, extra, message):
    code, err = run_main(["train", str(image_data), "--out", str(tmp_path / "run"), "--no-progress", *extra], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


# --- the lowering -----------------------------------------------------------------------------------


@pytest.mark.parametrize("c_in, c_out, hw, kernel, stride, pad", [
    (1, 2, (5, 5), 3, 1, 0), (1, 3, (6, 7), 3, 2, 1), (2, 3, (7, 5), 2, 3, 0), (3, 2, (4, 4), 3, 1, 2),
    (2, 1, (5, 6), 4, 2, 3), (1, 1, (1, 1), 1, 1, 0), (2, 2, (3, 3), 5, 1, 1),
    (1, 2, (2, 2), 2, 1, 3),  # the corner windows lie wholly in the padding
])
def test_lowered_conv2d_equals_torch_conv2d(c_in, c_out, hw, kernel, stride, pad):
    rng = np.random.default_rng(c_in * 100 + kernel * 10 + stride + pad)
    k = 3
    weight = rng.normal(size=(k, c_out, c_in, kernel, kernel)).astype(np.float32)
    bias = rng.normal(size=(k, c_out)).astype(np.float32)
    dense, dense_bias = conv2d_to_dense(weight, bias, (c_in, *hw), stride, pad)
    x = rng.uniform(-1, 1, size=(20, c_in, *hw))
    for net in range(k):
        w, b = torch.from_numpy(weight[net]).double(), torch.from_numpy(bias[net]).double()
        want = F.conv2d(torch.from_numpy(x), w, b, stride=stride, padding=pad).flatten(1).numpy()
        got = x.reshape(20, -1) @ dense[net].T + dense_bias[net]
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
    # exact: every entry is a float32 weight (converted exactly) or an exact zero, and each kernel
    # entry sits in at most one place per (output position, input channel)
    placed = dense[dense != 0]
    assert dense.dtype == np.float64 and np.isin(placed, weight.astype(np.float64)).all()
    assert np.array_equal(dense_bias, np.repeat(bias.astype(np.float64), dense.shape[1] // c_out, axis=1))


# --- training ---------------------------------------------------------------------------------------


def plain_cnn2d(seed: int, c: int) -> nn.Module:
    """SPEC on 1x4x4 images, built with torch's own modules (independently of lucid's ReferenceNet)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, c))


def plain_loop(X, y, removed_row, c, *, epochs, lr, wd, batch_size, seed) -> list[np.ndarray]:
    """T written out for one network: SGD on the mean cross-entropy of the batch without the row."""
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    net = plain_cnn2d(seed, c)
    opt = torch.optim.SGD(net.parameters(), lr=lr, weight_decay=wd)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(X), generator=g)
        for start in range(0, len(X), batch_size):
            rows = order[start : start + batch_size]
            rows = rows[rows != removed_row]
            opt.zero_grad()
            if len(rows):
                F.cross_entropy(net(X[rows]), y[rows]).backward()
            else:
                for p in net.parameters():
                    p.grad = torch.zeros_like(p)
            opt.step()
    return [p.detach().numpy() for p in net.parameters()]


def test_vectorised_cnn2d_equals_plain_loop():
    X, y = images(n=13, seed=3)
    spec = parse_arch(SPEC, "1,4,4")
    c, seed, epochs, bs, lr, wd = 2, 7, 3, 4, 0.5, 1e-2  # 13 rows / 4: the last batch has 1 row
    orders = batch_orders(len(X), epochs, seed)
    lone = int(orders[0, -1])  # removing it empties a batch
    removed = torch.tensor([-1, 0, 5, 12, lone], dtype=torch.int64)
    inputs = TrainingInputs(initial_parameters(spec, 16, c, seed), spec, torch.from_numpy(X), torch.from_numpy(y), orders)
    got = train_networks(inputs, SgdStep(lr=lr, weight_decay=wd, batch_size=bs, num_classes=c), removed)
    names = list(got)
    assert names == ["conv.0.weight", "conv.0.bias", "layers.0.weight", "layers.0.bias",
                     "layers.1.weight", "layers.1.bias"]
    for k, r in enumerate(removed.tolist()):
        ref = plain_loop(X, y, r, c, epochs=epochs, lr=lr, wd=wd, batch_size=bs, seed=seed)
        for name, want in zip(names, ref):
            np.testing.assert_allclose(got[name][k].numpy(), want, atol=1e-5, rtol=0, err_msg=f"{name} removed={r}")
    assert not torch.equal(got["conv.0.weight"][0], got["conv.0.weight"][1])


def test_run_json_tensors_and_the_lowered_forward(tiny_run):
    meta = json.loads((tiny_run / "run.json").read_text())
    assert meta["architecture"] == parse_arch(SPEC, "1,4,4") and meta["input_dim"] == 16
    tensors = load_file(str(tiny_run / "networks.safetensors"))
    n = meta["train_size"] + 1
    assert tensors["conv.0.weight"].shape == (n, 2, 1, 3, 3) and tensors["conv.0.bias"].shape == (n, 2)
    assert tensors["layers.0.weight"].shape == (n, 4, 8) and tensors["layers.1.weight"].shape == (n, 2, 4)
    stack = load_networks(tiny_run)
    assert stack.layer_sizes == [16, 8, 4, 2] and len(stack) == n
    data = np.load(tiny_run / "data.npz")
    X = np.concatenate([data["X_train"], data["X_test"]])
    lowered = stack.forward(X)  # float64, the verifier's and the access layer's networks
    params = {name: t.double() for name, t in tensors.items() if name != "removed"}
    step = _Cnn2dStep(params, meta["architecture"], 2)  # the trainer's own (vectorised) forward pass
    with torch.no_grad():
        trained = step.scores(torch.from_numpy(X).double()).numpy()
    np.testing.assert_allclose(lowered, trained, atol=1e-12, rtol=0)
    for pos in (0, 3, n - 1):  # and the one-network module that defines the architecture
        net = reference_net(meta["architecture"], 16, 2, seed=0).double()
        net.load_state_dict({k: v[pos] for k, v in params.items()})
        with torch.no_grad():
            np.testing.assert_allclose(lowered[pos], net(torch.from_numpy(X).double()).numpy(), atol=1e-12, rtol=0)
    # N learnt the task, so the bounds below are about a real classifier
    assert (lowered[0, : len(data["y_train"])].argmax(1) == data["y_train"]).mean() > 0.8


@pytest.mark.parametrize("arch, shape", [
    ("conv(2,2,stride=2)", "1,4,4"),  # no fc layer: the convolution feeds the output layer
    ("conv(3,2),conv(2,2,stride=2,pad=1),fc(3),fc(3)", "2,3,4"),  # two input channels, a non-square image
])
def test_other_specs_train_chunked_and_lower_exactly(tmp_path, arch, shape):
    rng = np.random.default_rng(4)
    X = rng.random((11, 16 if shape == "1,4,4" else 24)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(np.int64)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    kw = dict(arch=arch, input_shape=shape, epochs=2, batch_size=3, lr=0.5, test_fraction=0, progress=False)
    one = train_run(str(tmp_path / "d.npz"), tmp_path / "one", chunk_size=12, **kw)
    chunked = train_run(str(tmp_path / "d.npz"), tmp_path / "chunked", chunk_size=5, **kw)
    a, b = load_networks(one), load_networks(chunked)
    for wa, wb in zip(a.weights + a.biases, b.weights + b.biases):
        np.testing.assert_allclose(wa, wb, atol=1e-6, rtol=0)  # chunking does not change T
    spec = parse_arch(arch, shape)
    tensors = load_file(str(one / "networks.safetensors"))
    for pos in (0, 7):
        net = reference_net(spec, X.shape[1], 2, seed=0).double()
        net.load_state_dict({k: v[pos].double() for k, v in tensors.items() if k != "removed"})
        with torch.no_grad():
            want = net(torch.from_numpy(X).double()).numpy()
        np.testing.assert_allclose(a.select([pos]).forward(X)[0], want, atol=1e-12, rtol=0)


# --- the pipeline -----------------------------------------------------------------------------------


def test_verify_matches_the_naive_oracle_and_evaluate_releases_no_leak(tiny_run, verified, tmp_path, capsys):
    from lucid.access.evaluate import evaluate_run
    from lucid.verify import verify_run

    oracle_run = tmp_path / "oracle"
    shutil.copytree(tiny_run, oracle_run)
    naive = verify_run(oracle_run, workers=1, ris=False, naive=True, search=False, progress=False)["bounds"]
    bounds = json.loads((verified / "bounds.json").read_text())["bounds"]
    for c, b in bounds.items():
        ref = naive[c]
        assert b["complete"] and ref["complete"], (c, b, ref)
        # the oracle's exact bound (one MILP per network) is below every sound bound, and its
        # replayed leak below both; exact bounds of the two agree up to the safety margin
        assert b["upper"] >= ref["upper"] - 1e-5, (c, b, ref)
        if ref["lower"] is not None:
            assert ref["lower"] <= b["upper"] + 1e-12
        if b["lower"] is not None:
            assert b["lower"] <= ref["upper"] + 1e-12
        if b["exact"]:
            assert abs(b["upper"] - ref["upper"]) <= 1e-5, (c, b, ref)
    _, plot = evaluate_run(verified, [("0", 0.0), ("1", 1.0)], seed=0)
    assert plot["released_but_leaking"] == 0
    code, err = run_main(["evaluate", str(verified), "--epsilon", "0,1", "--seed", "0",
                          "--json", str(tmp_path / "eval.json")], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["accuracy"]["plain"] > 0.8


def test_export_and_import_round_trip_a_cnn_to_the_same_networks_and_bounds(tiny_run, verified, tmp_path, capsys):
    """`lucid export --all` writes a 2-D CNN run's networks with their convolutions (a Reshape of the
    flat input to the image, Conv layers, a Flatten); importing them gives the run back as it was
    (a cnn2d run: the same tensors, run.json byte for byte, so the same fingerprint), onnxruntime
    computes what LUCID's float64 forward pass of the CNN run computes, and both runs verify to the
    same bounds."""
    import onnxruntime

    from lucid.network import load_networks

    cnn = tmp_path / "cnn"
    shutil.copytree(tiny_run, cnn)
    for name in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (cnn / name).unlink(missing_ok=True)
    code, err = run_main(["export", str(cnn), "--out", str(tmp_path / "onnx"), "--all"], capsys)
    assert code == 0, err
    code, err = run_main(["import", "--manifest", str(tmp_path / "onnx" / "manifest.json"), "--data",
                          str(cnn / "data.npz"), "--out", str(tmp_path / "back")], capsys)
    assert code == 0 and "restored as it was" in err, err
    assert (tmp_path / "back" / "run.json").read_bytes() == (cnn / "run.json").read_bytes()
    from safetensors.numpy import load_file

    stored, again = (load_file(str(r / "networks.safetensors")) for r in (cnn, tmp_path / "back"))
    assert stored.keys() == again.keys() and any(k.startswith("conv.") for k in stored)
    assert all(stored[k].tobytes() == again[k].tobytes() for k in stored)
    model = onnx.load(str(tmp_path / "onnx" / "N.onnx"))
    assert [n.op_type for n in model.graph.node][:2] == ["Reshape", "Conv"]
    original, back = load_networks(cnn), load_networks(tmp_path / "back")
    assert back.layer_sizes == original.layer_sizes and back.removed.tolist() == original.removed.tolist()
    for a, b in zip(original.weights + original.biases, back.weights + back.biases):
        assert np.array_equal(a.astype(np.float32), b) and np.array_equal(a, b.astype(np.float64))
    x = np.random.default_rng(3).uniform(-0.5, 1.5, size=(128, 16)).astype(np.float32)
    reference = original.forward(x.astype(np.float64))
    for position, row in enumerate(original.removed):
        name = "N.onnx" if row == -1 else f"n{row}.onnx"
        session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / name), providers=["CPUExecutionProvider"])
        assert np.abs(session.run(None, {"x": x})[0] - reference[position]).max() <= 1e-5, name
    # the CNN run's bounds: `verified`'s, the same networks verified by the same command
    code, err = run_main(["verify", str(tmp_path / "back"), "--time-limit", "60", "--workers", "1", "--quiet"], capsys)
    assert code == 0, err
    first = json.loads((verified / "bounds.json").read_text())["bounds"]
    second = json.loads((tmp_path / "back" / "bounds.json").read_text())["bounds"]
    for c in first:
        for key in ("lower", "complete", "leaking_row"):
            assert first[c][key] == second[c][key], (c, key, first[c], second[c])
        # A finished class's upper bound is the last proof's, within the solvers' tolerances of the
        # leak: which proof closed the last node depends on timing (a busy machine).
        a, b = first[c]["upper"], second[c]["upper"]
        if a is None or b is None or not first[c]["complete"]:
            assert a == b, (c, first[c], second[c])
        else:
            assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (c, first[c], second[c])
