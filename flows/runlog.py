"""The log file of one ``pretrain run``: ``<runs>/logs/run-<UTC time>-<pid>.log``.

The terminal keeps progress, the summary and one ``error:`` line per failure; tracebacks and the output of the
local Prefect API server go to this file. ``capture`` attaches it to Python logging after Prefect has configured
logging (Prefect replaces the root logger's handlers when it is imported): every record reaches the file with its
traceback, the terminal's handlers show a record's message without it, and the records Prefect writes about the
failed run itself, and every record that says a disk is full, are left to the ``error:`` line the command prints.
Other libraries' records (Prefect's, Great Expectations', Optuna's trial lines, transformers') reach the file only,
unless the run is ``--verbose``: the terminal is the platform's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from infra.runs import RunsLayout, ensure_folder

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_log_path(layout: RunsLayout, kind: str = "run") -> Path:
    """The log file of this process's run, or of another ``kind`` of process (``serve``); not created."""
    return layout.logs / f"{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}.log"


class _WithoutTraceback(logging.Formatter):
    """Formats with ``inner``, leaving out the traceback and stack (the log file has them)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


class _RunFailureRecords(logging.Filter):
    """Drops, on the terminal, Prefect's records of a flow or task run that failed: the traceback record and the run's
    later ``Finished in state Failed(...)`` record, which repeats the message (matched by the run's id). The command
    prints the failure once, as its ``error:`` line.

    Also the records of a run that crashed: the ERROR ``Crash detected! Execution was aborted by an interrupt
    signal.`` (or ``... by a termination signal.``) that Prefect's engines log when a ``BaseException`` leaves the
    run (``handle_crash`` in ``prefect/flow_engine.py`` and ``prefect/task_engine.py``), and the ``Finished in state
    Crashed(...)`` after it. Prefect still marks the runs Crashed, and the records reach the run log; on the
    terminal, an interrupted run is reported by the command's ``interrupted`` line, any other crash by its
    ``error:`` line."""

    def __init__(self) -> None:
        super().__init__()
        self._failed_runs: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("prefect.task_runs", "prefect.flow_runs")):
            return True
        run = getattr(record, "task_run_id", None) or getattr(record, "flow_run_id", None)
        if record.exc_info:
            if run is not None:
                self._failed_runs.add(str(run))
            return False
        if record.getMessage().startswith(("Crash detected!", "Finished in state Crashed(")):
            return False
        if run is not None and str(run) in self._failed_runs and record.getMessage().startswith(
                "Finished in state Failed"):
            self._failed_runs.discard(str(run))
            return False
        return True


class _FullDiskRecords(logging.Filter):
    """Drops, on the terminal, the records that say a disk is full: Prefect's "Failed to write result: [Errno 28]
    No space left on device", MLflow's and SQLite's "database or disk is full", the platform's own notes that
    recording a failure failed too. A full disk ends the run with one ``error:`` line that names it (a
    ``DiskFullError``); these records go to the run log (when it still has room)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from infra.artifacts import full_disk_exception, says_disk_full

        try:
            if says_disk_full(record.getMessage()):
                return False
        except Exception:  # a record whose arguments do not format: logging reports that itself
            return True
        error = record.exc_info[1] if record.exc_info else None
        return error is None or full_disk_exception(error) is None


class _RunLogHandler(logging.FileHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        """Drop a record that cannot be written: on a full disk, logging's default would print a traceback per
        record on the terminal."""


def _terminal_handlers(logger: logging.Logger) -> list[logging.Handler]:
    # Stream handlers other than files: Prefect's console handler, MLflow's (it wraps stderr in a stream of its own).
    return [h for h in logger.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


# The platform's own loggers (``getLogger(__name__)`` in its packages, and "pretrain"): their records reach the
# terminal; every other library's go to the run log only, unless the run is verbose.
PLATFORM_LOGGERS = ("pretrain", "flows", "tasks", "infra", "evals", "models")
# Python warnings of the platform's own categories are the user's to act on; other libraries' go to the log.
_PLATFORM_WARNINGS = ("ConfigWarning",)


class _PlatformOnly(logging.Filter):
    """Passes, on the terminal, the platform's records only (``PLATFORM_LOGGERS``, and Python warnings of its own
    categories); the run log keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "py.warnings":
            try:
                return any(kind in record.getMessage() for kind in _PLATFORM_WARNINGS)
            except Exception:
                return True
        return name.split(".", 1)[0] in PLATFORM_LOGGERS


class _Capture:
    """What ``capture`` installed, so that ``adopt_library_loggers`` can extend it to loggers made later."""

    def __init__(self, to_file: logging.Handler, verbose: bool):
        self.to_file = to_file
        self.filters: list[logging.Filter] = [_RunFailureRecords(), _FullDiskRecords()]
        if not verbose:
            self.filters.append(_PlatformOnly())
        self.handlers: dict[logging.Handler, logging.Formatter | None] = {}  # adopted → its formatter before
        self.loggers: list[logging.Logger] = []
        self.excepthook = threading.excepthook

    def adopt(self, logger: logging.Logger) -> None:
        for handler in _terminal_handlers(logger):
            if handler not in self.handlers:
                self.handlers[handler] = handler.formatter
            if not isinstance(handler.formatter, _WithoutTraceback):
                handler.setFormatter(_WithoutTraceback(handler.formatter))
            for each in self.filters:
                if each not in handler.filters:
                    handler.addFilter(each)
        if self.to_file not in logger.handlers:
            logger.addHandler(self.to_file)
            self.loggers.append(logger)

    def release(self) -> None:
        for handler, formatter in self.handlers.items():
            for each in self.filters:
                handler.removeFilter(each)
            handler.setFormatter(formatter)
        for logger in self.loggers:
            logger.removeHandler(self.to_file)
        self.to_file.close()
        logging.captureWarnings(False)
        threading.excepthook = self.excepthook


_active: _Capture | None = None


def _own_handler_loggers() -> list[logging.Logger]:
    """The root logger and every logger that does not propagate and has handlers of its own (Prefect's console,
    MLflow's, Optuna's and transformers' default handlers)."""
    return [logging.getLogger()] + [
        logger for logger in list(logging.Logger.manager.loggerDict.values())
        if isinstance(logger, logging.Logger) and not logger.propagate and logger.handlers]


def _route_library_defaults(bars: bool) -> None:
    """Libraries that print through a handler of their own by default send their records through logging instead
    (Optuna's per-trial lines; transformers' warnings). Unless ``bars``, transformers and huggingface_hub draw no
    tqdm bars (``HF_HUB_DISABLE_PROGRESS_BARS``, unless the user exported it): the run's own bars and lines are the
    progress."""
    if not bars:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import optuna

        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
    except ImportError:
        pass
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
        if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "") not in ("", "0", "false", "False"):
            hf_logging.disable_progress_bar()
    except ImportError:
        pass


def quiet_library_bars() -> None:
    """No tqdm bars from transformers and huggingface_hub (``Loading weights``, ``Writing model shards``) for a
    command that prints its own result and has no run log to send them to (``pretrain export``)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def adopt_library_loggers() -> None:
    """Extend ``capture`` to the loggers made since (a library imported by a stage): their records reach the run log
    and, unless verbose, not the terminal. A no-op before ``capture``."""
    if _active is not None:
        for logger in _own_handler_loggers():
            _active.adopt(logger)


def release() -> None:
    """Undo ``capture`` (handlers, filters, warnings, the thread hook): for a process that goes on after its run."""
    global _active
    if _active is not None:
        _active.release()
        _active = None


def capture(path: Path, verbose: bool = False) -> Path:
    """Send logging to the file ``path`` (created with its folder) and keep tracebacks off the terminal: see the
    module's docstring. Unless ``verbose``, the terminal shows only the platform's records (``PLATFORM_LOGGERS``);
    other libraries' records, Python warnings and transformers' progress bars go to the file. Uncaught exceptions of
    threads are logged too. Returns ``path``.

    Raises:
        RunsFolderError: a file is in the way of the log's folder.
        OSError: the file cannot be opened.
    """
    global _active
    release()
    ensure_folder(path.parent)
    to_file = _RunLogHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(_FORMAT))
    _active = _Capture(to_file, verbose)
    logging.captureWarnings(True)  # warnings to the file; on the terminal the platform's own (or all, verbose)
    _route_library_defaults(bars=verbose)
    adopt_library_loggers()

    def log_thread_exception(args: threading.ExceptHookArgs) -> None:
        logging.getLogger("pretrain").error("uncaught exception in thread %s",
                                            args.thread.name if args.thread else "?",
                                            exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    threading.excepthook = log_thread_exception
    return path


@contextlib.contextmanager
def captured_unless_active(layout: RunsLayout) -> Iterator[Path | None]:
    """``capture`` to a new run log of ``layout`` for the block, unless this process captures already (``pretrain
    run`` does before it calls the flow): a flow run that a served deployment starts in a process of its own gets
    its run log and a quiet terminal too. Yields the log's path, or None when the capture was already there."""
    if _active is not None:
        yield None
        return
    path = capture(run_log_path(layout))
    try:
        yield path
    finally:
        release()


def write_traceback(path: Path, err: BaseException) -> bool:
    """Append ``err``'s traceback (its causes and contexts too) to the log file ``path``; False when it cannot be
    written (the caller then has nowhere else but the terminal)."""
    try:
        ensure_folder(path.parent)
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} the command failed:\n")
            traceback.print_exception(err, file=out)
    except Exception:
        return False
    return True
