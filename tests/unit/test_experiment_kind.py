"""The experiment is MLflow's "Machine learning" kind (``mlflow.experimentKind``), whether the tracker creates it or
finds it made earlier without the tag, in a real SQLite store; and the UI address of its training runs, which the
end-of-run summary prints."""

import io

from mlflow import MlflowClient
from rich.console import Console

from flows.summary import print_summary
from infra.runs import TRACKING_ENV, RunsLayout
from infra.tracking import EXPERIMENT_KIND_TAG, Tracker, runs_page_url


def test_a_new_experiment_is_tagged_custom_model_development(tmp_path):
    layout = RunsLayout.resolve(tmp_path / "runs")
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, "demo")
    reread = MlflowClient(layout.tracking_uri).get_experiment(tracker.experiment_id)
    assert reread.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert reread.artifact_location == layout.mlflow_artifacts.as_uri()


def test_an_existing_experiment_without_the_tag_gets_it_and_a_chosen_kind_is_kept(tmp_path):
    layout = RunsLayout.resolve(tmp_path / "runs")
    layout.root.mkdir()
    client = MlflowClient(layout.tracking_uri)
    older = client.create_experiment("demo", artifact_location=layout.mlflow_artifacts.as_uri())
    chosen = client.create_experiment("chat", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(older).tags

    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, "demo")
    assert tracker.experiment_id == older
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    Tracker(layout.tracking_uri, layout.mlflow_artifacts, "chat")
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_the_runs_page_url_names_the_runs_tab_and_the_model_training_workflow():
    assert runs_page_url("7") == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    served = runs_page_url("7", "http://host:8080/")
    assert served == "http://host:8080/#/experiments/7/runs?workflowType=machine_learning"


def test_the_summary_prints_the_runs_page_of_a_local_store_and_of_a_tracking_server(tmp_path, monkeypatch):
    monkeypatch.delenv(TRACKING_ENV, raising=False)
    result = {"experiment": "demo", "experiment_id": "3", "paths": {}, "cached": {}}
    shown = {}
    for where, uri in (("local", None), ("server", "http://mlflow.example:8080")):
        if uri:
            monkeypatch.setenv(TRACKING_ENV, uri)
        console = Console(file=io.StringIO(), width=200)
        print_summary(result, RunsLayout.resolve(tmp_path / "runs"), console)
        shown[where] = console.file.getvalue()
    assert "Runs:        http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning\n" in shown["local"]
    assert "mlflow ui --backend-store-uri sqlite:///" in shown["local"]
    assert "http://mlflow.example:8080/#/experiments/3/runs?workflowType=machine_learning\n" in shown["server"]
