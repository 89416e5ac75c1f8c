"""The one place a `highspy.Highs` is made: silent from the start.

HiGHS prints a two-line banner on the C-level stdout when the first instance of a process is
constructed, before any option can switch output off. In `lucid verify` that lands once per worker
process in the middle of the progress display and in any pipe reading the command's stdout, so the
first construction runs with file descriptor 1 pointed at /dev/null. (Later instances print
nothing until they solve, and every instance gets output_flag off unless asked for output.)
"""

from __future__ import annotations

import os
import sys
import threading

_lock = threading.Lock()
_banner_done = False


def new_highs(output: bool = False):
    """A fresh `highspy.Highs` that has printed nothing (and prints only with `output`)."""
    import highspy

    global _banner_done  # noqa: PLW0603 (HiGHS prints its banner once per process)
    with _lock:
        if _banner_done:
            h = highspy.Highs()
        else:
            h = _constructed_silently(highspy)
            _banner_done = True
    h.setOptionValue("output_flag", bool(output))
    return h


def _constructed_silently(highspy):
    """The first instance, made with fd 1 pointed at /dev/null (made plainly where fd 1 cannot be
    redirected, e.g. a process started with stdout closed: then there is nobody to disturb)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        return highspy.Highs()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
