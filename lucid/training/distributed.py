"""Training chunks of networks on a Dask cluster (`lucid train --scheduler`).

The driver keeps everything that makes a run resumable and atomic (the staging directory, one
file per finished chunk, the final publish); workers only compute chunks. The training inputs
(rows, labels, initial parameters, batch orders) are given to every worker once
(`lucid.worker_inputs`), not sent with each chunk. A chunk is the same pure function of those
inputs as in a local run, computed with one torch thread, so the result is bit-identical to a
local run. A worker that dies mid-chunk loses only that chunk: the scheduler runs it again on
another worker, which holds the inputs (a restarted one gets them again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.sgd import SgdStep, TrainingInputs
from lucid.training.resources import keep_freed_memory


def train_chunk(inputs_name: str, lo: int, hi: int, sgd: SgdStep) -> dict[str, np.ndarray]:
    """Networks lo..hi-1 of the run (position 0 = N): their trained parameters and removed rows."""
    import torch

    from lucid.training.vectorized import train_networks
    from lucid.worker_inputs import held_value

    inputs = held_value(inputs_name)
    torch.set_num_threads(1)  # as a local chunk: bit-identical arithmetic whatever the worker's cores
    # As in a local run: without it every step's activations are mapped and unmapped again (Dask's
    # nanny even asks glibc to trim at 64 KiB), and page faults took 2.5x a local run's time. The
    # setting stays with the worker process: its heap keeps up to 512 MiB of freed memory.
    keep_freed_memory()
    removed = torch.arange(-1, len(inputs["y"]), dtype=torch.int64)[lo:hi]
    trained = train_networks(
        TrainingInputs(
            {k: torch.from_numpy(v) for k, v in inputs["init"].items()},
            inputs["spec"],
            torch.from_numpy(inputs["X"]),
            torch.from_numpy(inputs["y"]),
            torch.from_numpy(inputs["orders"]),
        ),
        sgd,
        removed,
    )
    trained["removed"] = removed
    return {k: v.detach().cpu().numpy() for k, v in trained.items()}


def train_on_cluster(
    cluster: Any,
    inputs: dict[str, Any],
    chunks: dict[int, tuple[int, int]],
    sgd: SgdStep,
    save: Callable[[int, dict[str, np.ndarray]], None],
    advance: Callable[[int], None],
    stop_after: int = 0,
) -> None:
    """Train every chunk {index: (lo, hi)} on the cluster; `save` each as it arrives."""
    from distributed import as_completed

    from lucid.worker_inputs import hold, release

    client = cluster.client
    name = hold(client, inputs, "training-inputs")
    futures: dict[Any, int] = {}
    finished = 0
    try:
        futures = {client.submit(train_chunk, name, lo, hi, sgd, pure=False): c for c, (lo, hi) in chunks.items()}
        for future in as_completed(list(futures)):
            c = futures[future]
            save(c, future.result())
            advance(chunks[c][1] - chunks[c][0])
            finished += 1
            if stop_after and finished >= stop_after and finished < len(chunks):
                raise KeyboardInterrupt  # test hook: behave exactly like Ctrl-C
    finally:
        client.cancel(list(futures))
        release(client, name)
