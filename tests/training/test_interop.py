"""`lucid export` / `lucid import` (lucid/interop, docs/interop.md): ONNX round trips bit for bit,
onnxruntime agrees with LUCID's forward pass, networks trained by a plain PyTorch script verify to
the exact oracle, the VNN-LIB query holds exactly at leaks, and bad input is one line, exit 2 and
nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from bab_fixtures import write_tiny_run
from bruteforce import exact_for
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

from lucid.cli import main
from lucid.network import confidence, load_networks
from lucid.rundir import open_run


def ort_run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.asarray(x, dtype=np.float32)})[0]


def run_cli(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


def verify(run: Path) -> dict:
    main(["verify", str(run), "--time-limit", "30", "--workers", "1", "--split-time", "0", "--quiet"])
    return json.loads((run / "bounds.json").read_text())["bounds"]


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interop")


@pytest.fixture(scope="module")
def tiny_run(work) -> Path:
    return write_tiny_run(work / "run", networks=6, seed=2)


@pytest.fixture(scope="module")
def exported(work, tiny_run) -> Path:
    main(["export", str(tiny_run), "--out", str(work / "exported"), "--all"])
    return work / "exported"


@pytest.fixture(scope="module")
def imported(work, tiny_run, exported) -> Path:
    main(["import", "--manifest", str(exported / "manifest.json"), "--data", str(tiny_run / "data.npz"),
          "--out", str(work / "imported")])
    return work / "imported"


@pytest.fixture(scope="module")
def bounds(tiny_run, imported) -> tuple[dict, dict]:
    return verify(tiny_run), verify(imported)


# ------------------------------------------------------------------------------------- round trip


def test_round_trip_is_bit_identical_and_verifies_to_the_same_bounds(tiny_run, imported, bounds):
    original, back = load_file(str(tiny_run / "networks.safetensors")), load_file(str(imported / "networks.safetensors"))
    assert original.keys() == back.keys()
    for name in original:
        assert original[name].dtype == back[name].dtype and original[name].shape == back[name].shape, name
        assert original[name].tobytes() == back[name].tobytes(), name
    meta = open_run(imported).meta
    assert meta["training"]["algorithm"] == "external" and meta["training"]["version"] == "exported"
    assert meta["domain"] == open_run(tiny_run).meta["domain"] and meta["labels"] == [0, 1]
    first, second = bounds
    assert first.keys() == second.keys()
    for c in first:
        for key in ("upper", "lower", "complete", "exact", "leaking_row"):
            assert first[c][key] == second[c][key], (c, key, first[c], second[c])


def test_onnxruntime_matches_lucids_float64_forward_pass(work, tiny_run, exported, imported):
    x = np.random.default_rng(0).uniform(-0.5, 1.5, size=(512, 2)).astype(np.float32)
    for run, onnx_dir in ((tiny_run, exported), (imported, work / "reexported")):
        if run == imported:  # the imported run's networks, written out again
            main(["export", str(imported), "--out", str(onnx_dir), "--all"])
        stack = load_networks(run)
        reference = stack.forward(x.astype(np.float64))
        for position, row in enumerate(stack.removed):
            name = "N.onnx" if row == -1 else f"n{row}.onnx"
            got = ort_run(onnx_dir / name, x)
            assert got.shape == reference[position].shape
            assert np.abs(got - reference[position]).max() <= 1e-5, (run, name)
    for name in (exported / "N.onnx", work / "reexported" / "n3.onnx"):  # the exported form, as documented
        model = onnx.load(str(name))
        assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm", "Identity"]
        assert model.graph.input[0].name == "x"
        assert all(numpy_helper.to_array(i).dtype == np.float32 for i in model.graph.initializer)


def _matmul_model(net_w: list[np.ndarray], net_b: list[np.ndarray], path: Path) -> None:
    """The other forms the reader accepts: [batch, 1, d] input, Flatten, MatMul + Add, Reshape, a Constant."""
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1)]
    inits, h = [], "f"
    for k, (w, b) in enumerate(zip(net_w, net_b)):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), f"w{k}"))
        nodes.append(helper.make_node("Constant", [], [f"b{k}"], value=numpy_helper.from_array(b, f"bv{k}")))
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"]), helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"])]
        h = f"a{k}"
        if k < len(net_w) - 1:
            nodes.append(helper.make_node("Relu", [h], [f"r{k}"]))
            h = f"r{k}"
    inits.append(numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", [h, "shape"], ["scores"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 2])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 2])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


def test_matmul_add_flatten_and_reshape_graphs_import_exactly(work, tiny_run):
    stack = load_networks(tiny_run)
    files = work / "matmul"
    files.mkdir()
    entries = []
    for position, row in enumerate(stack.removed):
        w = [x[position].astype(np.float32) for x in stack.weights]
        b = [x[position].astype(np.float32) for x in stack.biases]
        _matmul_model(w, b, files / f"m{position}.onnx")
        entries.append({"file": f"m{position}.onnx", "removed": None if row == -1 else int(row)})
    (files / "manifest.json").write_text(json.dumps({"training": {"name": "hand-written"}, "networks": entries}))
    with np.load(tiny_run / "data.npz") as npz:  # the other data form: X, y (every row a training row)
        np.savez(files / "data.npz", X=npz["X_train"], y=npz["y_train"])
    main(["import", "--manifest", str(files / "manifest.json"), "--data", str(files / "data.npz"),
          "--out", str(work / "matmul-run")])
    original, back = load_file(str(tiny_run / "networks.safetensors")), load_file(str(work / "matmul-run" / "networks.safetensors"))
    assert all(np.array_equal(original[k], back[k]) for k in original)
    x = np.random.default_rng(1).uniform(size=(64, 1, 2)).astype(np.float32)
    got = ort_run(files / "m2.onnx", x)
    assert np.abs(got - load_networks(work / "matmul-run").forward(x[:, 0].astype(np.float64))[2]).max() <= 1e-5


# ------------------------------------------------------------------------------------- PyTorch


def _torch_networks(directory: Path, X: np.ndarray, y: np.ndarray) -> list[dict]:
    """N and one network per left-out row, by a plain PyTorch script: same start, full-batch SGD."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2)).state_dict()
    entries = []
    for left_out in [None, *range(len(X))]:
        model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 2))
        model.load_state_dict(start)
        keep = [i for i in range(len(X)) if i != left_out]
        xs, ys = torch.tensor(X[keep]), torch.tensor(y[keep])
        optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(40):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(xs), ys).backward()
            optimiser.step()
        if left_out is None:  # N as .safetensors, the others as .pt: both readers
            save_file(model.state_dict(), str(directory / "N.safetensors"))
            entries.append({"file": "N.safetensors", "removed": None})
        else:
            torch.save(model.state_dict(), directory / f"n{left_out}.pt")
            entries.append({"file": f"n{left_out}.pt", "removed": left_out})
    return entries


