"""``infra/prefect.yaml`` and the H100 job template describe deployments Prefect can actually create: each
entrypoint loads the pipeline flow, each parameter set passes the flow's own validation and the experiment
config's, each schedule parses, and every template placeholder is a declared job variable."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prefect.client.schemas.schedules import construct_schedule
from prefect.flows import load_flow_from_entrypoint

from flows.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS_FILE = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())
TEMPLATE = json.loads((ROOT / "infra" / "prefect" / "h100-job-template.json").read_text())
OVERRIDES = {"seed": "seed", "launch": "main.distributed.launch", "processes": "main.distributed.processes",
             "accelerate_config": "main.distributed.accelerate_config"}


@pytest.mark.parametrize("deployment", DEPLOYMENTS_FILE["deployments"], ids=lambda d: d["name"])
def test_deployment_entrypoint_parameters_and_schedules_are_valid(deployment, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths in the file are relative to the checkout, as the pull step sets it
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == "pretrain-pipeline"
    params = deployment["parameters"]
    assert flow.validate_parameters(params) is not None
    overrides = {OVERRIDES[k]: v for k, v in params.items() if k in OVERRIDES}
    cfg = load_config(params["config_path"], overrides)
    if "launch" in params:
        assert cfg.main.distributed.launch == params["launch"]
        assert cfg.main.distributed.processes == params["processes"]
    for schedule in deployment.get("schedules", []):
        construct_schedule(cron=schedule["cron"], timezone=schedule["timezone"])


def test_every_template_placeholder_is_a_declared_job_variable():
    declared = set(TEMPLATE["variables"]["properties"])
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(TEMPLATE["job_configuration"])))
    assert used <= declared, used - declared
    assert set(TEMPLATE["variables"]["required"]) <= used
    h100 = next(d for d in DEPLOYMENTS_FILE["deployments"] if d["work_pool"]["name"] == "h100")
    assert set(h100["work_pool"]["job_variables"]) <= declared
    container = TEMPLATE["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpus }}"
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {h100["parameters"]["runs_dir"]}


@pytest.mark.parametrize("cron, timezone, message", [("not a cron", None, "Invalid cron string"),
                                                      ("0 3 * * *", "Mars/Base", "Invalid timezone")])
def test_serve_refuses_a_bad_schedule_before_starting_any_server(tmp_path, cron, timezone, message):
    from flows.serve import serve
    from infra.errors import ConfigError
    from infra.runs import RunsLayout

    layout = RunsLayout.resolve(tmp_path / "runs")
    with pytest.raises(ConfigError, match=message):
        serve(ROOT / "configs" / "smoke.toml", layout, name="smoke", cron=cron, interval=None, timezone=timezone,
              parameters={}, limit=1, port=1)  # port 1: starting a server there would fail differently
    assert not layout.prefect_home.exists()


def test_report_refuses_a_runs_folder_that_does_not_exist(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "flows.cli", "report", "configs/smoke.toml", "--runs-dir",
                           str(tmp_path / "typo")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not exist or is not a folder" in proc.stdout
    assert not (tmp_path / "typo").exists()


def test_the_run_watcher_reports_each_new_run_once_when_it_starts_and_when_it_ends():
    """``pretrain serve`` prints a line when a served run starts and one with its final state; runs that existed
    before serving started, and states already reported, print nothing."""
    from flows.serve import RunWatcher

    said: list[str] = []
    watcher = RunWatcher("http://unused/api", "dep", "pretrain-pipeline/smoke", write=said.append)
    answers = iter([
        [{"id": "old", "name": "old-run", "state": {"type": "COMPLETED", "name": "Completed"}}],
        None,  # the server did not answer: asked again at the next poll
        [{"id": "old", "name": "old-run", "state": {"type": "COMPLETED", "name": "Completed"}},
         {"id": "a", "name": "brave-fox", "state": {"type": "RUNNING", "name": "Running"}}],
        [{"id": "a", "name": "brave-fox", "state": {"type": "RUNNING", "name": "Running"}}],
        [{"id": "a", "name": "brave-fox", "state": {"type": "COMPLETED", "name": "Completed"},
          "total_run_time": 65.2},
         {"id": "b", "name": "calm-owl", "total_run_time": 3.0,
          "state": {"type": "FAILED", "name": "Failed", "message": "Flow run encountered an exception: ConfigError:\n"
                                                                  "  bad value"}}],
        [{"id": "a", "name": "brave-fox", "state": {"type": "COMPLETED", "name": "Completed"}}],
    ])
    watcher._runs = lambda: next(answers)
    for _ in range(6):
        watcher.poll()
    assert said == ["pretrain-pipeline/smoke run 'brave-fox': started",
                    "pretrain-pipeline/smoke run 'brave-fox': Completed after 1m05s",
                    "pretrain-pipeline/smoke run 'calm-owl': Failed after 3s: Flow run encountered an exception: "
                    "ConfigError: bad value"]
