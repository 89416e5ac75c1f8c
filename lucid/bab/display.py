"""Live per-class progress of a verification (rich): anytime [lower, upper], nodes, elapsed."""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from rich.live import Live


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    return f"{v:.5g}"


class LiveDisplay:
    def __init__(self, title: str, enabled: bool = True) -> None:
        self.enabled = enabled
        self._live: Live | None = None
        self._last = 0.0
        self.title = title
        self._engine = None

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            if self._engine is not None:
                self._live.update(render(self._engine, self.title))
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def update(self, engine: Any) -> None:
        if self._live is None:
            return
        self._engine = engine
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        self._live.update(render(engine, self.title))


def render(engine: Any, title: str):
    from rich.table import Table

    table = Table(title=f"{title}  elapsed {engine.elapsed():.1f}s", title_justify="left")
    for col in ("class", "lower", "upper", "open", "running", "solved", "state"):
        table.add_column(col, justify="right" if col != "state" else "left")
    for c, cs in engine.states.items():
        running = sum(1 for n in cs.nodes.values() if n.state == "running")
        state = (("done" if cs.complete else "stopped") + f" ({cs.reason})") if cs.done else "running"
        table.add_row(
            str(c), fmt(cs.lower), fmt(cs.upper), str(len(cs.nodes) - running), str(running), str(cs.solved), state
        )
    return table
