"""Racing threads in tests: start them together, wait for all, and surface what they raised."""

from __future__ import annotations

import threading
from typing import Callable


def run_threads(worker: Callable[[int], None], count: int) -> list[BaseException]:
    """Run worker(0) ... worker(count - 1) in threads started together; the exceptions they raised
    (an assertion in a thread would otherwise only be printed, and the test pass)."""
    errors: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            worker(t)
        except BaseException as exc:  # surfaced to the caller
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors
