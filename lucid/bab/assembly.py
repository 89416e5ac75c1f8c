"""`assemble_engine`: the one place that builds an `Engine` and its hooks from a problem.

The plain strategy (lucid/verify/plain.py) builds one over the whole domain, a region box
(lucid/regions/one_box.py) one over its box: both get the same screen, refinement, class-level
leak search, per-network leaks (with `--residual`) and live display, from the settings.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

# Engine and the class-level witness search are looked up through their modules at call time, so a
# test or a benchmark can substitute them.
import lucid.bab.engine as bab_engine
import lucid.witness.search as witness_search
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen
from lucid.bab.events import EventLog
from lucid.bab.hooks import EngineHooks
from lucid.bab.partition import FlatParameters
from lucid.bab.screening import ScreenFn
from lucid.bab.state import ClassState
from lucid.bab.workers import Executor
from lucid.deadline import Deadline, Phases
from lucid.settings import VerifySettings
from lucid.witness.network_leaks import NetworkLeaks


def screen_of(problem: VerificationProblem, settings: VerifySettings, classes: list[int]) -> Screen | None:
    """The per-network screen the settings ask for (None with `--screen none`)."""
    return None if settings.screen == "none" else Screen(problem, settings.screen, settings.device, classes)


def assemble_engine(
    problem: VerificationProblem,
    settings: VerifySettings,
    executor: Executor,
    classes: list[int],
    *,
    screen: Screen | None,
    on_progress: Callable[[Any], None],
    initial: ScreenFn | None = None,
    on_checkpoint: Callable[[Any], None] | None = None,
    choose_size: Callable[[Any], int] | None = None,
    log: EventLog | None = None,
    states: dict[int, ClassState] | None = None,
    deadline: Deadline | None = None,
    phases: Phases | None = None,
) -> bab_engine.Engine:
    """The engine of `classes` over `problem` on `executor`. `initial`: the screen's first bounds
    (default: `screen.initial`; a region box takes the smaller of its own and its ancestors')."""
    search = partial(witness_search.search_class_witness, problem, points=problem.points) if settings.search else None
    if screen is not None and initial is None:
        initial = screen.initial
    hooks = EngineHooks(
        screen=initial if screen is not None else None,
        refine=screen.refine if screen is not None and screen.refines else None,
        search=search,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        leaks=NetworkLeaks.of(problem) if settings.residual else None,
        choose_size=choose_size,
    )
    return bab_engine.Engine(
        executor,
        classes,
        len(problem.stack),
        settings,
        params=FlatParameters(problem.stack),
        hooks=hooks,
        log=log,
        states=states,
        deadline=deadline,
        phases=phases,
    )