def test_pytorch_state_dicts_import_and_verify_to_the_exact_bound(tmp_path):
    X = np.array([[0.1, 0.2], [0.3, 0.8], [0.45, 0.5], [0.6, 0.4], [0.8, 0.9], [0.9, 0.1]], dtype=np.float32)
    y = np.array([0, 1, 1, 0, 1, 0])
    X_test = np.random.default_rng(0).uniform(size=(20, 2)).astype(np.float32)
    np.savez(tmp_path / "data.npz", X_train=X, y_train=y, X_test=X_test, y_test=(X_test[:, 1] > X_test[:, 0]).astype(np.int64))
    entries = _torch_networks(tmp_path, X, y)
    (tmp_path / "manifest.json").write_text(json.dumps({
        "training": {"name": "plain-sgd", "version": "1", "description": "40 full-batch SGD steps, lr 0.5"},
        "networks": entries[::-1], "labels": ["no", "yes"]}))  # any order: the stack is N, then rows 0..n-1
    run = tmp_path / "run"
    main(["import", "--manifest", str(tmp_path / "manifest.json"), "--data", str(tmp_path / "data.npz"), "--out", str(run)])
    stack = load_networks(run)
    assert stack.removed.tolist() == [-1, 0, 1, 2, 3, 4, 5] and stack.layer_sizes == [2, 8, 8, 2]
    result = verify(run)
    lower, upper = open_run(run).domain
    leaks = 0
    for c in (0, 1):
        exact = max(exact_for(stack, p, c, lower, upper) for p in range(1, len(stack)))
        b = result[str(c)]
        assert b["complete"], b
        if exact == -np.inf:
            assert b["lower"] is None and b["upper"] <= 0, b
            continue
        leaks += 1
        assert b["upper"] >= exact - 1e-9 and b["upper"] <= exact + 1e-5, (c, b, exact)
        assert b["lower"] is not None and b["lower"] <= exact + 1e-9, (c, b, exact)
    assert leaks, "the data set should make some leave-one-out network disagree"
    # the access layer and the evaluation work on an imported run
    from lucid.access import ClassifierOptions, LabelOnlyClassifier

    labels = LabelOnlyClassifier.from_run(run, epsilon=1.0, options=ClassifierOptions(seed=0)).predict(X_test)
    assert set(labels.tolist()) <= {"no", "yes"}
    main(["evaluate", str(run), "--epsilon", "0,1", "--seed", "0"])
    main(["report", str(run), "--format", "md", "--out", str(tmp_path / "report.md")])
    assert "trained outside LUCID" in (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------------------------- VNN-LIB


def _sexprs(text: str) -> list:
    tokens = re.findall(r"\(|\)|[^\s()]+", re.sub(r";[^\n]*", "", text))
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    assert len(stack) == 1
    return stack[0]


def vnnlib_holds(text: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[B] bool: whether the property (our own forms only) holds at inputs x [B, d] with outputs y."""
    values = {**{f"X_{j}": x[:, j] for j in range(x.shape[1])}, **{f"Y_{j}": y[:, j] for j in range(y.shape[1])}}

    def term(t):
        return values[t] if t in values else float(t)

    def holds(e):
        op, *args = e
        if op == "and":
            return np.logical_and.reduce([holds(a) for a in args])
        if op == "or":
            return np.logical_or.reduce([holds(a) for a in args])
        if op == "<=":
            return term(args[0]) <= term(args[1])
        if op == ">=":
            return term(args[0]) >= term(args[1])
        raise AssertionError(f"unexpected form {e}")

    ok = np.ones(len(x), dtype=bool)
    for e in _sexprs(text):
        if e[0] == "declare-const":
            assert e[2] == "Real" and (e[1] in values), e
        else:
            assert e[0] == "assert", e
            ok &= holds(e[1])
    return ok


def test_the_vnnlib_query_is_satisfied_at_a_leak_and_nowhere_above_the_bound(work, tiny_run, bounds):
    verified = bounds[0]
    cls = max(verified, key=lambda c: verified[c]["lower"] if verified[c]["lower"] is not None else -np.inf)
    row = verified[cls]["leaking_row"]
    cls = int(cls)
    stack = load_networks(tiny_run)
    position = int(stack.positions_of([row])[0])
    # a leak by dense sampling of the 2-D domain, with room for float32 rounding on both sides
    g = np.stack(np.meshgrid(np.linspace(0, 1, 401), np.linspace(0, 1, 401)), -1).reshape(-1, 2)
    scores = stack.forward(g)
    conf_n, conf_i = confidence(scores[0], cls), confidence(scores[position], cls)
    leak = conf_i <= -1e-4
    assert leak.any()
    best = int(np.flatnonzero(leak)[np.argmax(conf_n[leak])])
    assert conf_n[best] <= verified[str(cls)]["upper"] + 1e-9
    q = work / "query"
    main(["export", str(tiny_run), "--out", str(q), "--class", str(cls), "--network", str(row),
          "--beta", repr(float(conf_n[best]) - 1e-4)])
    onnx_path, vnnlib = q / f"query-c{cls}-n{row}.onnx", q / f"query-c{cls}-n{row}.vnnlib"
    x = g[best][None].astype(np.float32)
    y = ort_run(onnx_path, x)
    assert y.shape == (1, 2)  # C - 1 margins of N, then of N_-row
    margins = np.array([[scores[p][best, cls] - scores[p][best, u] for u in range(2) if u != cls] for p in (0, position)])
    assert np.abs(y[0] - margins.ravel()).max() <= 1e-5
    assert vnnlib_holds(vnnlib.read_text(), x, y).all()

    # beta = the proved upper bound (the default): no sampled input is a counterexample
    main(["export", str(tiny_run), "--out", str(q), "--class", str(cls), "--network", str(row)])
    text = vnnlib.read_text()
    assert f"(assert (>= Y_0 {np.format_float_positional(verified[str(cls)]['upper'], unique=True, trim='0')}))" in text
    samples = np.random.default_rng(0).uniform(size=(10_000, 2)).astype(np.float32)
    assert not vnnlib_holds(text, samples, ort_run(onnx_path, samples)).any()
    # ... while the same samples do hold leaks below it (the evaluator is not vacuous)
    low = text.replace(f"(assert (>= Y_0 {np.format_float_positional(verified[str(cls)]['upper'], unique=True, trim='0')}))",
                       "(assert (>= Y_0 -1000.0))")
    assert vnnlib_holds(low, samples, ort_run(onnx_path, samples)).any()


def test_export_by_position_and_a_three_class_query(tmp_path):
    run = write_tiny_run(tmp_path / "run3", networks=4, classes=3, seed=1)
    main(["export", str(run), "--out", str(tmp_path / "q"), "--class", "1", "--position", "2", "--beta", "0.5"])
    stack = load_networks(run)
    row = int(stack.removed[2])
    text = (tmp_path / "q" / f"query-c1-n{row}.vnnlib").read_text()
    assert "(assert (>= Y_0 0.5))" in text and "(assert (>= Y_1 0.5))" in text
    assert "(assert (or (and (<= Y_2 0.0)) (and (<= Y_3 0.0))))" in text
    x = np.random.default_rng(0).uniform(size=(200, 2)).astype(np.float32)
    y = ort_run(tmp_path / "q" / f"query-c1-n{row}.onnx", x)
    scores = stack.forward(x.astype(np.float64))
    want = np.concatenate([scores[p][:, [1]] - scores[p][:, [0, 2]] for p in (0, 2)], axis=1)
    assert np.abs(y - want).max() <= 1e-5
    n_conf, i_conf = confidence(scores[0], 1), confidence(scores[2], 1)
    clear = (np.abs(n_conf - 0.5) > 1e-4) & (np.abs(i_conf) > 1e-4)  # away from float32 ties
    assert np.array_equal(vnnlib_holds(text, x, y)[clear], ((n_conf >= 0.5) & (i_conf <= 0))[clear])


# ------------------------------------------------------------------------------------- bad input


def _edit(path: Path, change) -> None:
    model = onnx.load(str(path))
    change(model)
    onnx.save_model(model, str(path))


def _sigmoid(model) -> None:
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Sigmoid"


def _nan(model) -> None:
    init = model.graph.initializer[0]
    w = numpy_helper.to_array(init).copy()
    w.flat[0] = np.nan
    init.CopyFrom(numpy_helper.from_array(w, init.name))


def _wider(model) -> None:
    """A first layer that takes 3 inputs instead of 2."""
    init = model.graph.initializer[0]
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(np.concatenate([w, w[:, :1]], axis=1), init.name))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3


CASES = {
    "duplicate row": ("manifest", lambda m: m["networks"][3].update(removed=1), "training row 1 appears twice"),
    "missing row": ("manifest", lambda m: m["networks"].pop(4), "no network for training row 3"),
    "two Ns": ("manifest", lambda m: m["networks"][2].update(removed=None), "N (removed null) appears twice"),
    "row out of range": ("manifest", lambda m: m["networks"].append({"file": "n0.onnx", "removed": 9}), "6 training rows"),
    "unsupported op": ("n2.onnx", _sigmoid, "Sigmoid node"),
    "NaN weight": ("n4.onnx", _nan, "NaN or infinite"),
    "network width": ("n1.onnx", _wider, "differ from N's"),
    "data width": ("data", None, "N takes 2 inputs but the data has 3 features"),
    "pickled module": ("n0.pt", None, "torch.load(weights_only=True)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, tmp_path, exported, tiny_run, capsys):
    import shutil

    files = tmp_path / "files"
    shutil.copytree(exported, files)
    manifest = json.loads((files / "manifest.json").read_text())
    data = tmp_path / "data.npz"
    shutil.copy(tiny_run / "data.npz", data)
    what, change, message = CASES[case]
    if what == "manifest":
        change(manifest)
    elif what == "data":
        with np.load(tiny_run / "data.npz") as npz:
            arrays = dict(npz)
        arrays["X_train"] = np.concatenate([arrays["X_train"], arrays["X_train"][:, :1]], axis=1)
        arrays["X_test"] = np.zeros((0, 3), dtype=np.float32)
        np.savez(data, **arrays)
    elif what.endswith(".pt"):
        import torch

        torch.save(torch.nn.Sequential(torch.nn.Linear(2, 4)), files / what)
        manifest["networks"][1]["file"] = what
    else:
        _edit(files / what, change)
    (files / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    code, err = run_cli(["import", "--manifest", files / "manifest.json", "--data", data, "--out", out], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("lucid: error: ") and message in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz", "files"]  # no staging left either


def test_export_refuses_bad_queries_in_one_line(tmp_path, tiny_run, capsys):
    for args, message in [
        (["--class", "0", "--network", "99"], "no network trained without training row 99"),
        (["--class", "5", "--network", "0"], "--class must be 0..1"),
        (["--class", "0", "--position", "0"], "position 0 is N"),
        (["--class", "0", "--network", "0", "--position", "1"], "not both"),
        (["--network", "0"], "give --class too"),
    ]:
        code, err = run_cli(["export", tiny_run, "--out", tmp_path / "q", *args], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, (args, err)
    assert not (tmp_path / "q").exists()


def test_state_dict_reader_orders_layers_naturally_and_keeps_float32_exact():
    from lucid.errors import LucidError
    from lucid.interop.state_dict import from_state_dict

    rng = np.random.default_rng(0)
    w2, w10 = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
    net = from_state_dict({"10.weight": w10, "2.weight": w2.astype(np.float64), "2.bias": np.ones(3, np.float16)}, "sd")
    assert net.layer_sizes == [2, 3, 2] and net.weights[0].dtype == np.float32
    assert np.array_equal(net.weights[0], w2) and np.array_equal(net.biases[1], np.zeros(2, np.float32))
    for arrays, message in [
        ({"0.weight": w2.astype(np.float64) + 1e-12}, "float32 cannot hold exactly"),
        ({"0.weight": w2, "1.running_mean": np.zeros(3)}, "not a layer's weight or bias"),
        ({"0.weight": w2, "1.weight": w2}, "takes 2 inputs but layer 0 gives 3"),
    ]:
        with pytest.raises(LucidError, match=message):
            from_state_dict(arrays, "sd")


# ------------------------------------------------------------------------------------- 2-D CNNs in ONNX


def _cnn_onnx(conv_w, conv_b, dense_w, dense_b, path: Path, **conv_attrs) -> None:
    """Conv (stride 2, pad 1 unless changed), Relu, Flatten, Gemm, Relu, Gemm on x [n, 1, 5, 5]."""
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "kernel_shape": [3, 3], **conv_attrs}
    inits = [numpy_helper.from_array(conv_w, "cw"), numpy_helper.from_array(conv_b, "cb")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1)]
    h = "f"
    for k, (w, b) in enumerate(zip(dense_w, dense_b)):
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes.append(helper.make_node("Gemm", [h, f"w{k}", f"b{k}"], [f"g{k}"], transB=1))
        h = f"g{k}"
        if k == 0:
            nodes.append(helper.make_node("Relu", [h], ["r1"]))
            h = "r1"
    nodes.append(helper.make_node("Identity", [h], ["scores"]))
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 5, 5])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 2])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))


def test_a_cnn_in_onnx_imports_as_the_dense_layers_torch_computes(tmp_path, capsys):
    """A Conv graph imports as a cnn2d run (its kernels stored) whose lowered networks are the
    dense graph's, whose first layer torch's own conv2d computes (its response to each basis image:
    exact), and onnxruntime's outputs on the images equal LUCID's float64 forward pass on the
    flattened rows."""
    import torch

    from lucid.interop.onnx_write import network_model, save_model
    from lucid.interop.dense import DenseNet

    rows = 3
    X = np.random.default_rng(0).uniform(size=(rows, 25)).astype(np.float32)
    np.savez(tmp_path / "data.npz", X=X, y=np.array([0, 1, 0]))
    for form in ("conv", "dense"):
        (tmp_path / form).mkdir()
    entries = []
    for position, removed in enumerate([None, *range(rows)]):
        torch.manual_seed(position)
        conv = torch.nn.Conv2d(1, 2, 3, stride=2, padding=1)
        dense = [torch.nn.Linear(18, 6), torch.nn.Linear(6, 2)]
        cw, cb = conv.weight.detach().numpy(), conv.bias.detach().numpy()
        ws = [layer.weight.detach().numpy() for layer in dense]
        bs = [layer.bias.detach().numpy() for layer in dense]
        name = f"net{position}.onnx"
        _cnn_onnx(cw, cb, ws, bs, tmp_path / "conv" / name)
        with torch.no_grad():  # torch's conv of every basis image, and of the zero image for the bias
            basis = torch.eye(25).reshape(25, 1, 5, 5)
            lowered = (torch.nn.functional.conv2d(basis, conv.weight, stride=2, padding=1).flatten(1).T.numpy())
            lowered_bias = conv(torch.zeros(1, 1, 5, 5)).flatten().numpy()
        save_model(network_model(DenseNet([lowered, *ws], [lowered_bias, *bs])), tmp_path / "dense" / name)
        entries.append({"file": name, "removed": removed})
    runs = {}
    for form in ("conv", "dense"):
        (tmp_path / form / "manifest.json").write_text(json.dumps({"training": {"name": "torch-init"}, "networks": entries}))
        runs[form] = tmp_path / f"{form}-run"
        main(["import", "--manifest", str(tmp_path / form / "manifest.json"), "--data", str(tmp_path / "data.npz"),
              "--out", str(runs[form])])
    conv_tensors = load_file(str(runs["conv"] / "networks.safetensors"))
    assert conv_tensors["conv.0.weight"].shape == (4, 2, 1, 3, 3)  # the kernels themselves
    assert open_run(runs["conv"]).meta["architecture"] == {
        "type": "cnn2d", "spec": "conv(2,3,stride=2,pad=1),fc(6)", "input_shape": [1, 5, 5],
        "conv": [{"channels": 2, "kernel": 3, "stride": 2, "pad": 1}], "hidden": [6]}
    lowered, dense = load_networks(runs["conv"]), load_networks(runs["dense"])
    for a, b in zip(lowered.weights + lowered.biases, dense.weights + dense.biases):
        assert a.tobytes() == b.tobytes()
    stack = load_networks(runs["conv"])
    assert stack.layer_sizes == [25, 18, 6, 2]
    images = np.random.default_rng(1).uniform(-0.5, 1.5, size=(256, 1, 5, 5)).astype(np.float32)
    reference = stack.forward(images.reshape(256, 25).astype(np.float64))
    import onnxruntime

    for position in range(len(entries)):
        session = onnxruntime.InferenceSession(str(tmp_path / "conv" / f"net{position}.onnx"),
                                               providers=["CPUExecutionProvider"])
        got = session.run(None, {"x": images})[0]
        assert np.abs(got - reference[position]).max() <= 1e-5, position
    # what the lowering cannot express is refused in one line naming it, and nothing is written
    capsys.readouterr()
    for attrs, word in (({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, "dilations"), ({"pads": [1, 0, 1, 0]}, "pads"),
                        ({"strides": [2, 1]}, "strides"), ({"strides": [0, 0]}, "stride >= 1")):
        _cnn_onnx(cw, cb, ws, bs, tmp_path / "conv" / "net2.onnx", **attrs)
        out = tmp_path / f"refused-{word.split()[0]}"
        code, err = run_cli(["import", "--manifest", tmp_path / "conv" / "manifest.json", "--data",
                             tmp_path / "data.npz", "--out", out], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Conv node" in err and word in err, err
        assert not out.exists()
    # a stack whose networks are not all N's architecture, layer kinds included, is refused even
    # where the dense widths agree: an MLP beside a CNN N, and a CNN on another image shape
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "conv", mixed)
    _cnn_onnx(cw, cb, ws, bs, mixed / "net0.onnx")  # N: the CNN with the files' own attributes
    shutil.copy(tmp_path / "dense" / "net2.onnx", mixed / "net2.onnx")
    code, err = run_cli(["import", "--manifest", mixed / "manifest.json", "--data", tmp_path / "data.npz",
                         "--out", tmp_path / "mixed-run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "layer 0 is dense but N's is conv 3x3 stride 2 pad 1" in err and "layer kinds" in err, err
    assert not (tmp_path / "mixed-run").exists()


def test_a_zero_or_extreme_scaler_and_extreme_weights_are_refused_in_one_line(tmp_path, exported, tiny_run, capsys):
    import shutil

    from safetensors.numpy import load_file as load_arrays, save_file as save_arrays

    for scale, word in (([0.0, 1.0], "scale of 0 maps every input to one point"), ([1.0, 1e30], "feature 1")):
        files = tmp_path / f"scaler-{word.split()[0]}"
        shutil.copytree(exported, files)
        manifest = json.loads((files / "manifest.json").read_text())
        manifest["scaler"] = {"type": "affine", "offset": [0.0, 0.0], "scale": scale}
        (files / "manifest.json").write_text(json.dumps(manifest))
        out = tmp_path / f"out-{word.split()[0]}"
        code, err = run_cli(["import", "--manifest", files / "manifest.json", "--data", tiny_run / "data.npz",
                             "--out", out], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and word in err and "np.float64" not in err, err
        assert not out.exists()
    # networks whose scores can pass 2^68 over the domain: one line naming the layer and the limit
    files = tmp_path / "huge"
    files.mkdir()
    tensors = load_arrays(str(tiny_run / "networks.safetensors"))
    entries = []
    for position, removed in enumerate(tensors["removed"]):
        state = {}
        for k in range(3):
            state[f"{2 * k}.weight"] = tensors[f"layers.{k}.weight"][position] * np.float32(1e8)
            state[f"{2 * k}.bias"] = np.zeros_like(tensors[f"layers.{k}.bias"][position])
        save_arrays(state, str(files / f"net{position}.safetensors"))
        entries.append({"file": f"net{position}.safetensors", "removed": None if removed < 0 else int(removed)})
    (files / "manifest.json").write_text(json.dumps({"training": {"name": "scaled"}, "networks": entries}))
    code, err = run_cli(["import", "--manifest", files / "manifest.json", "--data", tiny_run / "data.npz",
                         "--out", tmp_path / "huge-run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the scores of layer 2 may reach" in err and "2^68" in err, err
    assert not (tmp_path / "huge-run").exists()


def _flatten_cnn(idiom: str):
    """A CNN flattened by hand, as PyTorch scripts usually do: x.view(x.size(0), -1) or
    x.reshape(x.shape[0], -1)."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3, stride=2, padding=1)
            self.fc1, self.fc2 = torch.nn.Linear(18, 6), torch.nn.Linear(6, 2)

        def forward(self, x):
            h = torch.relu(self.conv(x))
            h = h.view(h.size(0), -1) if idiom == "view" else h.reshape(h.shape[0], -1)
            return self.fc2(torch.relu(self.fc1(h)))

    return Net()


@pytest.mark.parametrize("dynamo", [True, False], ids=["default-exporter", "legacy-exporter"])
@pytest.mark.parametrize("batch", ["fixed", "dynamic"])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "cnn-view", "cnn-reshape"])
def test_what_torch_onnx_export_writes_imports_as_the_same_network(tmp_path, kind, batch, dynamo):
    """The files torch.onnx.export really writes (the default dynamo exporter writes nn.Flatten as
    Reshape(allowzero=1) to [1, w] or [-1, w]; the flatten idioms x.view(x.size(0), -1) and
    x.reshape(x.shape[0], -1) become [1, -1], or a shape built from Shape by the legacy exporter)
    import, and LUCID's forward pass matches torch's."""
    import torch

    if dynamo:
        pytest.importorskip("onnxscript")
    from lucid.interop.onnx_read import read_onnx

    torch.manual_seed(0)
    if kind in ("cnn-view", "cnn-reshape"):
        model, x = _flatten_cnn(kind.split("-")[1]), torch.rand(1, 1, 5, 5)
    elif kind == "cnn":
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(18, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
        x = torch.rand(1, 1, 5, 5)
    else:
        model, x = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)), torch.rand(1, 4)
    path = tmp_path / "net.onnx"
    options: dict = {"dynamo": dynamo}
    if batch == "dynamic":
        options.update({"dynamic_shapes": ({0: torch.export.Dim("batch")},)} if dynamo else
                       {"input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}})
    import contextlib
    import io
    import warnings

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), **options)
    net = read_onnx(path)
    rows = torch.rand(64, *x.shape[1:])
    with torch.no_grad():
        expected = model(rows).double().numpy()
    h = rows.reshape(64, -1).double().numpy()
    for k, (w, b) in enumerate(zip(net.weights, net.biases)):
        h = h @ w.astype(np.float64).T + b
        if k < len(net.weights) - 1:
            h = np.maximum(h, 0.0)
    assert np.abs(h - expected).max() <= 1e-5
    if dynamo and batch == "dynamic":  # and the docs' import and verify run on it
        X = rows[:2].reshape(2, -1).numpy()
        np.savez(tmp_path / "data.npz", X=X, y=np.array([0, 1]))
        entries = [{"file": "net.onnx", "removed": r} for r in (None, 0, 1)]
        (tmp_path / "manifest.json").write_text(json.dumps({"training": {"name": "torch"}, "networks": entries}))
        main(["import", "--manifest", str(tmp_path / "manifest.json"), "--data", str(tmp_path / "data.npz"),
              "--out", str(tmp_path / "run")])
        assert all(b["complete"] for b in verify(tmp_path / "run").values())


