"""Rich progress bars for long stages (one bar per unit of work: sources, proxies, trials, steps)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infra.stage import ProgressReporter


class RichProgress(ProgressReporter):
    """A ``rich`` display usable as a context manager around the whole pipeline."""

    def __init__(self, disable: bool = False):
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), disable=disable, transient=False)

    def __enter__(self) -> "RichProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.stop()

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        task_id = self._bars.add_task(description, total=total)
        try:
            yield lambda advance=1: self._bars.advance(task_id, advance)
        finally:
            if total is None:
                self._bars.update(task_id, total=1, completed=1)
