"""Inputs that every Dask worker holds for the length of a run: the verification problem, the
training data.

Scattered data (`client.scatter(..., broadcast=True)`) cannot carry this: Dask's active memory
manager drops the replicas that no waiting task needs, and a worker killed while holding the last
one would cancel every later task ("lost scattered data") and so end the run. A worker plugin
instead is kept by the scheduler and set up again on every worker that joins, restarted
ones included, so a dead worker costs only the task it was running. The price is one pickled copy
of the inputs in the scheduler's memory.

Import this module only where `distributed` is installed (the `--scheduler` paths).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from distributed import WorkerPlugin, get_worker

from lucid.errors import LucidError


class _Inputs(WorkerPlugin):
    def __init__(self, value: Any) -> None:
        self.value = value


def hold(client: Any, value: Any, what: str) -> str:
    """Give `value` to every worker of `client`'s cluster, now and later; the name to find it by."""
    name = f"lucid-{what}-{uuid.uuid4().hex}"
    client.register_plugin(_Inputs(value), name=name)
    return name


def release(client: Any, name: str) -> None:
    """Drop what `hold` gave; a cluster that is already gone holds nothing to drop."""
    if client.status != "running":
        return
    with contextlib.suppress(Exception):  # the scheduler went away meanwhile: nothing is left to drop
        client.unregister_worker_plugin(name)


def held_value(name: str) -> Any:
    """In a task: the value that `hold` gave this worker under `name`."""
    plugin = get_worker().plugins.get(name)
    if not isinstance(plugin, _Inputs):  # None: not held (no other plugin goes by these names)
        raise LucidError(f"this Dask worker holds no {name}: was it released before its last task ran?")
    return plugin.value
