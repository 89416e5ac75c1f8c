"""Where node MILPs run: in-process threads or a local process pool (a Dask cluster:
`lucid.bab.dask_workers`).

The branch-and-bound queue always stays in the driver; an executor only answers
"analyse (class, network positions) within this time limit". A MILP is solved with one thread, so
N workers solve N nodes at once; only the last node of a verification gets the idle workers'
threads. The verification problem (all networks, the domain, N's bounds) is shipped to each worker
once — via the pool initializer, or held by every Dask worker (`lucid.worker_inputs`) — not with every
task.

A singleton retry's time-limited MILP stays in the worker that solved it (`lucid.analysis.kept_trees`);
the process executor remembers which worker that is, so the engine can send the node's next retry
there and the solver continues its tree (`Executor.continuable`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import inspect
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.analysis.kept_trees import KEPT
from lucid.settings import VerifySettings

# analyse(cls, positions, time_limit, cutoff, attempt) -> NodeOutcome-like object; cutoff: the level
# below which the engine does not need the node's bound; attempt: 1 the first time a node is
# analysed, then 2, 3, ... (see lucid.analysis.analyse.analyse_node)
AnalyseFn = Callable[[int, np.ndarray, float | None, float, int], Any]


class Executor:
    """Submit node analyses; collect (key, outcome-or-exception) pairs as they finish."""

    capacity: int = 1

    def __init__(self) -> None:
        self._done: queue.Queue = queue.Queue()
        self._futures: dict[Any, Any] = {}
        self._where: dict[Any, int] = {}  # running key -> worker index
        self._kept: dict[Any, int] = {}  # key -> the worker holding its kept tree
        # Bumped by `rebind`: a result of an earlier problem's analysis that reports late (a worker
        # replaced mid-analysis) is dropped, never taken for the new engine's node of the same key.
        self._generation = 0

    def _watch(self, key: Any, future: Any, worker: int = 0) -> None:
        self._futures[key] = future
        self._where[key] = worker
        if self._kept.get(key, worker) != worker:
            del self._kept[key]  # continued elsewhere from scratch; that worker's copy is stale
        generation = self._generation
        future.add_done_callback(lambda f, key=key: self._done.put((generation, key, f)))

    def submit(
        self,
        key: Any,
        cls: int,
        positions: np.ndarray,
        time_limit: float | None,
        cutoff: float,
        attempt: int = 1,
        threads: int = 1,
        split_only: bool = False,
    ) -> None:
        """`threads`: solver threads for this node (the engine gives > 1 only to the last work);
        `split_only`: a singleton's split gets the whole limit, and no MILP runs (`NodeRequest`)."""
        raise NotImplementedError

    def _idle_workers(self) -> set[int]:
        return set(range(self.capacity)) - set(self._where.values())

    def continuable(self) -> list[Any]:
        """Keys whose kept solver tree sits on a worker that is idle now (see `lucid.analysis.kept_trees`)."""
        idle = self._idle_workers()
        return [k for k, w in self._kept.items() if w in idle and k not in self._where]

    def completed(self, timeout: float) -> list[tuple[Any, Any]]:
        """Results finished so far, waiting up to `timeout` seconds for the first one."""
        out: list[tuple[Any, Any]] = []
        try:
            item = self._done.get(timeout=timeout)
        except queue.Empty:
            return out
        while True:
            generation, key, future = item
            if generation != self._generation:
                try:
                    item = self._done.get_nowait()
                except queue.Empty:
                    return out
                continue
            self._futures.pop(key, None)
            worker = self._where.pop(key, 0)
            try:
                outcome = future.result()
                if (getattr(outcome, "stats", None) or {}).get("kept"):
                    self._kept[key] = worker
                else:
                    self._kept.pop(key, None)
                out.append((key, outcome))
            except BaseException as exc:  # noqa: BLE001 (reported to the engine, which decides)
                self._kept.pop(key, None)
                out.append((key, exc))
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                return out

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def rebind(self, problem: Any, grace: float | None = None) -> None:
        """Analyse `problem` from now on (a --regions run's next box). The analyses still running
        answer another box's question, and a new engine reuses the same node keys: their results
        and kept trees are dropped. They get `grace` seconds to end (None: as long as they take);
        then the workers running them are replaced (`_replace_busy_workers`)."""
        futures = list(self._futures.values())
        _, running = cf.wait(futures, timeout=grace)
        if running:
            self._replace_busy_workers({self._where[k] for k, f in self._futures.items() if f in running})
        while True:
            try:
                self._done.get_nowait()
            except queue.Empty:
                break
        self._generation += 1
        self._futures.clear()
        self._where.clear()
        self._kept.clear()
        self._rebind_workers(problem)

    def _replace_busy_workers(self, workers: set[int]) -> None:
        """Stop the given workers' analyses (the in-process executor cannot: it waits for them)."""
        cf.wait(list(self._futures.values()))

    def _rebind_workers(self, problem: Any) -> None:
        """Give the workers the new problem (the in-process executor reads it from its caller)."""

    def close(self) -> None:
        pass


