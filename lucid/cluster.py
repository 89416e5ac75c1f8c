"""Connecting to a Dask cluster, for `lucid train --scheduler` and `lucid verify --scheduler`.

`connect(spec)` accepts a scheduler address (`tcp://HOST:8786`), `local:N` (a `LocalCluster` of N
worker processes with one thread each, started and stopped with the client) or an existing
`distributed.Client`. Before any work is sent, every worker is asked for its LUCID version: a
worker without LUCID, or with another version than this process, would fail (or, worse, compute
something else) in the middle of a run, so it is one error line up front instead.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

import lucid
from lucid.errors import LucidError

DISTRIBUTION = "lucid-idp"
CONNECT_TIMEOUT = 10  # seconds


def _local_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return lucid.__version__


@dataclass
class Cluster:
    client: Any
    owned: bool  # we started the client (and maybe a LocalCluster): we close it
    local: Any = None

    @property
    def workers(self) -> int:
        """Worker threads in the cluster (one node or chunk at a time each)."""
        return max(1, sum(self.client.nthreads().values()))

    def close(self) -> None:
        if not self.owned:
            return
        try:
            self.client.close()
        finally:
            if self.local is not None:
                self.local.close()


def connect(spec: Any) -> Cluster:
    """A checked connection to the cluster named by `spec` (see the module docstring)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise LucidError("--scheduler needs dask[distributed] installed") from None
    if isinstance(spec, Client):
        cluster = Cluster(spec, owned=False)
    elif isinstance(spec, str) and spec.startswith("local:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise LucidError(f"--scheduler {spec}: use local:N with N >= 1 worker processes")
        local = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        cluster = Cluster(Client(local), owned=True, local=local)
    else:
        try:
            client = Client(spec, timeout=CONNECT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 (any failure to connect is the one error line)
            raise LucidError(f"cannot connect to the Dask scheduler at {spec}: {exc}") from None
        cluster = Cluster(client, owned=True)
    try:
        check_workers(cluster.client)
    except BaseException:
        cluster.close()
        raise
    return cluster


def check_workers(client: Any, timeout: float = 30.0) -> None:
    """Every worker runs this LUCID version (one error line naming the first that does not)."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except Exception:  # noqa: BLE001 (any failure here means no worker answered)
        raise LucidError(f"the Dask cluster at {client.scheduler.address} has no workers") from None
    # importlib.metadata.version is pickled by reference to the standard library, so the probe
    # itself runs on a worker without LUCID.
    try:
        versions = client.run(importlib.metadata.version, DISTRIBUTION, on_error="return")
    except Exception as exc:  # noqa: BLE001 (any failure to ask is the one error line)
        raise LucidError(f"cannot ask the Dask workers for their LUCID version: {exc}") from None
    mine = _local_version()
    for worker, version in sorted(versions.items()):
        if isinstance(version, BaseException):
            raise LucidError(f"Dask worker {worker} has no LUCID installed (pip install {DISTRIBUTION} there)")
        if version != mine:
            raise LucidError(
                f"Dask worker {worker} runs LUCID {version}, this process {mine}; install the same version everywhere"
            )
