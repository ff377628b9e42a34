"""A progress reporter for tests: records every bar a stage opens (description, total) and how far it advanced."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from infra.stage import ProgressReporter


@dataclass
class Bar:
    description: str
    total: int | None
    done: int = 0
    closed: bool = False
    doing: list[str] = field(default_factory=list)  # every note the stage gave, in order

    @property
    def finished(self) -> bool:
        """Closed, and at its total (when it has one)."""
        return self.closed and (self.total is None or self.done == self.total)


class RecordingProgress(ProgressReporter):
    """Keeps each bar in ``bars`` in the order opened; ``said`` holds the lines passed to ``say``."""

    def __init__(self) -> None:
        self.bars: list[Bar] = []
        self.said: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        bar = Bar(description, total)
        self.bars.append(bar)

        def advance(n: int = 1, doing: str | None = None) -> None:
            assert not bar.closed, f"{description}: advanced after it closed"
            bar.done += n
            if doing is not None:
                bar.doing.append(doing)

        try:
            yield advance
        finally:
            bar.closed = True

    def bar(self, prefix: str) -> Bar:
        """The one bar whose description starts with ``prefix``."""
        found = [b for b in self.bars if b.description.startswith(prefix)]
        assert len(found) == 1, f"{prefix!r}: bars {[b.description for b in self.bars]}"
        return found[0]