class ThreadExecutor(Executor):
    """Runs `analyse` in threads of this process (one worker, tests, or a custom analyser)."""

    def __init__(self, analyse: AnalyseFn, workers: int = 1) -> None:
        super().__init__()
        self.capacity = workers
        self._analyse = analyse
        self._takes_threads = _accepts(analyse, "threads")  # custom analysers take five arguments
        self._takes_split_only = _accepts(analyse, "split_only")
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lucid-node")

    def _idle_workers(self) -> set[int]:
        # threads of one process share its kept trees: every slot can continue any of them
        return {0} if self.in_flight < self.capacity else set()

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1, threads=1, split_only=False):
        extra: dict[str, Any] = {"threads": threads} if threads > 1 and self._takes_threads else {}
        if split_only and self._takes_split_only:
            extra["split_only"] = True
        self._watch(key, self._pool.submit(self._analyse, cls, positions, time_limit, cutoff, attempt, **extra))

    def _rebind_workers(self, problem: Any) -> None:
        KEPT.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

        KEPT.clear()


class InProcessExecutor(ThreadExecutor):
    """`lucid verify --workers 1`: one thread of this process analyses `problem` with `settings`;
    `rebind` swaps the problem, as it does in the worker processes."""

    def __init__(self, problem: Any, settings: VerifySettings) -> None:
        self._problem = problem
        super().__init__(lambda *args, **kw: analyse_with(self._problem, settings, *args, **kw), 1)

    def _rebind_workers(self, problem: Any) -> None:
        super()._rebind_workers(problem)
        self._problem = problem


def local_executor(problem: Any, settings: VerifySettings) -> Executor:
    """The executor of a verification on this machine: in this process with one worker, else one
    process per worker (`settings.workers`)."""
    if settings.workers == 1:
        return InProcessExecutor(problem, settings)
    return ProcessExecutor(problem, settings, settings.workers)


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# --- process pool ------------------------------------------------------------------------------
_WORKER_STATE: dict = {}


def _init_worker(problem: Any, settings: VerifySettings, driver_pid: int | None = None) -> None:
    # Ctrl-C is handled by the driver (it checkpoints and stops the pool); workers must not print
    # their own KeyboardInterrupt tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    # One core per worker: the node's symbolic bounds would otherwise start a torch thread per
    # core in every worker, on top of the other workers' solvers.
    torch.set_num_threads(1)
    if driver_pid is not None:
        _die_with(driver_pid)
    _WORKER_STATE["problem"] = problem
    _WORKER_STATE["settings"] = settings


def _die_with(driver_pid: int) -> None:
    """End this worker when the driver dies without stopping the pool (SIGKILL, a crash).

    Otherwise the worker finishes its MILP and any queued ones for nobody (seen: two orphans at
    full load for an hour after their driver was killed, halving the next run's speed). Linux
    kills it with the driver (PR_SET_PDEATHSIG); elsewhere a daemon thread polls the parent pid."""

    if sys.platform.startswith("linux"):
        try:
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


