"""End to end, how a real ``pretrain run configs/smoke.toml`` stops: Ctrl-C (SIGINT to the terminal's whole process
group) and SIGTERM (to the run's process) inside the corpus stage, Ctrl-C inside a training loop that runs in the
run's own process (CPT's), and the loss of the Ray head the corpus stage runs on. Each must end within seconds with the platform's own line last (no other library's ERROR line, no traceback),
exit 130 / 143 / 2, and leave no process of the run; after a signal, the command the line names finishes the run with
the reference's artifacts.

Each corpus test works on a copy of the session's completed smoke runs folder with the corpus stage and those after it
removed, so the run reaches the corpus stage in seconds. The signal is sent once the corpus stage has opened its
temporary artifact folder (a Ray task of it runs, for the Ray test), never after a fixed sleep. The training-loop
test reuses the whole folder with CPT's budget raised to 100,000 steps (a new CPT key: everything before it is
cached), and sends the signal once a progress line shows CPT steps done.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, stage_status
from flows.registry import stage_names
from infra.lifetime import run_processes
from tasks.readers import load_kept

pytestmark = pytest.mark.e2e

STAGES = stage_names()
FROM_CORPUS = STAGES[STAGES.index("corpus"):]
CPT_BUDGET = "budget = { steps = 8, batch_size = 8, warmup_steps = 1, eval_every = 4, eval_tokens = 2048 }"
STOP_S = 10.0  # the longest a stop may take, signal to exit
START_TIMEOUT_S = 600.0  # generous: the corpus stage starts after ~20 s on an idle machine


def _runs_without(smoke_runs: dict, tmp_path: Path, stages: tuple[str, ...] | list[str]) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(smoke_runs["runs"], runs)
    for stage in stages:
        shutil.rmtree(runs / "artifacts" / stage, ignore_errors=True)
        shutil.rmtree(runs / "scratch" / stage, ignore_errors=True)
    return runs


def _env(runs: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs), "COLUMNS": "200", **(extra or {})}
    env.pop("RAY_ADDRESS", None)  # the Ray test names its cluster in the config
    return env


def _start(args: list[str], runs: Path, out: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m flows.cli ARGS`` in a process group of its own (as a shell job is), stdout and stderr to ``out``."""
    with open(out, "w") as sink:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=_env(runs, extra_env),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _run_token(proc: subprocess.Popen) -> str | None:
    """The run's process token (``infra.lifetime``), read from its supervisor's command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if len(argv) >= 3 and argv[-3].endswith(b"infra/lifetime.py") and argv[-2] == str(proc.pid).encode():
            return argv[-1].decode()
    return None


def _wait_for(condition, proc: subprocess.Popen, out: Path, what: str, timeout_s: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before {what}:\n{out.read_text()[-4000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{out.read_text()[-4000:]}")


def _stage_open(runs: Path, stage: str) -> bool:
    folder = runs / "artifacts" / stage
    return folder.is_dir() and any(p.name.startswith(".tmp-") for p in folder.iterdir())


def _units_done(out: Path, bar: str) -> int:
    """The last done count that a plain progress line of ``bar`` printed (``bar: 47/400000 (0%), ...``); 0 if none."""
    counts = re.findall(rf"^{re.escape(bar)}: (\d+)/\d+ ", out.read_text(errors="replace"), re.MULTILINE)
    return int(counts[-1]) if counts else 0


def _stop_and_time(proc: subprocess.Popen, send) -> tuple[int, float]:
    started = time.monotonic()
    send()
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("the run did not end within 120 s of the signal")
    return rc, time.monotonic() - started


def _left_behind(token: str, timeout_s: float = 15.0) -> list[str]:
    """Processes of the run still alive ``timeout_s`` after it ended (its supervisor stops the others, then ends)."""
    deadline = time.monotonic() + timeout_s
    while (left := run_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = []
    for pid in left:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        described.append(f"{pid} {argv[:120]}")
    return described


def _assert_only_our_lines(output: str) -> None:
    for marker in ("Traceback", "Crash detected", "ERROR", "Error logging to API"):
        assert marker not in output, f"{marker!r} on the terminal:\n{output[-4000:]}"


def _last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


def _complete_keys(runs: Path, stages) -> dict[str, str]:
    keys = {}
    for stage in stages:
        done = [p.name for p in (runs / "artifacts" / stage).iterdir() if (p / "_COMPLETE").exists()]
        assert len(done) == 1, f"{stage}: complete artifacts {done}"
        keys[stage] = done[0]
    return keys


@pytest.fixture
def run_guard():
    """Kills what a failed test left running: the run's process group."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ctrl_c(proc: subprocess.Popen, out: Path, where: str) -> str:
    """Ctrl-C as a terminal sends it (SIGINT to the run's whole process group); checks the run exits 130 within
    STOP_S with only its own lines; returns its last line."""
    rc, stop_s = _stop_and_time(proc, lambda: os.killpg(proc.pid, signal.SIGINT))
    output = out.read_text(errors="replace")
    print(f"\nCtrl-C in {where}: exit {rc} after {stop_s:.2f} s")
    assert rc == 130, output[-4000:]
    assert stop_s < STOP_S, f"the stop took {stop_s:.1f} s"
    _assert_only_our_lines(output)
    return _last_line(output)


