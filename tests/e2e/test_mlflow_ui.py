"""The MLflow UI as a user sees it, in a real headless Chromium (Debian's, driven by Playwright): the address the
run prints (``infra.tracking.runs_page_url``) lands on the experiment's training runs, not on the GenAI overview
MLflow 3.17 opens by default; the stage runs are there, nested under the pipeline run; and the chart view draws a
stage's metric by step.

The store is made by the project's own ``Tracker`` (a parent run, nested stage runs, a logged metric series), not by a
pipeline run, and served by ``mlflow server`` on a free loopback port. With ``PRETRAIN_UI_SCREENSHOT=PATH`` (relative
to the repository root) the test also saves the chart view as a PNG there: ``docs/img/mlflow-runs.png`` is the one the
docs show.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from infra.lifetime import stop_process_group
from infra.runs import RunsLayout
from infra.tracking import Tracker, runs_page_url

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root, on a machine with no network but loopback: no sandbox, no background connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
STAGES = ("sources", "corpus", "tokenizer", "main")
WAIT_MS = 30_000  # per wait: the UI loads its chunks and queries the server as it goes
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: apt-get install chromium "
                                                               "(.ci/run installs it)")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _store(root: Path) -> dict:
    """A pipeline run with nested stage runs, as ``flows.pipeline`` logs them; the main run has a loss curve."""
    layout = RunsLayout.resolve(root)
    uri = f"sqlite:///{layout.mlflow_db}"  # this store, whatever PRETRAIN_TRACKING_URI says
    tracker = Tracker(uri, layout.mlflow_artifacts, "demo")
    parent = tracker.start_run("pipeline")
    tracker.log_params(parent, {"config": "demo", "seed": 0})
    stages = {name: tracker.start_run(name, parent_id=parent, tags={"stage": name}) for name in STAGES}
    tracker.log_metric_series(stages["main"], [{"step": s, "loss_nats": 2.0 + 4.0 * 0.98 ** s,
                                                "lr": 3e-3 * min(1.0, (s + 10) / 60)} for s in range(0, 200, 10)])
    for run_id in (*stages.values(), parent):
        tracker.end_run(run_id)
    return {"tracking_uri": uri, "experiment_id": tracker.experiment_id, "parent": parent, "stages": stages}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The store behind ``mlflow server`` (one worker) on a free loopback port; stopped after the tests."""
    folder = tmp_path_factory.mktemp("mlflow_ui")
    store = _store(folder / "runs")
    port = _free_port()
    log = folder / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", store["tracking_uri"], "--artifacts-destination", str(folder / "artifacts")],
            cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # 10 s on a quiet 2-core machine, 30 s on a loaded one
        while not _healthy(f"{base}/health"):
            assert server.poll() is None, f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mlflow server not up after 120 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield {**store, "base": base}
    finally:
        stop_process_group(server, grace_s=20.0)  # the CLI and its uvicorn worker


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:  # not listening yet
        return False


@pytest.fixture()
def page():
    """A page of a fresh headless Chromium (an empty profile: no workflow type remembered from earlier visits)."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.set_default_timeout(WAIT_MS)  # actions
            expect.set_options(timeout=WAIT_MS)  # assertions (5 s by default)
            yield context.new_page()
        finally:
            browser.close()


def test_the_printed_address_lands_on_the_training_runs_with_nested_stage_runs_and_a_metric_chart(served, page,
                                                                                                   tmp_path):
    try:
        _walk_through(served, page)
    except AssertionError as err:  # what the browser showed, for the failure report
        page.screenshot(path=tmp_path / "failure.png")
        raise AssertionError(f"{err}\nat {page.url}; screenshot {tmp_path / 'failure.png'}") from None


def _walk_through(served: dict, page) -> None:
    experiment = served["experiment_id"]
    page.goto(runs_page_url(experiment, served["base"]))
    # The experiment's Runs tab, not the GenAI "Overview" of traces.
    expect(page).to_have_url(re.compile(rf"#/experiments/{experiment}/runs\?(.*&)?workflowType=machine_learning"))
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_have_count(0)

    # The stage runs are nested under the pipeline run: its row's expander shows them.
    parent_row = page.get_by_role("row").filter(has=page.get_by_role("link", name="pipeline", exact=True))
    expect(parent_row).to_be_visible()
    for name in STAGES:
        expect(page.get_by_role("link", name=name, exact=True)).to_have_count(0)
    parent_row.get_by_role("button").click()
    for name in STAGES:
        expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()

    # The chart view: a card per metric, drawn by step for the visible runs.
    assistant = page.get_by_role("button", name="Close", exact=True)  # the MLflow Assistant side panel
    if assistant.is_visible():
        assistant.click()
    page.locator('label:has(input[name="runs-view-mode"][value="CHART"])').click()
    card = page.get_by_test_id("experiment-view-compare-runs-card").filter(
        has=page.get_by_role("heading", name="loss_nats", exact=True))
    expect(card.locator(".js-plotly-plot .js-line").first).to_be_attached()
    expect(card).to_be_visible()
    if os.environ.get("PRETRAIN_UI_SCREENSHOT"):
        page.screenshot(path=ROOT / os.environ["PRETRAIN_UI_SCREENSHOT"])

    # A stage run's page: its "Model metrics" tab draws the run's own curves.
    page.get_by_role("link", name="main", exact=True).click()
    expect(page).to_have_url(re.compile(rf"#/experiments/{experiment}/runs/{served['stages']['main']}"))
    page.get_by_role("tab", name="Model metrics", exact=True).click()
    expect(page.get_by_role("heading", name="loss_nats", exact=True)).to_be_visible()
    expect(page.locator(".js-plotly-plot .js-line").first).to_be_attached()
