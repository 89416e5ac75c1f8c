"""Branch-and-bound over network sets: `lucid verify` (paper Algorithm 1, LUCID-Compute).

`verify_run` (lucid.bab.run) is the Python entry point; the CLI, the demo and the benchmarks call it.
"""

from lucid.bab.run import verify_run

__all__ = ["verify_run"]
