"""Where node MILPs run: in-process threads, a local process pool, or a Dask cluster.

The branch-and-bound queue always stays in the driver; an executor only answers
"analyse (class, network positions) within this time limit". Every MILP is solved with one thread,
so N workers solve N nodes at once. The verification problem (all networks, the domain, N's bounds)
is shipped to each worker once — via the pool initializer, or scattered to every Dask worker — not
with every task.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import queue
from typing import Any, Callable

import numpy as np

from lucid.errors import LucidError

# analyse(cls, positions, time_limit, cutoff, attempt) -> NodeOutcome-like object; cutoff: the level
# below which the engine does not need the node's bound; attempt: 1 the first time a node is
# analysed, then 2, 3, ... (see lucid.verifier.analyse_node)
AnalyseFn = Callable[[int, np.ndarray, float | None, float, int], Any]


class Executor:
    """Submit node analyses; collect (key, outcome-or-exception) pairs as they finish."""

    capacity: int = 1

    def __init__(self) -> None:
        self._done: queue.Queue = queue.Queue()
        self._futures: dict[Any, Any] = {}

    def _watch(self, key: Any, future: Any) -> None:
        self._futures[key] = future
        future.add_done_callback(lambda f, key=key: self._done.put((key, f)))

    def submit(self, key: Any, cls: int, positions: np.ndarray, time_limit: float | None, cutoff: float,
               attempt: int = 1) -> None:
        raise NotImplementedError

    def completed(self, timeout: float) -> list[tuple[Any, Any]]:
        """Results finished so far, waiting up to `timeout` seconds for the first one."""
        out = []
        try:
            item = self._done.get(timeout=timeout)
        except queue.Empty:
            return out
        while True:
            key, future = item
            self._futures.pop(key, None)
            try:
                out.append((key, future.result()))
            except BaseException as exc:  # reported to the engine, which decides
                out.append((key, exc))
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                return out

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        pass


class ThreadExecutor(Executor):
    """Runs `analyse` in threads of this process (one worker, tests, or a custom analyser)."""

    def __init__(self, analyse: AnalyseFn, workers: int = 1) -> None:
        super().__init__()
        self.capacity = workers
        self._analyse = analyse
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lucid-node")

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1):
        self._watch(key, self._pool.submit(self._analyse, cls, positions, time_limit, cutoff, attempt))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# --- process pool ------------------------------------------------------------------------------
_WORKER_STATE: dict = {}


def _init_worker(problem: Any, settings: dict, driver_pid: int | None = None) -> None:
    import signal

    # Ctrl-C is handled by the driver (it checkpoints and stops the pool); workers must not print
    # their own KeyboardInterrupt tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if driver_pid is not None:
        _die_with(driver_pid)
    _WORKER_STATE["problem"] = problem
    _WORKER_STATE["settings"] = settings


def _die_with(driver_pid: int) -> None:
    """End this worker when the driver dies without stopping the pool (SIGKILL, a crash).

    Otherwise the worker finishes its MILP and any queued ones for nobody (seen: two orphans at
    full load for an hour after their driver was killed, halving the next run's speed). Linux
    kills it with the driver (PR_SET_PDEATHSIG); elsewhere a daemon thread polls the parent pid."""
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL)) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != driver_pid:  # it died before the request was in place
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == driver_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="lucid-driver-watch", daemon=True).start()


def analyse_with(problem: Any, settings: dict, cls: int, positions: np.ndarray, time_limit: float | None,
                 cutoff: float = -float("inf"), attempt: int = 1):
    """One node MILP with single-threaded solver options (runs in a worker)."""
    from lucid.solvers.base import SolverOptions
    from lucid.verifier import EncodingOptions, analyse_node

    options = SolverOptions(
        time_limit=time_limit,
        threads=1,
        mip_rel_gap=settings.get("mip_rel_gap", 0.0),
        mip_abs_gap=settings.get("mip_abs_gap", 0.0),
    )
    encoding = EncodingOptions(**settings["encoding"])
    outcome = analyse_node(problem, cls, positions, solver=settings["solver"], solver_options=options, encoding=encoding,
                           cutoff=cutoff, attempt=attempt)
    # An optimal witness is as good as any search; an infeasible node has nothing above the cutoff.
    if (settings.get("search") and len(positions) <= SEARCH_MAX_NETWORKS and outcome.upper > -float("inf")
            and outcome.status != "infeasible" and (outcome.status != "optimal" or outcome.lower is None)):
        outcome = _with_targeted_search(problem, settings, cls, positions, outcome)
    return outcome


# A small node's MILP often ends at its time limit without an incumbent; a search aimed at just its
# networks (a few seconds) then still gives the node a replayed witness.
SEARCH_MAX_NETWORKS = 8


def _with_targeted_search(problem: Any, settings: dict, cls: int, positions: np.ndarray, outcome: Any) -> Any:
    import dataclasses
    import time

    from lucid.bab.witness import search_class_witness

    t0 = time.perf_counter()
    found = search_class_witness(problem, cls, np.asarray(positions), points=settings.get("points"), samples=1024,
                           starts=8, steps=10)
    stats = dict(outcome.stats or {})
    stats["search_seconds"] = time.perf_counter() - t0
    stats["search_lower"] = None if found is None else float(found.confidence)
    if found is not None and (outcome.lower is None or found.confidence > outcome.lower):
        upper, status = outcome.upper, outcome.status
        if found.confidence > upper:
            # A true leak above a "proved" bound: the solver failed. Never use that bound; the node
            # keeps its parent's (inherited) bound instead.
            import logging

            logging.getLogger(__name__).error(
                "UNSOUND node bound for class %d: %.9g < replayed witness %.9g; bound dropped",
                cls, upper, found.confidence)
            stats["unsound_bound"] = float(upper)
            upper, status = float("inf"), "error"
        return dataclasses.replace(outcome, upper=upper, status=status, lower=float(found.confidence),
                                   witness=found.x, leaking_row=found.leaking_row, stats=stats)
    return dataclasses.replace(outcome, stats=stats)


def _analyse_in_process(cls: int, positions: np.ndarray, time_limit: float | None, cutoff: float, attempt: int):
    return analyse_with(_WORKER_STATE["problem"], _WORKER_STATE["settings"], cls, positions, time_limit, cutoff,
                        attempt)


class ProcessExecutor(Executor):
    def __init__(self, problem: Any, settings: dict, workers: int) -> None:
        super().__init__()
        self.capacity = workers
        # spawn, not fork: the driver runs threads (rich display, pool feeders) that fork would copy
        # in an arbitrary state.
        self._pool = cf.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(problem, settings, os.getpid()),
        )

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1):
        self._watch(key, self._pool.submit(_analyse_in_process, cls, positions, time_limit, cutoff, attempt))

    def close(self) -> None:
        # Running MILPs cannot be cancelled through the pool API; their time limits are capped by
        # the remaining total time, but a stop (time limit reached, gap closed) should not wait.
        processes = list(getattr(self._pool, "_processes", {}) .values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            try:
                p.terminate()
            except Exception:
                pass


class DaskExecutor(Executor):
    """Node MILPs on an existing Dask distributed cluster; the queue stays here."""

    def __init__(self, problem: Any, settings: dict, scheduler: Any, workers: int | None) -> None:
        super().__init__()
        try:
            from distributed import Client
        except ImportError:
            raise LucidError("--scheduler needs dask[distributed] installed") from None
        try:
            self._client = scheduler if isinstance(scheduler, Client) else Client(scheduler, timeout=10)
        except Exception as exc:
            raise LucidError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None
        self._owns_client = not isinstance(scheduler, Client)
        if workers is None:
            cores = sum(self._client.nthreads().values())
            workers = max(1, cores)
        self.capacity = workers
        self._problem = self._client.scatter(problem, broadcast=True)
        self._settings = settings

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1):
        fut = self._client.submit(
            analyse_with, self._problem, self._settings, cls, np.asarray(positions), time_limit, cutoff, attempt,
            pure=False,
        )
        self._watch(key, fut)

    def close(self) -> None:
        for fut in list(self._futures.values()):
            try:
                fut.cancel()
            except Exception:
                pass
        if self._owns_client:
            self._client.close()
