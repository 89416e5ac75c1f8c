"""`EngineHooks`: what the branch-and-bound engine calls besides its executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lucid.bab.screening import RefineFn, ScreenFn
from lucid.bab.state import ClassState
from lucid.witness.network_leaks import NetworkLeaks


@dataclass(frozen=True)
class EngineHooks:
    """The sources of per-network bounds and leaks (`screen`, `refine`, and `search`: (cls,
    positions, deadline=...) -> a leak or None) and the observers of the engine's progress and of
    the moments at which a checkpoint is consistent (`on_checkpoint`), each called with the engine.
    `leaks`: every network's own leaks, which `--residual M` needs (lucid/bab/order_statistic.py);
    `choose_size`: with `--residual auto`, called with the class states after each improvement,
    returns the M every class uses from then on (lucid/residual_choice.py)."""

    screen: ScreenFn | None = None
    refine: RefineFn | None = None
    search: Callable[..., Any] | None = None
    on_progress: Callable[[Any], None] | None = None
    on_checkpoint: Callable[[Any], None] | None = None
    leaks: NetworkLeaks | None = None
    choose_size: Callable[[dict[int, ClassState]], int] | None = None
