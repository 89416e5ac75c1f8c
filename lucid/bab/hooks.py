"""`EngineHooks`: what the branch-and-bound engine calls besides its executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lucid.bab.screening import RefineFn, ScreenFn


@dataclass(frozen=True)
class EngineHooks:
    """The sources of per-network bounds and leaks (`screen`, `refine`, and `search`: (cls,
    positions, deadline=...) -> a leak or None) and the observers of the engine's progress and of
    the moments at which a checkpoint is consistent (`on_checkpoint`), each called with the engine."""

    screen: ScreenFn | None = None
    refine: RefineFn | None = None
    search: Callable[..., Any] | None = None
    on_progress: Callable[[Any], None] | None = None
    on_checkpoint: Callable[[Any], None] | None = None
