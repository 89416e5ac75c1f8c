"""Networks streamed from networks.safetensors and memory-mapped from RUN/cache/ are the same
float64 networks `load_networks` gives, are read-only, and reach worker processes by file name."""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from lucid.access.evaluate import leaking_set
from lucid.bab.partition import FlatParameters
from lucid.errors import LucidError
from lucid.network import NetworkFile, load_networks
from lucid.network_cache import mapped_networks
from lucid.rundir import open_run
from synthetic_runs import write_synthetic_run


@pytest.fixture
def run(tmp_path):
    return open_run(write_synthetic_run(tmp_path / "run", input_dim=3, hidden=(6, 5), train_size=40, seed=3))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a.weights + a.biases, b.weights + b.biases):
        assert x.dtype == y.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(a.removed, b.removed)


def test_streamed_slices_are_the_loaded_networks(run):
    full = load_networks(run.path)
    source = NetworkFile(run.path)
    assert len(source) == len(full) == 41
    _same(source.select(slice(7, 19)), full.select(slice(7, 19)))
    _same(load_networks(run.path, index=slice(0, 1)), full.select([0]))
    x = np.random.default_rng(0).uniform(0, 1, size=(200, 3))
    np.testing.assert_array_equal(leaking_set(source, x), leaking_set(full, x))
    assert leaking_set(full, x).any() and not leaking_set(full, x).all()  # the comparison means something


def test_mapped_networks_equal_loaded_are_read_only_and_cached(run, monkeypatch):
    full = load_networks(run.path)
    mapped = mapped_networks(run.path, run.meta)
    _same(mapped, full)
    assert all(isinstance(w, np.memmap) for w in mapped.weights)
    with pytest.raises(ValueError, match="read-only"):
        mapped.weights[0][1, 0, 0] = 0.0
    folders = sorted((run.path / "cache").glob("networks-f64-*"))
    assert len(folders) == 1

    import lucid.network_cache as nc

    monkeypatch.setattr(nc, "_write_cache", lambda *a: pytest.fail("the cache was written again"))
    _same(mapped_networks(run.path, run.meta), full)


def test_a_changed_networks_file_gets_a_new_cache(tmp_path):
    a = open_run(write_synthetic_run(tmp_path / "a", seed=1))
    mapped_networks(a.path, a.meta)
    first = sorted((a.path / "cache").glob("networks-f64-*"))
    (a.path / "networks.safetensors").write_bytes(
        (write_synthetic_run(tmp_path / "b", seed=2) / "networks.safetensors").read_bytes())
    _same(mapped_networks(a.path, a.meta), load_networks(a.path))
    now = sorted((a.path / "cache").glob("networks-f64-*"))
    assert len(first) == len(now) == 1 and first != now  # the stale copy is gone


def test_an_unwritable_cache_falls_back_to_memory(run, monkeypatch, caplog):
    import lucid.network_cache as nc

    def refuse(*args):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(nc, "_write_cache", refuse)
    stack = mapped_networks(run.path, run.meta)
    _same(stack, load_networks(run.path))
    assert not isinstance(stack.weights[0], np.memmap)
    assert "loading them into memory" in caplog.text


def test_a_corrupt_networks_file_is_one_clear_error(run):
    (run.path / "networks.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(LucidError, match="cannot read"):
        mapped_networks(run.path, run.meta)


def _forking_dumps(obj) -> bytes:
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def test_worker_processes_receive_maps_by_name_and_views_by_value(run):
    mapped = mapped_networks(run.path, run.meta)
    data_bytes = sum(w.nbytes for w in mapped.weights)
    sent = _forking_dumps(mapped)
    assert len(sent) < data_bytes / 2  # file names, not the parameters
    _same(pickle.loads(sent), mapped)
    part = mapped.select(slice(5, 9))  # a view into the map: must travel as its own values
    _same(pickle.loads(_forking_dumps(part)), part)
    picked = mapped.select([1, 4, 30])
    _same(pickle.loads(_forking_dumps(picked)), picked)


def test_flat_parameters_per_node_equal_rows_of_the_full_matrix(run):
    stack = load_networks(run.path)
    positions = np.array([2, 3, 17, 40])
    np.testing.assert_array_equal(FlatParameters(stack)[positions], stack.flat_parameters()[positions])
