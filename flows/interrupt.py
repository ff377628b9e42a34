"""What ``pretrain run`` says when it is stopped by Ctrl-C (SIGINT) or SIGTERM: one line on the terminal.

    interrupted (SIGINT) during stage corpus: the completed stages are kept (sources, quality_model) and corpus
    resumes from its last checkpoint; to resume, run the same command: pretrain run configs/demo.toml (log: ...)

The stage and the completed stages come from ``flows.pipeline.POSITION`` (when the pipeline got as far as being
imported); the command is this process's own command line. The exit status (130 for SIGINT, 143 for SIGTERM) is the
caller's (``infra.lifetime.StopSignals``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from infra.runs import RunsLayout


def same_command(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> str:
    """The command line that started this process, as a shell would take it again: ``pretrain ARGS`` when it is the
    ``pretrain`` found on PATH, else the program as it was given (``.venv/bin/pretrain ARGS``, ``python -m flows.cli
    ARGS``)."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", argv) if orig_argv is None else orig_argv
    program = argv[0] if argv else "pretrain"
    if Path(program).name == "pretrain":
        found = shutil.which("pretrain")
        if found and os.path.realpath(found) == os.path.realpath(program):
            program = "pretrain"
        return shlex.join([program, *argv[1:]])
    return shlex.join(orig_argv)  # `python -m flows.cli ...`: the interpreter's command line as typed


def interrupted_line(signal_name: str, layout: RunsLayout, log_path: Path | None = None,
                     command: str | None = None) -> str:
    """The sentence after ``interrupted`` (no markup): where the run was, what is kept, how to resume."""
    pipeline = sys.modules.get("flows.pipeline")
    position = getattr(pipeline, "POSITION", None)
    done = list(position.done) if position is not None else []
    running = position.running if position is not None else None
    if running is not None:
        where = f"during stage {running}"
    elif done:
        where = f"after stage {done[-1]}"
    else:
        where = "before the first stage"
    kept = (f"the completed stages are kept ({', '.join(done)})" if done else "no stage had completed")
    if running is not None:
        kept += f" and {running} {_resumes(layout, running, position.key)}"
    log = f" (log: {log_path})" if log_path is not None and log_path.is_file() else ""
    return (f"({signal_name}) {where}: {kept}; to resume, run the same command: "
            f"{command or same_command()}{log}")


def _resumes(layout: RunsLayout, stage: str, key: str | None) -> str:
    """How the unfinished ``stage`` goes on: from the checkpoints its scratch folder holds, else from the start."""
    from infra.stage import scratch_folder

    folder = scratch_folder(layout.root, stage, key) if key else None
    if folder is not None and folder.is_dir() and any(p.is_file() for p in folder.rglob("*")):
        return f"resumes from its last checkpoint ({folder.relative_to(layout.root)})"
    return "starts again (it had saved nothing to resume from)"
