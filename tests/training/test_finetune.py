"""The fine-tuning variant of T from the command line: `lucid train --init RUN --train-layers L`.

Frozen layers stay exactly the pre-trained N's in every network, the trained layers get T's
arithmetic (the same networks as the trainer called directly), the AGT boxes contain every
leave-one-out network, the box bound covers the exact leave-one-out bound, and a start that
does not fit is one error line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from lucid.agt.store import load_boxes
from lucid.verify import verify_run
from lucid.cli import main
from lucid.sgd import SgdStep, TrainingInputs
from lucid.training import train_run
from lucid.training.vectorized import batch_orders, train_networks

TRAIN = dict(arch="2x5", epochs=3, batch_size=8, lr=0.2, progress=False)


def npz(path, n, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g)
    y = ((X[:, 0] + 0.5 * X[:, 1] + 0.1 * torch.randn(n, generator=g)) > 0.75).long()
    np.savez(path, X=X.numpy() * spread, y=y.numpy())
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune")
    domain = tmp / "domain.json"  # both data sets scaled the same way, as --init requires
    domain.write_text(json.dumps({"lower": [0.0] * 3, "upper": [1.0] * 3}))
    public = train_run(str(npz(tmp / "public.npz", 60, seed=1)), tmp / "public", loo=False, domain=str(domain),
                       **dict(TRAIN, epochs=20))
    private = npz(tmp / "private.npz", 24, seed=2)
    tuned = train_run(str(private), tmp / "tuned", init_from=str(public), train_layers="last", agt=2,
                      domain=str(domain), **TRAIN)
    own = train_run(str(private), tmp / "own", loo=False, domain=str(domain), **TRAIN)  # N of the private rows
    return {"public": public, "tuned": tuned, "private": private, "domain": domain, "tmp": tmp, "own": own}


def tensors(run) -> dict[str, np.ndarray]:
    return load_file(str(run / "networks.safetensors"))


def test_frozen_layers_are_the_pretrained_n_and_the_last_layer_is_trained(runs):
    pub, nets = tensors(runs["public"]), tensors(runs["tuned"])
    assert nets["removed"].tolist() == list(range(-1, 19))  # 24 rows, 80 % for training
    for name in ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"):
        assert np.array_equal(nets[name], np.broadcast_to(pub[name][0], nets[name].shape)), name
    last = nets["layers.2.weight"]
    assert not np.array_equal(last[0], pub["layers.2.weight"][0])  # N moved from its start
    assert len({last[i].tobytes() for i in range(len(last))}) > 1  # and the N_-i differ from N
    meta = json.loads((runs["tuned"] / "run.json").read_text())["training"]
    assert meta["trainable_layers"] == [2] and len(meta["init"]["sha256"]) == 64
    assert meta["init"]["fingerprint"] == json.loads((runs["public"] / "run.json").read_text())["training"]["fingerprint"]


def test_the_runs_networks_are_the_trainers_with_those_layers_trainable(runs):
    data = np.load(runs["tuned"] / "data.npz")
    X, y = torch.from_numpy(data["X_train"]), torch.from_numpy(data["y_train"])
    init = {k: torch.from_numpy(v[0]) for k, v in tensors(runs["public"]).items() if k != "removed"}
    # every network of the run, as its one chunk: batched kernels may round differently for another
    # batch of networks, and the claim is bit-identity with what the trainer computes for the run
    removed = torch.arange(-1, len(y))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the harness trains each chunk
    try:
        ref = train_networks(TrainingInputs(init, {"type": "mlp", "hidden": [5, 5]}, X, y, batch_orders(len(y), 3, 0)),
                             SgdStep(lr=0.2, weight_decay=1e-5, batch_size=8, num_classes=2, trainable={2}), removed)
    finally:
        torch.set_num_threads(threads)
    nets = tensors(runs["tuned"])
    for name, t in ref.items():
        assert np.array_equal(nets[name], t.numpy()), name


def test_every_leave_one_out_network_lies_in_the_boxes_and_the_box_bound_covers_loo(runs, tmp_path):
    nets = {k: torch.from_numpy(v) for k, v in tensors(runs["tuned"]).items()}
    boxes = load_boxes(runs["tuned"])
    for k in (1, 2):
        assert boxes[k].contains(nets)
        assert torch.equal(boxes[k].lower["layers.0.weight"], boxes[k].upper["layers.0.weight"])  # frozen: a point
    from safetensors import safe_open

    with safe_open(str(runs["tuned"] / "agt.safetensors"), framework="pt") as fh:
        assert fh.metadata()["update"] == "zonotope"  # last-layer fine-tuning gets the tightest rule
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs["tuned"], run)
    loo = verify_run(run, workers=1, progress=False)["bounds"]
    agt = verify_run(run, hyper="agt:1", workers=1, progress=False)["bounds"]
    for c in loo:
        assert loo[c]["complete"]
        if agt[c]["upper"] is not None and loo[c]["upper"] is not None:
            assert agt[c]["upper"] >= loo[c]["upper"] - 1e-6, (c, agt[c], loo[c])


def cli(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--arch", "2x6"], "--init {public}: its architecture differs"),
    (["--domain", None, "DATA", "wide"], "--init {public}: its feature scaling differs"),
    (["--train-layers", "3"], "layer indices must lie in 0..2"),
    (["--train-layers", "x"], "--train-layers must be all, last or layer indices"),
    (["--init", "{tmp}/nothing"], "--init {tmp}/nothing: run directory"),
    (["--init", "{tmp}/own"], "--init {tmp}/own: it was trained on every training row of this run"),
])
def test_a_start_that_does_not_fit_is_one_line_and_writes_nothing(runs, tmp_path, capsys, extra, message):
    args = {"--arch": "2x5", "--init": str(runs["public"]), "--domain": str(runs["domain"]), "--train-layers": "last",
            "DATA": str(runs["private"])}
    for flag, value in zip(extra[::2], extra[1::2]):
        args[flag] = value.format(tmp=runs["tmp"]) if value else value
    if args["DATA"] == "wide":  # features beyond [0, 1]: min-max scaled over this data, unlike the start's
        args["DATA"] = str(npz(tmp_path / "wide.npz", 24, seed=2, spread=3.0))
    argv = ["train", args.pop("DATA"), "--no-progress", "--out", str(tmp_path / "out")]
    argv += [t for flag, value in args.items() if value is not None for t in (flag, value)]
    code, err = cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert message.format(public=runs["public"], tmp=runs["tmp"]) in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