def test_a_reshape_whose_zero_is_literal_is_refused_naming_allowzero(tmp_path, capsys):
    """Reshape(allowzero=1) to [0, w] would make a batch of zero rows: not the [batch, features] layout."""
    from lucid.interop.onnx_read import read_onnx
    from lucid.errors import LucidError

    w = np.ones((2, 3), dtype=np.float32)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=1),
             helper.make_node("Gemm", ["r", "w"], ["scores"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 2])],
                              initializer=[numpy_helper.from_array(np.array([0, 3], dtype=np.int64), "shape"),
                                           numpy_helper.from_array(w, "w")])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(tmp_path / "z.onnx"))
    with pytest.raises(LucidError, match="allowzero=1 makes its 0 a literal zero"):
        read_onnx(tmp_path / "z.onnx")


def _export(model, x, path: Path, dynamo: bool) -> Path:
    import contextlib
    import io
    import warnings

    import torch

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), str(path), dynamo=dynamo)
    return path


def _malformed(kind: str, tmp_path: Path) -> Path:
    """The probe's malformed models, as a user's PyTorch script writes them."""
    import torch

    nn = torch.nn
    if kind == "grouped conv":
        return _export(nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.ReLU(), nn.Flatten(), nn.Linear(36, 2)),
                       torch.rand(1, 2, 5, 5), tmp_path / "g.onnx", dynamo=True)
    if kind == "batch norm (legacy exporter)":
        return _export(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)),
                       torch.rand(2, 4), tmp_path / "bn.onnx", dynamo=False)
    if kind in ("reflect padding", "reflect padding (legacy exporter)"):
        model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"), nn.ReLU(), nn.Flatten(),
                              nn.Linear(50, 2))
        return _export(model, torch.rand(1, 1, 5, 5), tmp_path / "pad.onnx", dynamo="legacy" not in kind)
    if kind == "empty file":
        (tmp_path / "empty.onnx").write_bytes(b"")
        return tmp_path / "empty.onnx"
    if kind == "TorchScript":
        torch.jit.save(torch.jit.script(nn.Sequential(nn.Linear(2, 2))), str(tmp_path / "script.pt"))
        return tmp_path / "script.pt"
    raise AssertionError(kind)


