"""The strategy of `--hyper agt:K`: per class one MILP over the run's AGT box for K removals.

Its bounds.json entries carry `"removals": K`; its log has started, class_started, witness, solved,
anytime, class_done and finished. One class per step; there is no branch-and-bound, so no
checkpoint either: `VerifySettings` refuses --resume in this mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

# analyse_parameter_box is looked up through its module at call time, so a test can substitute it.
import lucid.analysis.agt_box as box_analysis
from lucid.analysis.scaling import rescale_hyper
from lucid.analysis.time_shares import parameter_box_class_time_limit
from lucid.dynamic_range import check_dynamic_range
from lucid.errors import LucidError
from lucid.rundir import bound_entry
from lucid.solvers.base import ERROR, INFEASIBLE, OPTIMAL, TIME_LIMIT
from lucid.verify.lifecycle import Checkpoint, VerificationRun, Verified
from lucid.witness.search import search_class_witness

REASONS = {
    OPTIMAL: "proved: one MILP over the AGT box",
    INFEASIBLE: "proved: one MILP over the AGT box",
    TIME_LIMIT: "time limit: the solver's proved dual bound",
    ERROR: "no consistent solver result: nothing proved",
}


def load_parameter_box(run: Any, k: int) -> Any:
    """Box k of the run; one error line (naming the run and the stored ks) before any work."""
    from lucid.agt.store import AGT_FILE, load_boxes  # imports torch: only for a box verification

    if not (Path(run.path) / AGT_FILE).exists():
        raise LucidError(
            f"--hyper agt:{k}: {run.path} has no AGT boxes ({AGT_FILE} is missing; "
            f"train the run with `lucid train ... --agt {k}`)"
        )
    boxes = load_boxes(run.path)
    if k not in boxes:
        stored = ", ".join(str(s) for s in sorted(boxes)) or "none"
        raise LucidError(
            f"--hyper agt:{k}: {run.path} stores AGT boxes for k = {stored} only (train it with `--agt {k}` or more)"
        )
    return boxes[k]


class ParameterBoxMilp:
    """The strategy of `--hyper agt:K`: per class one MILP over the run's parameter box for K removed rows."""

    def prepare(self, run: VerificationRun, saved: dict | None) -> dict[str, Any]:
        from lucid.agt.store import box_hyper_network  # imports torch: only for a box verification

        self.run = run
        k = self.k = run.settings.removals
        box = load_parameter_box(run.run, k)
        self.problem = problem = run.load_problem(needs_networks=False)
        self.loo = loo = np.arange(1, len(problem.stack), dtype=np.int64)  # every N_-i lies in every box with k >= 1
        hyper = box_hyper_network(box, loo, input_dim=run.run.input_dim)
        where = f"--hyper agt:{k} on {run.path}"
        check_dynamic_range(hyper, problem.lower, problem.upper, f"{where}: the box")
        self.hyper = rescale_hyper(hyper, problem.neuron_scales)  # into the units of the problem's networks (exact)
        box_analysis.check_parameter_box_holds_networks(problem, self.hyper, where)
        self.threads = run.settings.workers or 1
        self.todo = list(run.classes)
        self.entries: dict[str, dict] = {}
        return {"workers": self.threads, "networks": len(loo), "removals": k}

    def step(self) -> bool:
        run, settings, problem, loo, k = self.run, self.run.settings, self.problem, self.loo, self.k
        log = run.event_log()
        if not self.todo:
            return False
        c = self.todo.pop(0)
        log.emit("class_started", c, networks=len(loo), removals=k)
        t_class = time.monotonic()
        known = (
            search_class_witness(problem, c, loo, points=problem.points, deadline=run.deadline.end)
            if settings.search and loo.size
            else None
        )
        if known is not None:
            log.emit("witness", c, lower=known.confidence, leaking_row=known.leaking_row, source="search")
        limit = parameter_box_class_time_limit(settings.node_time_limit, run.deadline.left(), len(self.todo) + 1)
        options = settings.solver_options(limit, self.threads)
        out = box_analysis.analyse_parameter_box(
            problem, c, self.hyper, settings, options, loo_positions=loo, known=known
        )
        complete = out.status in (OPTIMAL, INFEASIBLE)
        reason = REASONS.get(out.status, out.status)
        # the events `lucid log` reads: the one node, the class's bounds, its end
        log.emit(
            "solved",
            c,
            node=0,
            parent=None,
            size=len(loo),
            upper=out.upper,
            lower=out.lower,
            status=out.status,
            seconds=out.seconds,
            leaking_row=out.leaking_row,
            stats=out.stats,
        )
        log.emit("anytime", c, upper=out.upper, lower=out.lower, open=0, solved=1)
        log.emit(
            "class_done",
            c,
            upper=out.upper,
            lower=out.lower,
            complete=complete,
            reason=reason,
            within_gap=False,
            solved=1,
            open=0,
        )
        self.entries[str(c)] = bound_entry(
            out.upper,
            out.lower,
            complete=complete,
            exact=complete,
            seconds=time.monotonic() - t_class,
            nodes=1,
            reason=reason,
            leaking_row=out.leaking_row,
            removals=k,  # the bound holds for every data set within k removed rows of D
        )
        return bool(self.todo)

    def checkpoint(self) -> Checkpoint | None:
        return None  # one MILP per class: nothing to resume within a class

    def close(self) -> None:
        pass

    def result(self) -> Verified:
        return Verified(self.entries)
