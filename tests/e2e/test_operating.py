"""End to end, the ways people operate the platform: a served, scheduled deployment triggered through the Prefect
API; the pipeline logging to an ``mlflow server`` over HTTP; two runs of one config at once; ``--until``.

Each test works on a copy of the session's completed smoke runs folder, so only what it changes is computed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from uuid import UUID

import duckdb
import httpx
import pytest
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from conftest import ROOT, pretrain, stage_status
from flows.config import load_config
from flows.registry import stage_names

STAGE_NAMES = stage_names()

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _copy_runs(smoke_runs: dict, tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(smoke_runs["runs"], runs)
    return runs


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}\n"
                                 f"{log.read_text()[-4000:] if log else ''}")
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{log.read_text()[-4000:] if log else ''}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _get(url: str) -> dict | None:
    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def test_served_deployment_has_its_schedule_and_a_triggered_run_completes(smoke_runs, tmp_path):
    runs = _copy_runs(smoke_runs, tmp_path)
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    log = tmp_path / "serve.log"
    env = {**os.environ, "PRETRAIN_RUNS_DIR": str(runs)}
    env.pop("PREFECT_API_URL", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "configs/smoke.toml", "--interval", "86400",
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deployment = _wait_for(lambda: _get(f"{api}/deployments/name/pretrain-pipeline/smoke"), 300,
                               "the served deployment", proc, log)
        assert [s["schedule"]["interval"] for s in deployment["schedules"]] == [86400.0]
        assert deployment["parameters"]["config_path"] == str(ROOT / "configs" / "smoke.toml")
        assert deployment["parameters"]["runs_dir"] == str(runs)
        # A run triggered through the API, with typed overrides of the deployment's parameters (the tokenizer
        # recomputed, so that its expectation suites log); Prefect's own client, which retries what a busy server
        # answers (503 while its SQLite database is locked), as users' tools do.
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            run_id = str(client.create_flow_run_from_deployment(UUID(deployment["id"]),
                                                                parameters={"until": "tokenizer",
                                                                            "refresh": ["tokenizer"]}).id)

        def finished():
            flow_run = _get(f"{api}/flow_runs/{run_id}")  # None while the server is busy: asked again
            state = flow_run["state"] if flow_run else None
            return state if state and state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

        state = _wait_for(finished, 600, "the triggered flow run", proc, log)
        assert state["type"] == "COMPLETED", f"{state}\n{log.read_text()[-4000:]}"
        # The run's final state is reported in the serving terminal (the watcher polls every 3 s).
        run_name = _get(f"{api}/flow_runs/{run_id}")["name"]
        _wait_for(lambda: f"run '{run_name}': Completed" in log.read_text(), 60, "the run's final line", proc,
                  log)
    finally:
        _stop(proc)
    text = log.read_text()
    lines = text.splitlines()
    # One platform line when serving starts: the deployment, its schedule, the UI and how to trigger a run.
    (start,) = [line for line in lines if line.startswith("serving pretrain-pipeline/smoke")]
    assert f"(every 86400 s); Prefect UI http://127.0.0.1:{port}/deployments/deployment/{deployment['id']}" in start
    assert f"PREFECT_API_URL={api} prefect deployment run 'pretrain-pipeline/smoke'" in start
    # Prefect's runner talked to the server serving started, not to an ephemeral one of its own (it warned then).
    assert "Cannot schedule flows on an ephemeral server" not in text and "Your flow 'pretrain-pipeline' is being served" not in text
    # The triggered run's own output reached the serving terminal: its stage lines, then its final state.
    assert "[1/13] sources: cached" in text and "[4/13] tokenizer: ran in " in text, text[-4000:]
    assert f"pretrain-pipeline/smoke run '{run_name}': Completed after " in text
    # The terminal is the platform's: the runner's and the flow run's library records went to their logs.
    (serve_log,) = [line.split()[2] for line in lines if line.startswith("Serve log: ")]
    (run_log,) = [line.split()[2] for line in lines if line.startswith("Run log: ")]
    assert Path(serve_log).is_file() and "ephemeral docs site" not in text
    assert "great_expectations" in Path(run_log).read_text(), text[-3000:]
    library = [line for line in lines if re.match(r"^\S* ?\d\d:\d\d:\d\d\.\d+ \| (INFO|WARNING) +\| ", line)]
    assert not library, text[-3000:]
    # SIGTERM stops serving with one line.
    assert lines[-1] == ("serving stopped: pretrain-pipeline/smoke no longer runs on its schedule; the local Prefect "
                         "server is stopped"), text[-2000:]
    # The run is the real pipeline: its MLflow parent run carries the Prefect flow run id and stopped at the tokenizer.
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    parents = client.search_runs([experiment.experiment_id], f"tags.prefect_flow_run_id = '{run_id}' "
                                 "and tags.`mlflow.runName` = 'pipeline'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    assert sorted(r.data.tags["stage"] for r in children) == sorted(STAGE_NAMES[: STAGE_NAMES.index("tokenizer") + 1])
    assert {r.data.tags["stage"]: r.data.tags["cached"] for r in children} == {
        "sources": "true", "quality_model": "true", "corpus": "true", "tokenizer": "false"}
    # Serving stopped its local server: the port is free again.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def _mlflow(method: str, base: str, path: str, **kwargs) -> dict:
    response = httpx.request(method, f"{base}/api/2.0/mlflow/{path}", timeout=30.0, **kwargs)
    assert response.status_code == 200, f"{path}: {response.status_code} {response.text[:500]}"
    return response.json()


def test_pipeline_logs_to_an_mlflow_server_over_http(smoke_runs, tmp_path, monkeypatch):
    runs = _copy_runs(smoke_runs, tmp_path)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "mlflow.log"
    store = tmp_path / "server"
    store.mkdir()
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "art")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: _healthy(f"{base}/health"), 300, "mlflow server", server, log)
        # CPT, the gate and the export are recomputed, so their metrics stream to the server while they run.
        proc = pretrain("run", "configs/smoke.toml", "--refresh", "cpt", "--tracking-uri", base, runs=runs)
        assert {k for k, v in stage_status(proc.stdout).items() if v == "ran"} == {"cpt", "gate", "export"}
        experiment = _mlflow("GET", base, "experiments/get-by-name", params={"experiment_name": "smoke"})["experiment"]
        found = _mlflow("POST", base, "runs/search", json={"experiment_ids": [experiment["experiment_id"]],
                                                            "max_results": 100})["runs"]
        tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in found}
        parents = [rid for rid, t in tags.items() if t.get("mlflow.runName") == "pipeline"]
        assert len(parents) == 1
        children = {t["stage"]: rid for rid, t in tags.items() if t.get("mlflow.parentRunId") == parents[0]}
        assert sorted(children) == sorted(STAGE_NAMES)
        # Metrics with steps: the CPT run's per-candidate training curves.
        cpt_run = _mlflow("GET", base, "runs/get", params={"run_id": children["cpt"]})["run"]
        curve_keys = [m["key"] for m in cpt_run["data"]["metrics"] if m["key"].endswith("loss_nats")]
        assert curve_keys, [m["key"] for m in cpt_run["data"]["metrics"]]
        history = _mlflow("GET", base, "metrics/get-history", params={"run_id": children["cpt"],
                                                                       "metric_key": curve_keys[0]})["metrics"]
        assert len({m["step"] for m in history}) > 1
        # Dataset inputs with digests: each corpus source's kept documents, each source's token shards, and the main
        # run's training mixture.
        sources = sorted(load_config(ROOT / "configs" / "smoke.toml").sources)
        for stage, datasets in (("corpus", [f"corpus/{s}" for s in sources]),
                                ("tokenizer", [f"token_shards/{s}" for s in sources]),
                                ("main", ["main_training_mixture"])):
            run = _mlflow("GET", base, "runs/get", params={"run_id": children[stage]})["run"]
            inputs = run.get("inputs", {}).get("dataset_inputs", [])
            digests = {d["dataset"]["name"]: d["dataset"]["digest"] for d in inputs}
            assert all(digests.get(name) for name in datasets), (stage, datasets, inputs)
        # Headline metrics on the parent run, and the registered alias of the kept model.
        parent = _mlflow("GET", base, "runs/get", params={"run_id": parents[0]})["run"]
        headline = {m["key"] for m in parent["data"]["metrics"]}
        assert any(k.startswith("kept.heldout_bits_per_byte.") for k in headline), headline
        alias = _mlflow("GET", base, "registered-models/alias", params={"name": "smoke-base", "alias": "kept"})
        assert alias["model_version"]["version"]
        # The kept model is the exported folder, uploaded through the proxy: a user downloads it and loads it.
        import mlflow
        from transformers import AutoModelForCausalLM, AutoTokenizer

        monkeypatch.setenv("MLFLOW_TRACKING_URI", base)  # models:/ URIs resolve through the environment's registry
        folder = Path(mlflow.artifacts.download_artifacts("models:/smoke-base@kept", dst_path=str(tmp_path / "kept")))
        model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
        ids = tokenizer("The Debian project", return_tensors="pt")
        assert model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] > ids["input_ids"].shape[1]
        # Artifacts went through the server's proxy, not to a local path in the runs folder.
        gate_files = _mlflow("GET", base, "artifacts/list", params={"run_id": children["gate"]}).get("files", [])
        assert any(f["path"] == "decision.json" for f in gate_files)
    finally:
        _stop(server)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=10.0).status_code == 200
    except httpx.HTTPError:  # not listening yet, or still starting its workers
        return False


def test_two_runs_of_one_config_at_once_compute_each_stage_once(smoke_runs, tmp_path):
    runs = _copy_runs(smoke_runs, tmp_path)
    for stage in ("cpt", "gate"):
        shutil.rmtree(runs / "artifacts" / stage)
    results: dict[int, subprocess.CompletedProcess] = {}

    def run(i: int) -> None:
        results[i] = pretrain("run", "configs/smoke.toml", runs=runs)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
        time.sleep(2.0)
    for thread in threads:
        thread.join()
    assert sorted(results) == [0, 1], "a concurrent run failed (its assertion is in the thread's traceback)"
    statuses = [stage_status(results[i].stdout) for i in (0, 1)]
    for stage in ("cpt", "gate"):
        assert sorted(s[stage] for s in statuses) == ["cached", "ran"], statuses
    con = duckdb.connect(str(runs / "results.duckdb"), read_only=True)
    try:
        per_key = con.execute("SELECT artifact_key, count(*), count(DISTINCT candidate) FROM gate_decisions "
                              "GROUP BY artifact_key").fetchall()
        recorded = con.execute("SELECT count(*) FROM stage_runs WHERE stage = 'gate'").fetchone()[0]
    finally:
        con.close()
    assert all(n == distinct for _, n, distinct in per_key), per_key  # no duplicated decision rows
    assert recorded == 2 + 2  # the two smoke runs before the copy, and both concurrent runs


def test_until_stops_after_the_named_stage(smoke_runs, tmp_path):
    runs = _copy_runs(smoke_runs, tmp_path)
    proc = pretrain("run", "configs/smoke.toml", "--until", "tokenizer", runs=runs)
    assert stage_status(proc.stdout) == {"sources": "cached", "quality_model": "cached", "corpus": "cached",
                                         "tokenizer": "cached"}
    assert "not run this time: mixture, quality_ablation, sweep, ladder, main, branches, cpt, gate, export" in proc.stdout
