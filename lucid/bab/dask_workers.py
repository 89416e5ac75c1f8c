"""Node analyses on a Dask cluster: the executor of `lucid verify --scheduler`.

The branch-and-bound queue stays in the driver, as with the local executors (`lucid.bab.workers`);
the verification problem is held once by every Dask worker (`lucid.worker_inputs`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from dataclasses import replace
from typing import Any

import numpy as np

from lucid.bab.workers import Executor, analyse_with
from lucid.cluster import connect
from lucid.errors import LucidError
from lucid.settings import VerifySettings


class DaskExecutor(Executor):
    """Node analyses on a Dask cluster (`lucid.cluster.connect`); the queue stays here. A worker that
    dies mid-node loses only that node: the scheduler runs it again elsewhere. Losing the scheduler
    itself ends the verification with one error line; every solved node is in the checkpoint."""

    def __init__(self, problem: Any, settings: VerifySettings, scheduler: Any, workers: int | None) -> None:
        from lucid.worker_inputs import hold

        super().__init__()
        self._cluster = connect(scheduler)
        self._client = self._cluster.client
        self._address = scheduler if isinstance(scheduler, str) else "the given client"
        self.capacity = workers if workers is not None else self._cluster.workers
        try:
            self._problem = hold(self._client, problem, "verification-problem")
        except BaseException:
            self._cluster.close()
            raise
        # the scheduler (maybe a Client) stays here; workers only need to know they run on Dask
        self._settings = replace(settings, scheduler="dask")

    def _idle_workers(self) -> set[int]:
        return set()  # tasks go wherever Dask sends them: no kept trees (settings.keep_trees is off)

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1, threads=1, split_only=False):
        fut = self._client.submit(
            _analyse_on_dask,
            self._problem,
            self._settings,
            cls,
            np.asarray(positions),
            time_limit,
            cutoff,
            attempt,
            threads,
            split_only,
            pure=False,
        )
        self._watch(key, fut)

    def completed(self, timeout: float) -> list[tuple[Any, Any]]:
        results = super().completed(timeout)
        lost = self._client.status not in ("running", "connecting")
        for _key, outcome in results:
            if isinstance(outcome, BaseException) and (lost or _is_lost_cluster(outcome)):
                raise LucidError(
                    f"lost the Dask cluster at {self._address} ({type(outcome).__name__}); every solved "
                    "node is in the checkpoint: run again with --resume, with or without --scheduler"
                )
        if lost and self._futures:
            raise LucidError(
                f"lost the Dask cluster at {self._address}; every solved node is in the checkpoint: "
                "run again with --resume, with or without --scheduler"
            )
        return results

    def close(self) -> None:
        from lucid.worker_inputs import release

        for fut in list(self._futures.values()):
            with contextlib.suppress(Exception):  # a future of a cluster that is going away
                fut.cancel()
        release(self._client, self._problem)
        self._cluster.close()


def _analyse_on_dask(
    problem_name: str,
    settings: VerifySettings,
    cls: int,
    positions: np.ndarray,
    time_limit: float | None,
    cutoff: float,
    attempt: int,
    threads: int,
    split_only: bool = False,
):
    from lucid.worker_inputs import held_value

    return analyse_with(
        held_value(problem_name), settings, cls, positions, time_limit, cutoff, attempt, threads, split_only
    )


def _is_lost_cluster(exc: BaseException) -> bool:
    """A failure of the cluster, not of the analysis (those are reported as themselves)."""
    from distributed.comm.core import CommClosedError

    return isinstance(exc, (CommClosedError, concurrent.futures.CancelledError, OSError))
