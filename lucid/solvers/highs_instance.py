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

    global _banner_done
    with _lock:
        if _banner_done:
            h = highspy.Highs()
        else:
            sys.stdout.flush()
            saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                h = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                os.close(devnull)
            _banner_done = True
    h.setOptionValue("output_flag", bool(output))
    return h
