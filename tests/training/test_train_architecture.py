"""Architecture strings, and that a trained CNN agrees with its dense lowering in lucid.network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lucid.errors import LucidError
from lucid.network import load_networks
from lucid.training import train_run
from lucid.training.architecture import parse_arch, reference_net


@pytest.mark.parametrize("text,hidden", [("2x50", [50, 50]), ("3x4", [4, 4, 4]), ("50,20", [50, 20]), ("7", [7])])
def test_parse_mlp(text, hidden):
    assert parse_arch(text) == {"type": "mlp", "hidden": hidden}


@pytest.mark.parametrize("text", ["", "2x", "x50", "2x0", "0x5", "mlp", "2*50", "50,,20", "-1"])
def test_parse_rejects(text):
    with pytest.raises(LucidError):
        parse_arch(text)


def test_cnn_run_matches_torch_module_through_lowering(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((12, 6)).astype(np.float32)
    y = (X.sum(axis=1) > 3).astype(np.int64)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    out = train_run(str(tmp_path / "d.npz"), tmp_path / "run", arch="cnn", epochs=2, batch_size=5,
                    lr=0.5, test_fraction=0, progress=False)
    stack = load_networks(out)
    assert stack.layer_sizes == [6, 6 * 4, 6 * 2, 2, 2]
    from safetensors.torch import load_file

    tensors = load_file(str(out / "networks.safetensors"))
    assert tensors["conv.0.weight"].shape == (13, 6, 1, 3) and tensors["conv.1.weight"].shape == (13, 6, 6, 3)
    queries = rng.random((40, 6)).astype(np.float32)
    for pos in (0, 5, 12):
        net = reference_net(parse_arch("cnn"), 6, 2, seed=0)
        net.load_state_dict({k: v[pos] for k, v in tensors.items() if k != "removed"})
        with torch.no_grad():
            want = net(torch.from_numpy(queries)).double().numpy()
        np.testing.assert_allclose(stack.select([pos]).forward(queries)[0], want, atol=1e-5)
