"""After each stage: write what its ``Stage.publish`` returns into DuckDB and the stage's nested MLflow run.

DuckDB rows are rewritten from the artifact on every run (cached or not, keyed by artifact key), so the
warehouse always matches the artifact store. MLflow files and figures are logged only by the run that produced
the artifact; a cached stage's run is tagged ``cached=true`` with ``produced_by_run`` pointing at that run.
Nothing here knows any stage: it writes ``infra.stage.Published``. A table with a ``manifest_hash`` column passes the
lineage suite (``infra.expectations.check_manifest_hash``: one SHA-256 corpus manifest hash throughout) first, when
the run that produced the artifact publishes it.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from infra.artifacts import Artifact
from infra.expectations import check_manifest_hash
from infra.stage import PublishContext, Published, Stage
from infra.tracking import Tracker
from infra.warehouse import Warehouse


@dataclass(frozen=True)
class PublishTarget:
    """Where a pipeline run publishes: its stores, its experiment and its runs."""

    tracker: Tracker
    warehouse: Warehouse
    experiment: str
    parent_run_id: str
    flow_run_id: str


def publish(stage: Stage, artifact: Artifact, inputs: Mapping[str, Artifact], cfg: Any, target: PublishTarget,
            run_id: str, *, cached: bool) -> Published:
    """Describe ``artifact`` in the stage run ``run_id`` and mirror it into the warehouse; returns what was written."""
    tracker, summary = target.tracker, artifact.meta.get("summary", {})
    tracker.set_tags(run_id, {"cached": str(cached).lower(), "produced_by_run": artifact.meta.get("mlflow_run_id", ""),
                              "artifact_path": str(artifact.path)})
    tracker.log_metrics(run_id, {k: v for k, v in summary.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)}, step=0)
    out = stage.publish(PublishContext(artifact, inputs, cfg, cached, tracker.remote))
    _write(out, artifact, target, run_id, cached)
    if not cached:
        _log_figures(stage, artifact, tracker, run_id)
    target.warehouse.append("stage_runs", pd.DataFrame([{
        "experiment": target.experiment, "stage": stage.name, "artifact_key": artifact.key, "cached": cached,
        "mlflow_run_id": run_id, "produced_by_run": artifact.meta.get("mlflow_run_id", ""),
        "prefect_flow_run_id": target.flow_run_id, "parent_run_id": target.parent_run_id,
        "wall_s": float(artifact.meta.get("wall_s", 0.0)), "input_keys": json.dumps(artifact.meta.get("input_keys", {})),
        "code_version": artifact.meta.get("code_version", ""),
        "recorded_at": pd.Timestamp.now(tz="UTC").tz_localize(None)}]))
    return out


def _write(out: Published, artifact: Artifact, target: PublishTarget, run_id: str, cached: bool) -> None:
    tracker, warehouse = target.tracker, target.warehouse
    for table, frame in out.tables.items():
        # Rows of one artifact come from one corpus (older artifacts: NULL). Checked when the artifact is first
        # published: a cached one's tables are the same (its files match their checksums), and each suite costs
        # Great Expectations about a second.
        if (not cached and isinstance(frame, pd.DataFrame) and "manifest_hash" in frame
                and frame["manifest_hash"].notna().any()):
            check_manifest_hash(frame, table)
        warehouse.replace(table, frame, artifact.key)
    for update in out.updates:
        warehouse.update(update.table, update.set, update.where)
    if out.params:
        tracker.log_params(run_id, out.params)
    if out.tags:
        tracker.set_tags(run_id, out.tags)
    tracker.log_metrics(run_id, mlflow_safe(out.metrics), step=0)
    for name, value, step in out.series:
        tracker.log_metrics(run_id, {name: value}, step=step)
    for dataset in out.datasets:
        tracker.log_dataset(run_id, dataset.name, dataset.digest, dataset.path, dataset.context, dict(dataset.profile))
    if out.parent_tags:
        tracker.set_tags(target.parent_run_id, out.parent_tags)
    if out.parent_metrics:
        tracker.log_metrics(target.parent_run_id, out.parent_metrics, step=0)
    for name in [] if cached else out.files:
        path = artifact.path / name
        if path.exists():
            tracker.log_artifact(run_id, path, None if path.is_file() else name)
    for name, frame in ({} if cached else out.mlflow_tables).items():
        tracker.log_table(run_id, frame, name)
    for reg in out.registrations:
        if reg.alias is None:
            tracker.register_version(reg.model, source=reg.source, run_id=run_id, identity=reg.identity,
                                     tags=reg.tags)
            continue
        version, created = tracker.point_alias(reg.model, reg.alias, source=reg.source, run_id=run_id,
                                               identity=reg.identity, tags=reg.tags)
        tracker.set_tags(run_id, {"registered_model": reg.model, "registered_version": version,
                                  "registered_version_created": str(created).lower()})
        tracker.set_tags(target.parent_run_id, {"registered_version": version})


def mlflow_safe(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metric names made MLflow-legal (word characters, '.', '-', '/', ' ', ':'; terms like "C++" are made to
    fit), NaN values left out."""
    return {re.sub(r"[^\w.\-/ :]", "_", k): float(v) for k, v in metrics.items() if pd.notna(v)}


def _log_figures(stage: Stage, artifact: Artifact, tracker: Tracker, run_id: str) -> None:
    """The stage's figures as the ``plots/`` artifact folder of the run that produced the artifact; curves come
    from the metrics that run logged."""
    history = training_history(tracker.client, run_id) if stage.wants_history else None
    with tempfile.TemporaryDirectory() as tmp:
        if stage.figures(artifact.path, Path(tmp), history):
            tracker.log_artifact(run_id, Path(tmp), "plots")


CURVE_METRICS = ("loss_nats", "lr")


def training_history(client, run_id: str, metrics: tuple[str, ...] = CURVE_METRICS) -> pd.DataFrame:
    """The logged history of ``metrics`` of one MLflow run, one row per step (columns ``step`` and the metrics
    found; empty when none was logged)."""
    frames = []
    for name in metrics:
        points = client.get_metric_history(run_id, name)
        if points:
            frames.append(pd.DataFrame({"step": [m.step for m in points], name: [m.value for m in points]})
                          .drop_duplicates("step", keep="last").set_index("step"))
    return pd.concat(frames, axis=1).reset_index() if frames else pd.DataFrame()