def analyse_with(
    problem: Any,
    settings: VerifySettings,
    cls: int,
    positions: np.ndarray,
    time_limit: float | None,
    cutoff: float = -float("inf"),
    attempt: int = 1,
    threads: int = 1,
    split_only: bool = False,
):
    """One node analysis (runs in a worker), all of it within `time_limit` seconds: a small node
    keeps a reserve of them for the targeted search after its MILP (`targeted_search_reserve`)."""
    from lucid.analysis.analyse import NodeRequest, analyse_node
    from lucid.analysis.outcome import SEARCH_MAX_NETWORKS, wants_targeted_search, with_targeted_search
    from lucid.analysis.time_shares import targeted_search_reserve

    end = None if time_limit is None else time.monotonic() + time_limit
    targeted = settings.targeted_search and len(positions) <= SEARCH_MAX_NETWORKS
    limit = time_limit - targeted_search_reserve(time_limit) if targeted and time_limit is not None else time_limit
    outcome = analyse_node(
        problem,
        cls,
        positions,
        settings=settings,
        solver_options=settings.solver_options(limit, threads),
        request=NodeRequest(cutoff, attempt, settings.keep_trees, split_only),
    )
    if targeted and wants_targeted_search(outcome, positions):
        outcome = with_targeted_search(problem, cls, positions, outcome, deadline=end)
    return outcome


def _rebind_worker(problem: Any) -> None:
    _WORKER_STATE["problem"] = problem
    KEPT.clear()  # the trees of the last problem can never be continued


def _analyse_in_process(
    cls: int,
    positions: np.ndarray,
    time_limit: float | None,
    cutoff: float,
    attempt: int,
    threads: int = 1,
    split_only: bool = False,
):
    return analyse_with(
        _WORKER_STATE["problem"],
        _WORKER_STATE["settings"],
        cls,
        positions,
        time_limit,
        cutoff,
        attempt,
        threads,
        split_only,
    )


class ProcessExecutor(Executor):
    """One single-process pool per worker, so that a task can be sent to the worker holding its
    kept tree (a shared pool hands tasks to whichever process is free)."""

    def __init__(self, problem: Any, settings: VerifySettings, workers: int) -> None:
        super().__init__()
        self.capacity = workers
        self._settings = settings
        self._pools = [self._new_pool(problem) for _ in range(workers)]

    def _new_pool(self, problem: Any) -> cf.ProcessPoolExecutor:
        # spawn, not fork: the driver runs threads (rich display, pool feeders) that fork would copy
        # in an arbitrary state.
        return cf.ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(problem, self._settings, os.getpid()),
        )

    def _replace_busy_workers(self, workers: set[int]) -> None:
        for w in workers:  # the problem is set again by _rebind_workers right after
            _stop_pool(self._pools[w])
            self._pools[w] = self._new_pool(None)

    def submit(self, key, cls, positions, time_limit, cutoff, attempt=1, threads=1, split_only=False):
        idle = self._idle_workers()
        home = self._kept.get(key)
        if home in idle:
            worker = home
        elif idle:
            worker = min(idle)
        else:  # the engine submits only below capacity; should that change, queue on the least loaded
            worker = min(range(self.capacity), key=list(self._where.values()).count)
        future = self._pools[worker].submit(
            _analyse_in_process, cls, positions, time_limit, cutoff, attempt, threads, split_only
        )
        self._watch(key, future, worker)

    def _rebind_workers(self, problem: Any) -> None:
        for future in [pool.submit(_rebind_worker, problem) for pool in self._pools]:
            future.result()

    def close(self) -> None:
        # Running MILPs cannot be cancelled through the pool API; their time limits are capped by
        # the remaining total time, but a stop (time limit reached, gap closed) should not wait.
        for pool in self._pools:
            _stop_pool(pool)


def _stop_pool(pool: cf.ProcessPoolExecutor) -> None:
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        with contextlib.suppress(Exception):  # a process that has ended meanwhile
            p.terminate()
