"""Training and verification on real Dask clusters of worker processes: bit-identical training,
identical bounds, a killed worker, a vanished scheduler, and the one-line errors."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from bab_fixtures import write_tiny_run
from click.testing import CliRunner
from safetensors.numpy import load_file

import lucid.cluster
import lucid.worker_inputs
from lucid.verify import verify_run
from lucid.bab.events import read_events
from lucid.errors import LucidError
from lucid.training import train_run
from lucid.training.harness import STOP_AFTER_ENV

distributed = pytest.importorskip("distributed")
TRAIN = dict(arch="2x8", epochs=3, batch_size=16, chunk_size=40, progress=False)
MARGIN_SLACK = 1e-5  # safety margins differ between the MILPs of different node sets


def networks(run) -> dict[str, np.ndarray]:
    return load_file(str(run / "networks.safetensors"))


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cl, distributed.Client(cl) as client:
        yield cl, client


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return train_run("sklearn:wine", tmp_path_factory.mktemp("local") / "run", **TRAIN)


def test_training_on_a_cluster_is_bit_identical_to_local(cluster, local_run, tmp_path):
    _, client = cluster
    run = train_run("sklearn:wine", tmp_path / "run", scheduler=client, **TRAIN)
    a, b = networks(local_run), networks(run)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert (run / "run.json").read_text() == (local_run / "run.json").read_text()


def test_training_survives_a_killed_worker_bit_identically(cluster, local_run, tmp_path):
    """The worker running a chunk dies: the scheduler runs that chunk again on a worker that
    still (or, restarted, again) holds the training inputs."""
    _, client = cluster

    def first_chunk_waits(seconds: float) -> None:  # in each worker: its first chunk starts late
        import lucid.worker_inputs as held

        original = held.held_value

        def late(name):
            held.held_value = original
            time.sleep(seconds)
            return original(name)

        late.original = original
        held.held_value = late

    def restore() -> None:
        import lucid.worker_inputs as held

        held.held_value = getattr(held.held_value, "original", held.held_value)

    # The whole training takes about 40 ms of the workers' time: the chunk seen running had often
    # ended by the next look, so the kill could miss it. A first chunk that waits 0.5 s (inside the
    # task, before it reads the inputs; the result is the same) is still running when it is killed.
    client.run(first_chunk_waits, 0.5)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(
        run=train_run("sklearn:wine", tmp_path / "run", scheduler=client, **TRAIN)))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        busy: list = []
        while time.monotonic() < deadline and not busy:
            busy = [w for w, tasks in client.processing().items() if tasks]
            time.sleep(0.005)
        if busy:
            os.kill(client.run(os.getpid, workers=busy[:1])[busy[0]], signal.SIGKILL)
        thread.join(120)
    finally:
        client.run(restore, on_error="ignore")
    assert not thread.is_alive() and result
    a, b = networks(local_run), networks(result["run"])
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    # Not asserted: that the cluster gets its second worker back. That is Dask's part, and its nanny
    # may close itself right after restarting a killed worker (a CI log: "Restarting worker", then
    # "Closing Nanny ... Reason: nanny-close" within a second), after which no worker ever returns.
    # No later test uses this module's cluster.
    assert busy  # the kill happened while a chunk ran


def test_fine_tuning_one_layer_on_a_cluster_is_bit_identical_to_local(cluster, tmp_path):
    _, client = cluster
    local = train_run("sklearn:wine", tmp_path / "local", train_layers="last", **TRAIN)
    run = train_run("sklearn:wine", tmp_path / "run", train_layers="last", scheduler=client, **TRAIN)
    a, b = networks(local), networks(run)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(a["layers.0.weight"][0], a["layers.0.weight"][-1])  # frozen in every network


def test_an_interrupted_cluster_run_resumes_locally_bit_identically(cluster, local_run, tmp_path, monkeypatch):
    _, client = cluster
    monkeypatch.setenv(STOP_AFTER_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        train_run("sklearn:wine", tmp_path / "run", scheduler=client, **TRAIN)
    staged = sorted(p.name for p in (tmp_path / "run.partial").glob("chunk-*"))
    assert staged and not (tmp_path / "run").exists()
    monkeypatch.delenv(STOP_AFTER_ENV)
    run = train_run("sklearn:wine", tmp_path / "run", **TRAIN)
    a, b = networks(local_run), networks(run)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_local_n_starts_and_stops_its_own_cluster(local_run, tmp_path):
    from lucid.cli import cli as main

    result = CliRunner().invoke(main, ["train", "sklearn:wine", "--out", str(tmp_path / "run"), "--arch", "2x8",
                                       "--epochs", "3", "--batch-size", "16", "--chunk-size", "40",
                                       "--no-progress", "--scheduler", "local:2"])
    assert result.exit_code == 0, result.output
    a, b = networks(local_run), networks(tmp_path / "run")
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("scheduler, message", [
    ("tcp://127.0.0.1:9", "cannot connect to the Dask scheduler at tcp://127.0.0.1:9"),
    ("local:0", "use local:N with N >= 1"),
])
def test_bad_schedulers_are_one_line_and_leave_nothing(tmp_path, monkeypatch, scheduler, message):
    monkeypatch.setattr(lucid.cluster, "CONNECT_TIMEOUT", 0.5)  # (nothing listens there; CI time: 2 before)
    from lucid.cli import cli as main

    for command in (["train", "sklearn:wine", "--out", str(tmp_path / "run")], ["verify", str(tmp_path / "vrun")]):
        if command[0] == "verify":
            write_tiny_run(tmp_path / "vrun", networks=4)
        result = CliRunner().invoke(main, [*command, "--scheduler", scheduler], standalone_mode=False)
        assert isinstance(result.exception, LucidError) and message in str(result.exception)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()
    assert not (tmp_path / "vrun" / "bounds.json").exists()


def test_workers_with_another_lucid_version_are_refused(cluster, monkeypatch, tmp_path):
    _, client = cluster
    monkeypatch.setattr(lucid.cluster, "_local_version", lambda: "0.0.0+other")
    with pytest.raises(LucidError, match=r"runs LUCID .* this process 0\.0\.0\+other"):
        train_run("sklearn:wine", tmp_path / "run", scheduler=client, **TRAIN)
    assert not (tmp_path / "run.partial").exists()


def test_workers_without_lucid_are_refused():
    class FakeClient:
        class scheduler:
            address = "tcp://fake"

        def wait_for_workers(self, n, timeout):
            pass

        def run(self, fn, *args, on_error):
            return {"tcp://w1": "0.1.0", "tcp://w2": ModuleNotFoundError("lucid")}

    monkeypatch_version = lucid.cluster._local_version()
    with pytest.raises(LucidError, match="tcp://w2 has no LUCID installed"):
        lucid.cluster.check_workers(FakeClient())
    assert monkeypatch_version


@pytest.fixture(scope="module")
def verify_reference(tmp_path_factory):
    run = write_tiny_run(tmp_path_factory.mktemp("vref") / "run", networks=8, seed=2)  # (8, not 12: CI time)
    return verify_run(run, workers=1, ris=False, progress=False)


def _pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def _holdings(client, name) -> dict[str, object]:
    def ask(dask_worker):
        plugin = dask_worker.plugins.get(name)
        return None if plugin is None else plugin.value
    return client.run(ask)


def test_inputs_held_for_a_run_come_back_on_a_restarted_worker_and_go_on_release(cluster):
    """Scattered data does not: a worker killed while holding its last replica ended the run."""
    _, client = cluster
    value = {"rows": np.arange(6.0)}
    name = lucid.worker_inputs.hold(client, value, "test")
    try:
        victim = sorted(_pids(client).values())[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the nanny's new process has joined
            pids = set(client.run(os.getpid, on_error="ignore").values())
            if len(pids) == 2 and victim not in pids:
                break
            time.sleep(0.1)
        holdings = _holdings(client, name)
        assert victim not in _pids(client).values() and len(holdings) == 2
        assert all(np.array_equal(h["rows"], value["rows"]) for h in holdings.values())
        assert client.submit(lambda: lucid.worker_inputs.held_value(name)["rows"].sum(), pure=False).result() == 15
    finally:
        lucid.worker_inputs.release(client, name)
    assert all(h is None for h in _holdings(client, name).values())
    with pytest.raises(LucidError, match="holds no"):
        client.submit(lucid.worker_inputs.held_value, name, pure=False).result()


def test_verification_on_worker_processes_survives_a_killed_worker(cluster, verify_reference, tmp_path):
    cl, client = cluster
    run = write_tiny_run(tmp_path / "run", networks=8, seed=2)  # verify_reference's networks
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(
        verify_run(run, scheduler=client, ris=False, progress=False)))
    thread.start()
    log = run / "verify.log.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and any(
            e["event"] == "started" and e.get("node") is not None for e in read_events(log))):
        time.sleep(0.01)
    victim = sorted(_pids(client).values())[0]
    os.kill(victim, signal.SIGKILL)  # the nanny restarts it; its task runs again elsewhere
    thread.join(120)
    assert not thread.is_alive() and result
    for c, b in result["bounds"].items():
        ref = verify_reference["bounds"][c]
        assert b["complete"] and abs(b["upper"] - ref["upper"]) <= MARGIN_SLACK, (c, b, ref)
    # Not asserted: that the cluster gets its second worker back. That is Dask's part, and its nanny
    # may close itself right after restarting a killed worker (a CI log: "Restarting worker", then
    # "Closing Nanny ... Reason: nanny-close" within a second), after which no worker ever returns.
    # No later test uses this module's cluster.


def test_a_vanished_scheduler_keeps_the_checkpoint_and_resume_finishes_locally(verify_reference, tmp_path):
    run = write_tiny_run(tmp_path / "run", networks=8, seed=2)  # verify_reference's networks
    cl = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    client = distributed.Client(cl)
    errors = []

    def verify():
        try:
            verify_run(run, scheduler=client, ris=False, progress=False, node_time_limit=30)
        except LucidError as exc:
            errors.append(exc)

    thread = threading.Thread(target=verify)
    thread.start()
    log = run / "verify.log.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and any(e["event"] == "solved" for e in read_events(log))):
        time.sleep(0.01)
    cl.close()  # scheduler and workers gone
    thread.join(120)
    client.close()
    assert not thread.is_alive()
    if not errors:
        pytest.skip("the verification finished before the scheduler was stopped")
    assert "lost the Dask cluster" in str(errors[0]) and "--resume" in str(errors[0])
    assert (run / "verify.checkpoint.json").exists() and not (run / "bounds.json").exists()
    result = verify_run(run, workers=1, ris=False, progress=False, node_time_limit=30, resume=True)
    for c, b in result["bounds"].items():
        ref = verify_reference["bounds"][c]
        assert b["complete"] and abs(b["upper"] - ref["upper"]) <= MARGIN_SLACK, (c, b, ref)
