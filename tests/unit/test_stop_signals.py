"""How a run stops: SIGINT and SIGTERM unwind it as ``KeyboardInterrupt`` (``infra.lifetime.StopSignals``), its
helpers do not get the terminal's Ctrl-C, an interrupted shard map stops its workers at once, a lost Ray head fails
the stage, and the line the command prints (``flows.interrupt``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.interrupt import interrupted_line, same_command
from infra.errors import RayHeadLostError
from infra.lifetime import shielded_from_terminal_interrupts
from infra.runs import RunsLayout
from infra.shard_map import RAY_RECONNECT_ENV, RAY_HEAD_TIMEOUT_S, HeadWatch, RecyclingPool, head_timeout_s, process_map

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")

STOPS = textwrap.dedent("""
    import os, signal, sys
    from infra.lifetime import StopSignals

    stop = StopSignals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        print("not interrupted")
    except KeyboardInterrupt as err:
        print("interrupted", stop.name, stop.exit_code, err, flush=True)
    stop.restore()
    print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    stop = StopSignals()
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        print("unwinding", stop.exit_code, flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while unwinding: the process ends at once
        print("still here", flush=True)
""")


def test_sigterm_and_sigint_unwind_as_keyboard_interrupt_and_a_second_signal_ends_the_process():
    proc = subprocess.run([sys.executable, "-c", STOPS], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["interrupted SIGTERM 143 SIGTERM", "restored True", "unwinding 130"], (
        proc.stdout + proc.stderr)
    assert proc.returncode == 130 and not proc.stderr


def _blocked(pid: int | str = "self") -> int:
    """The blocked-signal mask of a process (``SigBlk`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk")


def _sigint_blocked(mask: int) -> bool:
    return bool(mask & (1 << (signal.SIGINT - 1)))


def worker_blocks_sigint(i: int) -> bool:
    return _sigint_blocked(_blocked())


def test_processes_started_shielded_do_not_get_sigint_and_the_caller_gets_its_mask_back():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with shielded_from_terminal_interrupts():
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert _sigint_blocked(_blocked(child.pid))
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
        # the forkserver's pool workers inherit it too: the run stops them itself
        assert process_map(1)(worker_blocks_sigint, [{"i": 0}], "mask") == [True]
    finally:
        child.kill()
        child.wait()


def sleep_then(seconds: float, marker: str) -> float:
    Path(marker).write_text("started")
    time.sleep(seconds)
    return seconds


def test_terminating_a_recycling_pool_fails_its_running_calls_at_once(tmp_path):
    pool = RecyclingPool(2, sleep_then)
    try:
        # two calls: a third submit would wait for a free worker (RecyclingPool holds workers calls in flight)
        futures = [pool.submit(sleep_then, seconds=60, marker=str(tmp_path / f"m{i}")) for i in range(2)]
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"m{i}").exists() for i in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        pool.terminate()
        for future in futures:
            with pytest.raises(BrokenProcessPool):
                future.result(timeout=30)
        assert time.monotonic() - started < 10
        with pytest.raises(BrokenProcessPool, match="terminated"):
            pool.submit(sleep_then, seconds=0, marker=str(tmp_path / "late"))
    finally:
        pool.shutdown()


def test_a_ray_head_that_stops_answering_is_given_up_after_its_grace():
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    watch = HeadWatch(address, "corpus-filter", lost_after_s=0.3, poll_s=0.05)
    watch.check()
    watch.confirm()  # it answers: returns at once
    server.close()
    started = time.monotonic()
    with pytest.raises(RayHeadLostError, match=f"lost the Ray head at {address}: .* while corpus-filter ran"):
        watch.confirm()
    assert 0.3 <= time.monotonic() - started < 5


def test_the_head_timeout_is_ray_s_reconnect_setting(monkeypatch):
    monkeypatch.delenv(RAY_RECONNECT_ENV, raising=False)
    assert head_timeout_s() == RAY_HEAD_TIMEOUT_S < 60  # Ray's own default: 60 s
    assert HeadWatch("h:1", "x").lost_after_s == pytest.approx(RAY_HEAD_TIMEOUT_S / 3)
    monkeypatch.setenv(RAY_RECONNECT_ENV, "90")
    assert head_timeout_s() == 90 and HeadWatch("h:1", "x").lost_after_s == pytest.approx(30)


def _position(monkeypatch, done, running=None, key=None):
    monkeypatch.setitem(sys.modules, "flows.pipeline",
                        SimpleNamespace(POSITION=SimpleNamespace(done=done, running=running, key=key)))


def test_the_interrupted_line_names_the_stage_what_is_kept_and_the_command(tmp_path, monkeypatch):
    layout = RunsLayout.resolve(str(tmp_path / "runs"))
    log = tmp_path / "run.log"
    log.write_text("")
    _position(monkeypatch, ["sources", "quality_model"], "corpus", "k1")
    line = interrupted_line("SIGINT", layout, log, "pretrain run c.toml")
    assert line == ("(SIGINT) during stage corpus: the completed stages are kept (sources, quality_model) and corpus "
                    "starts again (it had saved nothing to resume from); to resume, run the same command: "
                    f"pretrain run c.toml (log: {log})")
    checkpoint = layout.root / "scratch" / "corpus" / "k1" / "pass-1.parquet"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("x")
    assert "and corpus resumes from its last checkpoint (scratch/corpus/k1);" in interrupted_line(
        "SIGTERM", layout, None, "c")
    _position(monkeypatch, ["sources"])
    assert interrupted_line("SIGTERM", layout, tmp_path / "missing.log", "c") == (
        "(SIGTERM) after stage sources: the completed stages are kept (sources); to resume, run the same command: c")
    monkeypatch.delitem(sys.modules, "flows.pipeline")
    assert interrupted_line("SIGINT", layout, None, "c").startswith("(SIGINT) before the first stage: no stage had")


def test_the_same_command_is_the_one_typed():
    assert same_command(["/nowhere/bin/pretrain", "run", "a b.toml"], []) == "/nowhere/bin/pretrain run 'a b.toml'"
    assert same_command(["/x/flows/cli.py", "run", "c.toml"], [".venv/bin/python", "-m", "flows.cli", "run",
                                                              "c.toml"]) == ".venv/bin/python -m flows.cli run c.toml"


STORE_WRITE_CUT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import sqlalchemy.engine.default as default
    from infra.lifetime import StopSignals
    from infra.runs import RunsLayout
    from infra.tracking import Tracker

    layout = RunsLayout(Path(sys.argv[1]))
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, "t")
    run_id = tracker.start_run("stage")
    original = default.DefaultDialect.do_executemany

    sent = []

    def cut(self, cursor, statement, parameters, context=None):  # one Ctrl-C in the middle of MLflow's insert
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return original(self, cursor, statement, parameters, context)

    default.DefaultDialect.do_executemany = cut
    stop = StopSignals()
    try:
        tracker.log_metrics(run_id, {"loss_nats": 1.5, "grad_norm_preclip": 0.5}, step=3)
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        default.DefaultDialect.do_executemany = original
        started = time.perf_counter()
        tracker.end_run(run_id, "FAILED")  # what the run records on its way out
        print("recorded", round(time.perf_counter() - started, 2), flush=True)
    run = tracker.client.get_run(run_id)
    print(run.info.status, sorted(run.data.metrics.items()), flush=True)
""")


def test_a_stop_inside_a_tracking_store_write_comes_after_it_and_the_stop_is_recorded_at_once(tmp_path):
    """A KeyboardInterrupt raised inside MLflow's SQLite insert left its transaction open: recording the stop then
    waited out SQLite's busy timeout (20 s) and failed. The write finishes first; the stop follows it."""
    proc = subprocess.run([sys.executable, "-c", STORE_WRITE_CUT, str(tmp_path / "runs")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded, status = proc.stdout.splitlines()[-2:]
    assert recorded.startswith("recorded ") and float(recorded.split()[1]) < 5.0, proc.stdout
    assert status == "FAILED [('grad_norm_preclip', 0.5), ('loss_nats', 1.5)]"
