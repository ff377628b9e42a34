"""The main run across processes: the stage starts ``accelerate launch -m tasks.main.worker JOB`` and follows it.

Every worker process (``tasks.main.worker``) runs ``stage.train_main`` as one rank. Rank 0 appends its metrics and progress to
``<scratch>/launch/metrics.jsonl``, which the stage (in the pipeline's process, inside its MLflow run) tails and
forwards, so a launched run's MLflow record looks like an in-process one. Worker output goes to
``<scratch>/launch/workers.log``; a failed launch raises with its tail.

The worker module is what a Prefect worker on a GPU node runs (``infra/accelerate/h100x8.yaml``); the command is an
argument list (no shell), and killing the stage kills the whole worker process group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import yaml

from infra.errors import ConfigError, TrainingError
from infra.lifetime import stop_process_group
from infra.stage import ProgressReporter
from infra.threads import ThreadPolicy, apply_wait_policy, worker_environment

PROJECT_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.5
STOP_GRACE_S = 30.0  # between SIGTERM and SIGKILL of the workers' process group


def resolve_launch_config(path: str) -> Path:
    """An accelerate config path: as given (absolute or from the working directory), else under the project.

    Raises:
        ConfigError: the file exists in neither place, or is not a YAML mapping.
    """
    for candidate in (Path(path), PROJECT_ROOT / path):
        if candidate.is_file():
            try:
                loaded = yaml.safe_load(candidate.read_text())
            except yaml.YAMLError as err:
                raise ConfigError(f"main.distributed.accelerate_config {candidate} is not valid YAML: {err}") from err
            if not isinstance(loaded, dict):
                raise ConfigError(f"main.distributed.accelerate_config {candidate} is not a YAML mapping")
            return candidate.resolve()
    raise ConfigError(f"main.distributed.accelerate_config {path!r} not found (looked in {Path.cwd()} and "
                      f"{PROJECT_ROOT}); use one of infra/accelerate/*.yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(job_path: Path, config_path: Path, processes: int) -> list[str]:
    """The ``accelerate launch`` argument list for ``processes`` local workers (a free loopback port on a
    single-machine layout; multi-node layouts take address and port from their config or the scheduler)."""
    layout = yaml.safe_load(config_path.read_text())
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_path),
           "--num_processes", str(processes)]
    if int(layout.get("num_machines", 1)) == 1:
        cmd += ["--num_machines", "1", "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port())]
    return [*cmd, "-m", "tasks.main.worker", str(job_path)]


def launch(job: Any, dist: Any, *, log_metrics: Callable[[dict, int], None], progress: ProgressReporter,
           threads: ThreadPolicy | None = None) -> dict:
    """Run ``job`` (a ``stage.MainJob``) on ``dist.processes`` workers and return rank 0's run summary.

    Each worker trains with ``threads`` (its share of the run's threads; default ``job.torch_threads`` under the
    default wait policy), given to it as ``OMP_NUM_THREADS`` / ``OMP_WAIT_POLICY``.

    Raises:
        ConfigError: the accelerate config is missing or malformed.
        TrainingError: a worker failed (the message ends with the tail of the workers' log).
    """
    config_path = resolve_launch_config(dist.accelerate_config)
    folder = Path(job.scratch) / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    job_path = job.write(folder / "job.json")
    metrics_path, log_path = folder / "metrics.jsonl", folder / "workers.log"
    metrics_path.write_text("")
    cmd = launch_command(job_path, config_path, dist.processes)
    threads = threads or ThreadPolicy(job.torch_threads, "config", *apply_wait_policy())
    env = {**worker_environment(threads), "PRETRAIN_METRICS_FILE": str(metrics_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"main: launching {dist.processes} process(es) ({dist.strategy}) with {config_path.name}; "
          f"worker log {log_path}")
    with ExitStack() as stack, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        stack.callback(stop_process_group, proc, STOP_GRACE_S)  # on the way out; normally a no-op
        advance = stack.enter_context(progress.task("main: training steps", job.cfg["budget"]["steps"]))
        offset = 0
        while True:
            finished = proc.poll() is not None
            offset = _forward(metrics_path, offset, log_metrics, advance)
            if finished:
                break
            time.sleep(POLL_S)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise TrainingError(f"main: the launched run failed (exit {proc.returncode}); last worker output:\n{tail}")
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(("warning:", "main:")) or "resuming from step" in line:
            print(line)
    return json.loads((Path(job.out) / "run.json").read_text())


def _forward(path: Path, offset: int, log_metrics: Callable[[dict, int], None], advance: Callable[[int], None]) -> int:
    """Forward complete lines written since ``offset``; returns the new offset (a partial last line waits)."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        record = json.loads(line)
        if "advance" in record:
            advance(record["advance"])
        else:
            log_metrics(record["metrics"], record["step"])
    return offset + end


