"""What a run shows while it works: progress bars in a terminal, plain timed lines anywhere else.

``make_progress()`` picks by the output. In a terminal, ``RichProgress`` draws one bar per unit of work (sources,
proxies, trials, steps) with its elapsed time and, once a unit is done, its ETA. Anywhere else (a file, ``nohup``, CI, a Prefect worker's log), bars would be drawn once, at
the end, so ``PlainProgress`` prints lines instead: when a bar starts and ends, a progress line (done/total, rate,
ETA) at most every ``interval_s`` per bar, and, when nothing was printed for ``interval_s``, a line saying what is
still running. Both print the pipeline's stage lines (``say``).

A stage may say what a bar is busy with (``advance(0, doing="reading handbook_en")``): before the first unit is done
there is no rate to estimate from, and the line says instead what runs (``sources: reading: 0/5 (reading
handbook_en, 43s)``); a bar with no unit done and no such note says that its first unit is under way.

``PRETRAIN_PROGRESS`` = ``bars`` | ``lines`` overrides the choice; ``PRETRAIN_PROGRESS_INTERVAL_S`` sets the
interval of plain lines (default 30 s; a log then has a platform line at least every 30 s while a run works).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from infra.errors import ConfigError
from infra.stage import ProgressReporter

MODE_ENV = "PRETRAIN_PROGRESS"
INTERVAL_ENV = "PRETRAIN_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 30.0


class _StatusColumn(ProgressColumn):
    """What a bar is busy with (its ``doing`` note), and its ETA once a unit is done (the mean rate so far: units
    of a stage take similar times, and rich's own estimate needs two updates within 30 s)."""

    def render(self, task: Task) -> Text:
        doing = task.fields.get("doing") or ""
        eta = ""
        if task.completed and task.total and not task.finished and task.elapsed:
            eta = f"ETA {duration(task.elapsed / task.completed * (task.total - task.completed))}"
        return Text(" ".join(part for part in (eta, doing) if part), style="progress.remaining")


class RichProgress(ProgressReporter):
    """A ``rich`` display usable as a context manager around the whole pipeline."""

    def __init__(self, disable: bool = False, clock: Callable[[], float] = time.monotonic):
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), _StatusColumn(), disable=disable, transient=False, get_time=clock)

    def __enter__(self) -> "RichProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.stop()

    def say(self, line: str) -> None:
        """Print ``line`` above the bars."""
        self._bars.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def activity(self, what: str | None) -> None:
        """The bars show what runs; nothing to do."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        task_id = self._bars.add_task(description, total=total, doing="")

        def advance(n: int = 1, doing: str | None = None) -> None:
            if doing is not None:
                self._bars.update(task_id, doing=doing)
            if n:
                self._bars.advance(task_id, n)

        try:
            yield advance
        finally:
            self._bars.update(task_id, doing="")
            if total is None:
                self._bars.update(task_id, total=1, completed=1)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class _Bar:
    description: str
    total: int | None
    started: float
    done: int = 0
    printed: float = 0.0  # when its last line was printed
    doing: str = ""  # what it is busy with, as the stage said

    def line(self, now: float) -> str:
        elapsed = now - self.started
        count = f"{self.done} done" if self.total is None else f"{self.done}/{self.total}"
        if not self.done:  # no rate yet to give an ETA from: say what runs instead
            what = self.doing or ("under way" if self.total is None else "the first under way")
            return f"{self.description}: {count} ({what}, {duration(elapsed)})"
        text = f"{self.description}: {count}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {duration(elapsed)}"
        if elapsed > 0:
            rate = self.done / elapsed
            text += f", {rate:.3g}/s" if rate >= 1 else f", {1 / rate:.3g} s each"
            if self.total is not None and self.total > self.done:
                text += f", ETA {duration((self.total - self.done) / rate)}"
        return text + (f"; {self.doing}" if self.doing else "")


class PlainProgress(ProgressReporter):
    """Plain progress lines for output that is not a terminal (see the module's docstring).

    Args:
        stream: where lines go (flushed after each).
        interval_s: the longest stretch without a line while a bar or a stage is active, and the least time between
            two progress lines of one bar.
        clock: monotonic seconds (tests pass a fake one).
        heartbeat: run the thread that prints "still running" lines (tests drive ``tick`` by hand instead).
    """

    def __init__(self, stream: TextIO | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, heartbeat: bool = True):
        self._stream = stream
        self.interval_s = interval_s
        self._clock = clock
        self._heartbeat = heartbeat
        self._lock = threading.Lock()
        self._bars: list[_Bar] = []
        self._activity: tuple[str, float] | None = None  # (what, since): a stage running with no bar of its own
        self._last_line = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PlainProgress":
        self._last_line = self._clock()
        if self._heartbeat:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="progress-lines", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stdout  # looked up late: the CLI's output may be replaced after construction
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or a full disk: progress is never worth a failure
            pass
        self._last_line = self._clock()

    def say(self, line: str) -> None:
        """Print ``line`` now."""
        with self._lock:
            self._write(line)

    def activity(self, what: str | None) -> None:
        """What runs now without a bar of its own (a stage's name), named by the "still running" lines; None: idle."""
        with self._lock:
            self._activity = (what, self._clock()) if what else None

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        with self._lock:
            bar = _Bar(description, total, started=self._clock())
            bar.printed = bar.started
            self._bars.append(bar)
            self._write(f"{description}: started" + (f", {total} to do" if total is not None else ""))

        def advance(n: int = 1, doing: str | None = None) -> None:
            with self._lock:
                bar.done += n
                if doing is not None:
                    bar.doing = doing
                now = self._clock()
                if now - bar.printed >= self.interval_s:
                    bar.printed = now
                    self._write(bar.line(now))

        try:
            yield advance
        finally:
            with self._lock:
                self._bars.remove(bar)
                now = self._clock()
                if bar.total is not None:
                    count = f"{bar.done}/{bar.total} "
                else:
                    count = f"{bar.done} " if bar.done else ""
                self._write(f"{description}: {count}done in {duration(now - bar.started)}")

    def tick(self) -> None:
        """Print what is still running when nothing was printed for ``interval_s``: each active bar's line, else
        the current activity; nothing when idle."""
        with self._lock:
            now = self._clock()
            if now - self._last_line < self.interval_s:
                return
            if self._bars:
                for bar in self._bars:
                    bar.printed = now
                    self._write(bar.line(now))
            elif self._activity is not None:
                what, since = self._activity
                self._write(f"{what}: still running, {duration(now - since)}")

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s / 4)):
            self.tick()


