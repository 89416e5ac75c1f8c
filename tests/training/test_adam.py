"""`lucid.adam.Adam` against `torch.optim.Adam`: the same iterates, bit for bit."""

from __future__ import annotations

import pytest
import torch

from lucid.adam import Adam


def _run(make, dtype, steps=25):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 3, generator=gen, dtype=dtype).requires_grad_(True)
    b = torch.randn(5, generator=gen, dtype=dtype).requires_grad_(True)
    frozen = torch.randn(2, generator=gen, dtype=dtype).requires_grad_(True)  # never gets a grad
    opt = make(a, b, frozen)
    trace = []
    for k in range(steps):
        opt.zero_grad()
        loss = ((a - k / 10) ** 3).sum() + (b.sin() * a.sum()).sum()
        loss.backward()
        opt.step()
        trace.append((a.detach().clone(), b.detach().clone(), frozen.detach().clone()))
    return trace


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_same_iterates_as_torch_with_parameter_groups(dtype):
    def groups(a, b, frozen):
        return [{"params": [a], "lr": 0.05}, {"params": [b, frozen], "lr": 0.2}]

    ours = _run(lambda *p: Adam(groups(*p), lr=0.01), dtype)
    theirs = _run(lambda *p: torch.optim.Adam(groups(*p), lr=0.01), dtype)
    for x, y in zip(ours, theirs):
        for s, t in zip(x, y):
            assert torch.equal(s, t)
    assert not torch.equal(ours[0][0], ours[-1][0])  # it moved


def test_same_iterates_as_torch_with_a_plain_list():
    dtype = torch.float32
    ours = _run(lambda *p: Adam(list(p), lr=0.03), dtype)
    theirs = _run(lambda *p: torch.optim.Adam(list(p), lr=0.03), dtype)
    assert all(torch.equal(s, t) for x, y in zip(ours, theirs) for s, t in zip(x, y))