def test_ctrl_c_in_a_stage_stops_within_seconds_with_one_line_and_the_named_command_finishes(
        smoke_runs, tmp_path, run_guard):
    runs = _runs_without(smoke_runs, tmp_path, FROM_CORPUS)
    out = tmp_path / "interrupted.out"
    proc = _start(["run", "configs/smoke.toml"], runs, out)
    run_guard.append(proc)
    _wait_for(lambda: _stage_open(runs, "corpus"), proc, out, "the corpus stage")
    token = _run_token(proc)
    assert token, "no supervisor of the run found"
    # Ctrl-C: the terminal sends SIGINT to the whole foreground process group, the run's helpers included.
    line = _ctrl_c(proc, out, "corpus")
    assert line.startswith("interrupted (SIGINT) during stage corpus: the completed stages are kept (sources, "
                           "quality_model) and corpus "), line
    assert not _left_behind(token), _left_behind(token, 0)
    # The line names the command to run again; it finishes the chain with the reference's artifacts.
    command = line.split("to resume, run the same command: ", 1)[1].split(" (log: ")[0]
    assert shlex.split(command)[-2:] == ["run", "configs/smoke.toml"], command
    log = Path(line.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "KeyboardInterrupt" in log.read_text()  # the traceback went to the run's log
    resumed = subprocess.run(shlex.split(command), cwd=ROOT, env=_env(runs), capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    if "corpus resumes from its last checkpoint" in line:  # else corpus had saved nothing yet, and starts again
        assert "corpus: resuming after an interrupted attempt" in resumed.stdout, resumed.stdout[-4000:]
    assert {s for s, v in stage_status(resumed.stdout).items() if v == "ran"} == set(FROM_CORPUS)
    assert _complete_keys(runs, STAGES) == _complete_keys(smoke_runs["runs"], STAGES)
    corpus = f"artifacts/corpus/{_complete_keys(runs, ['corpus'])['corpus']}"
    pd.testing.assert_frame_equal(load_kept(runs / corpus), load_kept(smoke_runs["runs"] / corpus))


def test_ctrl_c_in_a_training_loop_stops_within_seconds_with_one_line(smoke_runs, tmp_path, run_guard):
    runs = _runs_without(smoke_runs, tmp_path, [])
    config = tmp_path / "smoke-long-cpt.toml"
    smoke = (ROOT / "configs" / "smoke.toml").read_text()
    assert smoke.count(CPT_BUDGET) == 1, "configs/smoke.toml's [cpt] budget changed: update CPT_BUDGET"
    config.write_text(smoke.replace(CPT_BUDGET, CPT_BUDGET.replace("steps = 8,", "steps = 100000,")))
    out = tmp_path / "interrupted-cpt.out"
    proc = _start(["run", str(config)], runs, out, {"PRETRAIN_PROGRESS_INTERVAL_S": "1"})
    run_guard.append(proc)
    started = time.monotonic()
    _wait_for(lambda: _units_done(out, "cpt: replay × LR grid steps") > 0, proc, out, "CPT's first training steps")
    print(f"\nCPT's training steps after {time.monotonic() - started:.1f} s")
    token = _run_token(proc)
    assert token, "no supervisor of the run found"
    line = _ctrl_c(proc, out, "CPT's training loop")
    assert line.startswith("interrupted (SIGINT) during stage cpt: the completed stages are kept (sources, "), line
    assert not _left_behind(token), _left_behind(token, 0)


def test_sigterm_in_a_stage_unwinds_like_ctrl_c_and_exits_143(smoke_runs, tmp_path, run_guard):
    runs = _runs_without(smoke_runs, tmp_path, FROM_CORPUS)
    out = tmp_path / "terminated.out"
    args = ["run", "configs/smoke.toml", "--until", "corpus"]
    proc = _start(args, runs, out)
    run_guard.append(proc)
    _wait_for(lambda: _stage_open(runs, "corpus"), proc, out, "the corpus stage")
    token = _run_token(proc)
    assert token, "no supervisor of the run found"
    rc, stop_s = _stop_and_time(proc, lambda: proc.send_signal(signal.SIGTERM))  # `kill PID`: the run alone
    output = out.read_text(errors="replace")
    print(f"\nSIGTERM in corpus: exit {rc} after {stop_s:.2f} s")
    assert rc == 143, output[-4000:]
    assert stop_s < STOP_S, f"the stop took {stop_s:.1f} s"
    _assert_only_our_lines(output)
    line = _last_line(output)
    assert line.startswith("interrupted (SIGTERM) during stage corpus: the completed stages are kept"), line
    assert "run configs/smoke.toml --until corpus (log: " in line, line
    assert not _left_behind(token), _left_behind(token, 0)
    resumed = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=_env(runs),
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert stage_status(resumed.stdout)["corpus"] == "ran"
    assert _complete_keys(runs, ["corpus"]) == _complete_keys(smoke_runs["runs"], ["corpus"])


def test_a_lost_ray_head_ends_the_run_with_one_error_line_naming_it(smoke_runs, tmp_path, run_guard):
    pytest.importorskip("ray")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import faults  # the fault harness's one-node Ray cluster: its own temp folder, port and token

    (tmp_path / "logs").mkdir()
    cluster = faults.RayCluster(tmp_path)
    try:
        runs = _runs_without(smoke_runs, tmp_path, FROM_CORPUS)
        config = tmp_path / "smoke-ray.toml"
        config.write_text((ROOT / "configs" / "smoke.toml").read_text() + '\n[corpus.execution]\nengine = "ray"\n'
                          f'address = "{cluster.address}"\nworkers = 2\nshard_docs = 50\n')
        out = tmp_path / "lost-head.out"
        proc = _start(["run", str(config), "--until", "corpus"], runs, out, cluster.env)
        run_guard.append(proc)
        _wait_for(lambda: any(t.startswith("corpus-") for t in faults.ray_tasks_executing(cluster.proc.pid).values()),
                  proc, out, "a corpus task on this test's Ray cluster")
        token = _run_token(proc)
        assert token, "no supervisor of the run found"
        head = faults._descendants(cluster.proc.pid) | {cluster.proc.pid} | {
            int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and str(cluster.temp) in faults._cmdline(int(p.name))}
        rc, stop_s = _stop_and_time(proc, lambda: [faults._sigkill(pid) for pid in head])
    finally:
        leftovers = cluster.stop()
    output = out.read_text(errors="replace")
    print(f"\nlost Ray head in corpus: exit {rc} after {stop_s:.2f} s")
    assert rc == 2, output[-4000:]
    assert stop_s < 40, f"the run took {stop_s:.1f} s to give up the head (Ray alone: 60 s, then exit 1)"
    line = _last_line(output)
    assert line.startswith(f"error: RayHeadLostError: lost the Ray head at {cluster.address}: "), line
    assert "run the same command again" in line, line
    assert output.count("error:") == 1 and "Traceback" not in output, output[-4000:]
    assert not _left_behind(token), _left_behind(token, 0)
    assert not leftovers, f"Ray processes outlived the cluster: {leftovers}"
