"""`verify_run`: one verification of a run directory, from its settings to RUN/bounds.json.

It reads the settings and the run, picks the strategy (plain branch-and-bound, `lucid.verify.plain`;
one MILP per class over an AGT box, `lucid.verify.parameter_box`; region-wise bounds,
`lucid.verify.regions`) and hands it to the run's lifecycle (`lucid.verify.lifecycle`), which drives
it and writes RUN/bounds.json (lucid-bounds/1), the residual sets (lucid/residual.py),
RUN/verify.log.jsonl (lucid.bab.events) and the resume checkpoint (lucid.verify.checkpoint).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lucid.deadline import Deadline
from lucid.option_fields import settings_with_options
from lucid.rundir import open_run
from lucid.settings import VerifySettings
from lucid.verify.lifecycle import Strategy, VerificationRun
from lucid.verify.parameter_box import ParameterBoxMilp
from lucid.verify.plain import BranchAndBound
from lucid.verify.regions import RegionRefinement


def verify_run(run_dir: str | Path, settings: VerifySettings | None = None, **options: Any) -> dict:
    """Compute per-class iDP decision bounds of a run; writes and returns the bounds.json content.
    With `hyper="agt:K"` the bounds hold for every data set within K removed rows
    (`lucid.verify.parameter_box`).

    Options are a `VerifySettings` or its fields as keywords (`verify_run(run, time_limit=180)`).
    --time-limit counts the whole invocation: reading the networks, N's bounds and screens too."""
    started = time.monotonic()
    if settings is None:
        settings = VerifySettings.from_options(**options)
    elif options:
        settings = settings_with_options(settings, "verify", options)
    deadline = Deadline(settings.time_limit, started)
    run = open_run(run_dir)
    return VerificationRun(run, settings, deadline).execute(strategy_of(settings))


def strategy_of(settings: VerifySettings) -> Strategy:
    """The strategy the settings ask for."""
    if settings.removals:  # --hyper agt:K: one MILP per class over the AGT box, no branch-and-bound
        return ParameterBoxMilp()
    if settings.regions > 1:  # per-box bounds
        return RegionRefinement()
    return BranchAndBound()