def interval_from_env() -> float:
    """``PRETRAIN_PROGRESS_INTERVAL_S`` in seconds (default 30).

    Raises:
        ConfigError: not a number > 0.
    """
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(f"{INTERVAL_ENV}={raw!r}: give seconds > 0 between progress lines (default "
                          f"{DEFAULT_INTERVAL_S:g})")
    return value


def make_progress(stream: TextIO | None = None) -> RichProgress | PlainProgress:
    """Bars when ``stream`` (default stdout) is a terminal, plain lines otherwise; ``PRETRAIN_PROGRESS`` = ``bars``
    or ``lines`` forces one.

    Raises:
        ConfigError: ``PRETRAIN_PROGRESS`` or ``PRETRAIN_PROGRESS_INTERVAL_S`` holds something else.
    """
    mode = os.environ.get(MODE_ENV, "").strip().lower()
    if mode not in ("", "bars", "lines"):
        raise ConfigError(f"{MODE_ENV}={mode!r}: use 'bars' (a terminal's progress bars) or 'lines' (plain lines "
                          "for logs), or unset it to choose by the output")
    out = stream or sys.stdout
    if mode == "bars" or (not mode and _isatty(out)):
        return RichProgress()
    return PlainProgress(stream, interval_s=interval_from_env())


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