MALFORMED = {  # the probe's list: each refused in one line naming the real op or attribute
    "grouped conv": "has group=2",
    "batch norm (legacy exporter)": "BatchNormalization node",
    "reflect padding": "Pad node",
    "reflect padding (legacy exporter)": "(mode reflect)",
    "empty file": "holds no ONNX graph",
    "TorchScript": "is a TorchScript archive",
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_models_as_users_export_them_are_refused_in_one_line(kind, tmp_path, capsys):
    if kind in ("grouped conv", "reflect padding"):
        pytest.importorskip("onnxscript")
    path = _malformed(kind, tmp_path)
    X = np.random.default_rng(0).uniform(size=(2, 2)).astype(np.float32)
    np.savez(tmp_path / "data.npz", X=X, y=np.array([0, 1]))
    manifest = {"training": {"name": "t"}, "networks": [{"file": path.name, "removed": None},
                                                        {"file": path.name, "removed": 0},
                                                        {"file": path.name, "removed": 1}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    code, err = run_cli(["import", "--manifest", tmp_path / "manifest.json", "--data", tmp_path / "data.npz",
                         "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and MALFORMED[kind] in err, err
    assert "weights_only=False" not in err and not (tmp_path / "run").exists()


def _save_sklearn_mlp(estimator, path: Path) -> None:
    """docs/interop.md's conversion: a scikit-learn MLP as a state dict (float32, as LUCID stores it)."""
    from safetensors.numpy import save_file

    state = {}
    for k, (w, b) in enumerate(zip(estimator.coefs_, estimator.intercepts_)):
        state[f"{k}.weight"] = np.ascontiguousarray(w.T, dtype=np.float32)
        state[f"{k}.bias"] = b.astype(np.float32)
    save_file(state, str(path))


@pytest.mark.parametrize("classes", [2, 3])
def test_scikit_learn_mlps_import_with_a_single_logit_binary_head(tmp_path, classes):
    """MLPClassifier (ReLU) and its leave-one-out refits import; a binary one's single logit z becomes
    the scores (0, z): LUCID's labels are scikit-learn's predictions, and verification runs."""
    from sklearn.datasets import make_classification
    from sklearn.neural_network import MLPClassifier

    from lucid.network import load_networks

    X, y = make_classification(n_samples=14, n_features=3, n_informative=3, n_redundant=0, n_classes=classes,
                               n_clusters_per_class=1, random_state=1)
    X = ((X - X.min(0)) / (X.max(0) - X.min(0))).astype(np.float32)
    entries, estimators = [], []
    for removed in [None, *range(len(y))]:
        keep = np.ones(len(y), bool) if removed is None else np.arange(len(y)) != removed
        est = MLPClassifier(hidden_layer_sizes=(5,), solver="lbfgs", random_state=0, max_iter=200)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X[keep], y[keep])
        name = f"net{'N' if removed is None else removed}.safetensors"
        _save_sklearn_mlp(est, tmp_path / name)
        entries.append({"file": name, "removed": removed})
        estimators.append(est)
    (tmp_path / "manifest.json").write_text(json.dumps({"training": {"name": "sklearn-lbfgs"}, "networks": entries}))
    np.savez(tmp_path / "data.npz", X=X, y=y)
    main(["import", "--manifest", str(tmp_path / "manifest.json"), "--data", str(tmp_path / "data.npz"),
          "--out", str(tmp_path / "run")])
    stack = load_networks(tmp_path / "run")
    assert stack.num_classes == classes
    probe = np.random.default_rng(2).uniform(size=(300, 3))
    labels = stack.forward(probe)[0].argmax(-1)
    # the float32 network scikit-learn's own float64 one was rounded to: they agree off a thin band
    agree = labels == estimators[0].predict(probe)
    assert agree.mean() >= 0.99
    verify(tmp_path / "run")


def test_export_then_import_restores_a_run_with_its_fingerprint(tmp_path, capsys):
    """lucid export --all then lucid import gives back the run itself (run.json byte for byte, so the
    same fingerprint), for a run of lucid train and for an imported one; networks changed after the
    export are imported as trained elsewhere, and say so."""
    import shutil

    trained = tmp_path / "trained"
    main(["train", "sklearn:iris", "--arch", "1x4", "--epochs", "2", "--out", str(trained)])
    for name, run in (("trained", trained), ("imported-once", None)):
        if run is None:  # the run just re-imported, itself an import now (algorithm external)
            run = tmp_path / "back-trained"
            files = tmp_path / "files-trained"
            manifest = json.loads((files / "manifest.json").read_text())
            del manifest["origin"]
            manifest["training"] = {"name": "owner-sgd", "version": "3", "description": "seed 1"}
            (files / "manifest.json").write_text(json.dumps(manifest))
            shutil.rmtree(run)
            main(["import", "--manifest", str(files / "manifest.json"), "--data", str(trained / "data.npz"),
                  "--out", str(run)])
        files = tmp_path / f"files-{name}"
        main(["export", str(run), "--out", str(files), "--all"])
        back = tmp_path / f"back-{name}"
        capsys.readouterr()
        main(["import", "--manifest", str(files / "manifest.json"), "--data", str(run / "data.npz"), "--out", str(back)])
        assert "restored as it was" in capsys.readouterr().err
        assert (back / "run.json").read_bytes() == (run / "run.json").read_bytes(), name
        assert open_run(back).meta["training"]["fingerprint"] == open_run(run).meta["training"]["fingerprint"]
    # a network changed after the export: imported as trained elsewhere, with a note
    files = tmp_path / "files-tampered"
    main(["export", str(trained), "--out", str(files), "--all"])
    _edit(files / "n0.onnx", lambda m: m.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(m.graph.initializer[0]) * np.float32(2), m.graph.initializer[0].name)))
    code, err = run_cli(["import", "--manifest", files / "manifest.json", "--data", trained / "data.npz",
                         "--out", tmp_path / "changed"], capsys)
    assert code == 0 and "provenance not kept" in err, err
    assert open_run(tmp_path / "changed").meta["training"]["algorithm"] == "external"


# ------------------------------------------------------------------------------------- paths and sizes


def _import_case(tmp_path: Path, exported: Path, tiny_run: Path, capsys, change, *flags) -> tuple[int, str, Path]:
    """Import `exported`'s networks after `change(files, manifest)`; (exit status, stderr, RUN)."""
    import shutil

    files = tmp_path / "files"
    shutil.copytree(exported, files)
    manifest = json.loads((files / "manifest.json").read_text())
    change(files, manifest)
    (files / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    code, err = run_cli(["import", "--manifest", files / "manifest.json", "--data", tiny_run / "data.npz",
                         "--out", out, *flags], capsys)
    return code, err, out


def _outside(tmp_path: Path) -> Path:
    """A valid network file outside the manifest's directory."""
    import shutil

    shutil.copytree(tmp_path / "files", tmp_path / "elsewhere")
    return tmp_path / "elsewhere" / "n1.onnx"


def _link(files: Path, target: Path) -> str:
    (files / "link.onnx").symlink_to(target)
    return "link.onnx"


PATH_CASES = {  # (change to the exported files, words of the one-line refusal)
    "absolute path": (lambda files, tmp: str((files / "n1.onnx").resolve()), "is an absolute path"),
    "parent directory": (lambda files, tmp: "../elsewhere/n1.onnx", "outside the manifest's directory"),
    "link outside": (lambda files, tmp: _link(files, _outside(tmp)), "a symbolic link must point inside it"),
    "link to a system file": (lambda files, tmp: _link(files, Path("/etc/passwd")), "outside the manifest's directory"),
    "a directory": (lambda files, tmp: (files / "sub.onnx").mkdir() or "sub.onnx", "is a directory; give the file"),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_paths_outside_the_manifests_directory_are_refused_before_reading(case, tmp_path, exported, tiny_run, capsys):
    change, words = PATH_CASES[case]

    def edit(files, manifest):
        manifest["networks"][2]["file"] = change(files, tmp_path)

    code, err, out = _import_case(tmp_path, exported, tiny_run, capsys, edit)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and not out.exists(), err
    # a link that stays inside the directory is read as the file it points to
    code, err, out = _import_case(tmp_path / "inside", exported, tiny_run, capsys,
                                  lambda files, m: m["networks"][2].update(file=_link(files, files / m["networks"][2]["file"])))
    assert code == 0 and out.exists(), err


def test_a_file_over_the_size_cap_is_refused_from_its_size_and_the_flag_raises_it(tmp_path, exported, tiny_run, capsys):
    def huge(files, manifest):  # sparse: 2.5 GB on paper, no disk space, never read
        with open(files / "huge.onnx", "wb") as fh:
            fh.truncate(2_500_000_000)
        manifest["networks"][1]["file"] = "huge.onnx"

    code, err, out = _import_case(tmp_path / "a", exported, tiny_run, capsys, huge)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "huge.onnx has 2.5GB, more than the 1GB" in err and "--max-file-size 2.5G" in err, err
    assert not out.exists()
    size = (exported / "n0.onnx").stat().st_size
    code, err, out = _import_case(tmp_path / "b", exported, tiny_run, capsys, lambda f, m: None,
                                  "--max-file-size", str(size - 1))
    assert code == 2 and "more than the" in err and "--max-file-size" in err and not out.exists(), err
    code, err, out = _import_case(tmp_path / "c", exported, tiny_run, capsys, lambda f, m: None,
                                  "--max-file-size", "1M")
    assert code == 0 and out.exists(), err
    code, err, out = _import_case(tmp_path / "d", exported, tiny_run, capsys, lambda f, m: None,
                                  "--max-file-size", "lots")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not a size" in err, err


# ------------------------------------------------------------------------------------- bfloat16


@pytest.mark.parametrize("form", ["safetensors", "pt", "onnx-default-exporter", "onnx-legacy-exporter"])
def test_bfloat16_parameters_are_widened_exactly(form, tmp_path):
    """A bfloat16 model imports as the float32 network holding the same values (bfloat16 is float32
    with the low 16 mantissa bits zero), and computes what torch computes with them."""
    import torch

    from lucid.interop.importer import read_network

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(torch.bfloat16)
    if form == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "net.safetensors"
        save_file(model.state_dict(), str(path))
    elif form == "pt":
        path = tmp_path / "net.pt"
        torch.save(model.state_dict(), path)
    else:
        if "default" in form:
            pytest.importorskip("onnxscript")
        path = _export(model, torch.rand(1, 4, dtype=torch.bfloat16), tmp_path / "net.onnx", dynamo="default" in form)
        inits = {i.name: i.data_type for i in onnx.load(str(path)).graph.initializer}
        assert TensorProto.BFLOAT16 in inits.values(), inits  # the file does hold bfloat16
    net = read_network(path)
    params = [p.detach().float().numpy() for p in model.parameters()]
    assert [w.dtype for w in net.weights] == [np.float32, np.float32]
    for got, want in zip([net.weights[0], net.biases[0], net.weights[1], net.biases[1]], params):
        assert got.tobytes() == want.tobytes()
    rows = torch.rand(64, 4)
    with torch.no_grad():
        expected = model.float()(rows).double().numpy()
    h = rows.double().numpy()
    h = np.maximum(h @ net.weights[0].T.astype(np.float64) + net.biases[0], 0.0) @ net.weights[1].T + net.biases[1]
    assert np.abs(h - expected).max() <= 1e-5


@pytest.mark.parametrize("index, batch, accepted", [(0, "n", True), (1, "n", False), (0, 3, True)])
def test_a_reshape_from_the_running_shape_keeps_the_batch_only_from_its_batch_entry(tmp_path, index, batch, accepted):
    """Shape -> Gather(index) -> Unsqueeze -> Concat [-1] -> Reshape: the batch entry keeps the
    [batch, features] layout (a fixed batch too); another entry (here the 3 features: [3, -1] on
    a dynamic batch) is refused."""
    from lucid.errors import LucidError
    from lucid.interop.onnx_read import read_onnx

    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i"], ["g"], axis=0),
             helper.make_node("Unsqueeze", ["g", "axes"], ["u"]),
             helper.make_node("Concat", ["u", "minus"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Gemm", ["r", "w"], ["scores"], transB=1)]
    inits = [numpy_helper.from_array(np.array(index, dtype=np.int64), "i"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus"), numpy_helper.from_array(w, "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 2])], initializer=inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "s.onnx"))
    if accepted:
        assert np.array_equal(read_onnx(tmp_path / "s.onnx").weights[0], w)
        x = np.random.default_rng(0).uniform(size=(3, 3)).astype(np.float32)
        assert np.abs(ort_run(tmp_path / "s.onnx", x) - x @ w.T).max() <= 1e-5
    else:
        with pytest.raises(LucidError, match=r"reshapes to \[3, -1\], which does not keep"):
            read_onnx(tmp_path / "s.onnx")


# ------------------------------------------------------------------------------------- one stacked file


def _vmap_trained(X: np.ndarray, y: np.ndarray, steps: int = 30):
    """N and every leave-one-out network trained at once with torch.func.vmap (the left-out row
    masked out of each network's mean loss): the stacked parameters and the template module."""
    import torch
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    template = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    n = len(y)
    params, _ = stack_module_state([template] * (n + 1))  # one start for every network
    removed = torch.tensor([-1, *range(n)])
    keep = torch.ones(n + 1, n)
    keep[torch.arange(1, n + 1), torch.arange(n)] = 0.0
    xs, ys = torch.as_tensor(X), torch.as_tensor(y)

    def loss(p, mask):
        per_row = torch.nn.functional.cross_entropy(functional_call(template, p, (xs,)), ys, reduction="none")
        return (per_row * mask).sum() / mask.sum()

    optimiser = torch.optim.SGD(list(params.values()), lr=0.5)
    for _ in range(steps):
        optimiser.zero_grad()
        vmap(loss)(params, keep).sum().backward()
        optimiser.step()
    return {k: v.detach() for k, v in params.items()}, removed, template


def test_a_stacked_file_of_vmap_trained_networks_imports_as_the_same_networks_as_one_file_each(tmp_path):
    """The fast route: every network in one .safetensors file (stack_module_state's names with a
    leading network axis, and `removed`). It imports to exactly the networks of one file each (the
    same networks.safetensors and fingerprint), in the file's own order or any other, and each
    computes what torch's functional_call computes."""
    import torch
    from safetensors.torch import save_file
    from torch.func import functional_call

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(7, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2, 0])
    np.savez(tmp_path / "data.npz", X=X, y=y)
    params, removed, template = _vmap_trained(X, y)
    shuffled = torch.randperm(len(removed), generator=torch.Generator().manual_seed(1))  # any order
    (tmp_path / "stacked").mkdir()
    save_file({**{k: v[shuffled].contiguous() for k, v in params.items()}, "removed": removed[shuffled]},
              str(tmp_path / "stacked" / "all.safetensors"))
    (tmp_path / "stacked" / "manifest.json").write_text(json.dumps({
        "training": {"name": "vmap-sgd"}, "networks": [{"file": "all.safetensors", "stacked": True}]}))
    (tmp_path / "single").mkdir()
    entries = []
    for p, row in enumerate(removed.tolist()):
        save_file({k: v[p].contiguous() for k, v in params.items()}, str(tmp_path / "single" / f"n{p}.safetensors"))
        entries.append({"file": f"n{p}.safetensors", "removed": None if row == -1 else row})
    (tmp_path / "single" / "manifest.json").write_text(json.dumps({"training": {"name": "vmap-sgd"}, "networks": entries}))
    for form in ("stacked", "single"):
        main(["import", "--manifest", str(tmp_path / form / "manifest.json"), "--data", str(tmp_path / "data.npz"),
              "--out", str(tmp_path / f"run-{form}")])
    stacked, single = (load_file(str(tmp_path / f"run-{f}" / "networks.safetensors")) for f in ("stacked", "single"))
    assert stacked.keys() == single.keys() and all(stacked[k].tobytes() == single[k].tobytes() for k in stacked)
    assert open_run(tmp_path / "run-stacked").meta == open_run(tmp_path / "run-single").meta  # one fingerprint
    stack = load_networks(tmp_path / "run-stacked")
    assert stack.removed.tolist() == [-1, *range(7)]
    rows = torch.rand(64, 4)
    mine = stack.forward(rows.double().numpy())
    for p, row in enumerate(removed.tolist()):
        with torch.no_grad():
            theirs = functional_call(template, {k: v[p] for k, v in params.items()}, (rows,)).double().numpy()
        assert np.abs(mine[stack.positions_of([row])[0] if row >= 0 else 0] - theirs).max() <= 1e-5


STACKED_CASES = {  # change to the stacked file's tensors or the manifest entry, words of the refusal
    "no removed": (lambda t, e: t.pop("removed"), "needs a 'removed' tensor"),
    "short removed": (lambda t, e: t.update(removed=t["removed"][:-1]), "lists 7 networks"),
    "row twice": (lambda t, e: t["removed"].__setitem__(3, 1), "training row 1 appears twice (all.safetensors (network 2) "
                                                               "and all.safetensors (network 3))"),
    "removed given too": (lambda t, e: e.update(removed=0), "drop its 'removed' field"),
    "not safetensors": (lambda t, e: e.update(file="all.pt"), "is not a .safetensors file"),
    "listed as one network": (lambda t, e: e.update(stacked=False), "list it in the manifest as"),
    "NaN": (lambda t, e: t["2.weight"].__setitem__((3, 0, 0), float("nan")), "all.safetensors (network 3) (the network"),
}


@pytest.mark.parametrize("case", list(STACKED_CASES))
def test_a_malformed_stacked_file_is_refused_in_one_line(case, tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(7, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", X=X, y=np.array([0, 1, 2, 0, 1, 2, 0]))
    torch.manual_seed(0)
    tensors = {"0.weight": torch.randn(8, 8, 4), "0.bias": torch.randn(8, 8), "2.weight": torch.randn(8, 3, 8),
               "2.bias": torch.randn(8, 3), "removed": torch.arange(-1, 7)}
    entry: dict = {"file": "all.safetensors", "stacked": True}
    change, words = STACKED_CASES[case]
    change(tensors, entry)
    save_file(tensors, str(tmp_path / "all.safetensors"))
    entries = [entry] if entry["stacked"] else [{"file": entry["file"], "removed": r} for r in (None, *range(7))]
    (tmp_path / "manifest.json").write_text(json.dumps({"training": {"name": "t"}, "networks": entries}))
    code, err = run_cli(["import", "--manifest", tmp_path / "manifest.json", "--data", tmp_path / "data.npz",
                         "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------- CNN state dicts


def _digits_cnn():
    import torch

    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 3, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


CNN_CONV = {"input_shape": [1, 8, 8], "layers": [{"stride": 2, "pad": 1}, {"stride": 1, "pad": 0}]}


@pytest.mark.parametrize("form", ["pt", "safetensors", "stacked"])
def test_a_cnn_state_dict_imports_as_the_network_onnx_gives_and_torch_computes(form, tmp_path, capsys):
    """With the manifest's "conv" (image, strides, padding), a CNN's state dict imports to the very
    networks its ONNX export does (bit for bit), whose forward pass is torch's; without "conv"
    it is refused in one line saying what to give."""
    import torch
    from safetensors.torch import save_file

    rows = 3
    X = np.random.default_rng(0).uniform(size=(rows, 64)).astype(np.float32)
    np.savez(tmp_path / "data.npz", X=X, y=np.array([0, 1, 2]))
    models = []
    for position in range(rows + 1):
        torch.manual_seed(position)
        models.append(_digits_cnn().eval())
    for d in ("sd", "onnx"):
        (tmp_path / d).mkdir()
    removed = [None, *range(rows)]
    entries, onnx_entries = [], []
    for p, (model, row) in enumerate(zip(models, removed)):
        _export(model, torch.rand(1, 1, 8, 8), tmp_path / "onnx" / f"n{p}.onnx", dynamo=False)
        onnx_entries.append({"file": f"n{p}.onnx", "removed": row})
        if form == "pt":
            torch.save(model.state_dict(), tmp_path / "sd" / f"n{p}.pt")
            entries.append({"file": f"n{p}.pt", "removed": row})
        elif form == "safetensors":
            save_file(model.state_dict(), str(tmp_path / "sd" / f"n{p}.safetensors"))
            entries.append({"file": f"n{p}.safetensors", "removed": row})
    if form == "stacked":
        from torch.func import stack_module_state

        params, _ = stack_module_state(models)
        save_file({**{k: v.detach().contiguous() for k, v in params.items()}, "removed": torch.tensor([-1, 0, 1, 2])},
                  str(tmp_path / "sd" / "all.safetensors"))
        entries.append({"file": "all.safetensors", "stacked": True})
    for d, listed, extra in (("sd", entries, {"conv": CNN_CONV}), ("onnx", onnx_entries, {})):
        (tmp_path / d / "manifest.json").write_text(json.dumps({"training": {"name": "t"}, "networks": listed, **extra}))
        main(["import", "--manifest", str(tmp_path / d / "manifest.json"), "--data", str(tmp_path / "data.npz"),
              "--out", str(tmp_path / f"run-{d}")])
    from_sd, from_onnx = (load_file(str(tmp_path / f"run-{d}" / "networks.safetensors")) for d in ("sd", "onnx"))
    assert from_sd.keys() == from_onnx.keys() and all(from_sd[k].tobytes() == from_onnx[k].tobytes() for k in from_sd)
    stack = load_networks(tmp_path / "run-sd")
    images = torch.rand(64, 1, 8, 8)
    mine = stack.forward(images.reshape(64, -1).double().numpy())
    for p, model in enumerate(models):
        with torch.no_grad():
            assert np.abs(mine[p] - model(images).double().numpy()).max() <= 1e-5
    # without "conv", or with the wrong strides: one line, what to do, nothing written
    capsys.readouterr()
    for conv, words in ((None, "give them in the manifest"), ({**CNN_CONV, "layers": CNN_CONV["layers"][:1]},
                                                              "2 convolutions, but the manifest's \"conv\" describes 1"),
                        ({**CNN_CONV, "input_shape": [1, 8]}, "write 'conv' as")):
        manifest = {"training": {"name": "t"}, "networks": entries, **({} if conv is None else {"conv": conv})}
        (tmp_path / "sd" / "manifest.json").write_text(json.dumps(manifest))
        code, err = run_cli(["import", "--manifest", tmp_path / "sd" / "manifest.json", "--data", tmp_path / "data.npz",
                             "--out", tmp_path / "refused"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
        assert not (tmp_path / "refused").exists()


# ------------------------------------------------------------------------------------- wording


def test_a_parameter_beyond_the_limit_is_refused_naming_its_network_file(tmp_path, exported, tiny_run, capsys):
    def huge(files, manifest):
        _edit(files / "n3.onnx", lambda m: m.graph.initializer[0].CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(m.graph.initializer[0]) * np.float32(2.0**70), m.graph.initializer[0].name)))

    code, err, out = _import_case(tmp_path, exported, tiny_run, capsys, huge)
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    assert "n3.onnx: layer 0 has a parameter of magnitude" in err and "manifest.json" not in err, err


def test_a_scikit_learn_onnx_ml_graph_is_refused_saying_what_to_do(tmp_path, capsys):
    """skl2onnx's graphs end in a label and a ZipMap of probabilities (ops of ai.onnx.ml)."""
    from lucid.errors import LucidError
    from lucid.interop.onnx_read import read_onnx

    nodes = [helper.make_node("Gemm", ["x", "w"], ["s"], transB=1),
             helper.make_node("ArgMax", ["s"], ["label"], axis=1),
             helper.make_node("Softmax", ["s"], ["p"], axis=1),
             helper.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])]
    graph = helper.make_graph(nodes, "skl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
                               helper.make_value_info("probabilities", helper.make_sequence_type_proto(
                                   helper.make_map_type_proto(TensorProto.INT64,
                                                              helper.make_tensor_type_proto(TensorProto.FLOAT, [9]))))],
                              initializer=[numpy_helper.from_array(np.ones((2, 2), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    onnx.save_model(model, str(tmp_path / "skl.onnx"))
    with pytest.raises(LucidError, match=r"ONNX-ML graph \(ops ZipMap\).*coefs_ and intercepts_ as a state dict"):
        read_onnx(tmp_path / "skl.onnx")


@pytest.mark.parametrize("given", [True, False])
def test_the_report_says_whether_the_manifest_gave_the_domain(given, tmp_path, exported, tiny_run):
    """A box that coincides with the data's extremes is 'no public domain was given' only when the
    manifest gave none."""
    import shutil

    files = tmp_path / "files"
    shutil.copytree(exported, files)
    manifest = json.loads((files / "manifest.json").read_text())
    del manifest["origin"]
    with np.load(tiny_run / "data.npz") as npz:
        arrays = {k: npz[k] * np.float32(3.0) if k.startswith("X") else npz[k] for k in npz.files}
    np.savez(tmp_path / "data.npz", **arrays)
    rows = np.concatenate([arrays["X_train"], arrays["X_test"]])
    manifest["domain"] = {"lower": rows.min(0).tolist(), "upper": rows.max(0).tolist()}  # the data's own extremes
    if not given:
        del manifest["domain"]
    (files / "manifest.json").write_text(json.dumps(manifest))
    main(["import", "--manifest", str(files / "manifest.json"), "--data", str(tmp_path / "data.npz"),
          "--out", str(tmp_path / "run")])
    assert open_run(tmp_path / "run").meta["data"]["domain_source"] == ("manifest" if given else "default")
    verify(tmp_path / "run")
    main(["report", str(tmp_path / "run"), "--format", "md", "--out", str(tmp_path / "report.md")])
    text = (tmp_path / "report.md").read_text()
    assert ("no public domain" in text) != given
    assert ("given in the import's manifest coincides with the data" in text) == given
