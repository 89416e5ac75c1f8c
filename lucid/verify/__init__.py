"""`lucid verify`: one verification of a run directory, from its settings to RUN/bounds.json.

`verify_run` (run.py) picks a strategy — the plain branch-and-bound (plain.py), one MILP per class
over an AGT parameter box (parameter_box.py), region-wise bounds (regions.py) — and the run's
lifecycle (lifecycle.py) drives it and owns the checkpoint (checkpoint.py), the log, signals, the
deadline and every file written. The engine they drive sits below, in `lucid.bab`.
"""

from lucid.verify.run import verify_run

__all__ = ["verify_run"]
