"""A rich progress bar counting trained networks (fractional within a chunk) with an ETA."""

from __future__ import annotations

from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainingProgress:
    def __init__(self, total: int, enabled: bool = True, description: str = "training") -> None:
        self.enabled = enabled
        self.total = total
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._description = description

    def __enter__(self) -> Self:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[done]}/{task.total:.0f} networks"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self._description, total=self.total, done=0)
        return self

    def advance(self, networks: float) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[0]
            completed = min(task.completed + networks, self.total)
            self._progress.update(self._task, completed=completed, done=int(completed + 1e-6))

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
