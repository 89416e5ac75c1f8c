"""The CUDA path against the CPU: runs where CUDA is present, skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from lucid.verify import verify_run
from lucid.training import train_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here")
TRAIN = dict(arch="2x8", epochs=5, batch_size=32, progress=False)


def test_cuda_training_matches_cpu_and_gives_the_same_bounds(tmp_path):
    cpu = train_run("sklearn:breast_cancer", tmp_path / "cpu", device="cpu", **TRAIN)
    gpu = train_run("sklearn:breast_cancer", tmp_path / "gpu", device="cuda", **TRAIN)
    a, b = load_file(str(cpu / "networks.safetensors")), load_file(str(gpu / "networks.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.allclose(a[k], b[k], rtol=0, atol=1e-4), k
    ca = verify_run(cpu, workers=2, time_limit=120, rel_gap=0.1, progress=False)
    cb = verify_run(gpu, workers=2, time_limit=120, rel_gap=0.1, progress=False)
    for c in ca["bounds"]:
        ua, ub = ca["bounds"][c]["upper"], cb["bounds"][c]["upper"]
        # Parameters differ by float32 rounding only, so the bounds agree up to the solvers' margins
        # and the tolerance of --rel-gap.
        if ua is not None and ub is not None:
            assert abs(ua - ub) <= 0.1 * max(abs(ua), abs(ub)) + 1e-4, (c, ua, ub)


def test_the_symbolic_screen_on_cuda_gives_the_cpu_bounds(tmp_path):
    run = train_run("sklearn:wine", tmp_path / "run", **TRAIN)
    cpu = verify_run(run, workers=2, rel_gap=0.1, progress=False, screen="optimised", device="cpu")
    for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
        (run / stale).unlink(missing_ok=True)
    gpu = verify_run(run, workers=2, rel_gap=0.1, progress=False, screen="optimised", device="cuda")
    for c, b in cpu["bounds"].items():
        g = gpu["bounds"][c]
        assert b["complete"] and g["complete"]
        if b["upper"] is not None and g["upper"] is not None:  # both within the tolerance of the same beta
            assert abs(b["upper"] - g["upper"]) <= 0.1 * max(abs(b["upper"]), abs(g["upper"])) + 1e-4, (c, b, g)
