"""MLflow tracking: one experiment per config name, one parent run per pipeline run, one nested run per stage.

Uses ``MlflowClient`` with explicit run ids (no global active run), so a stage can log from any thread and
the parent/child structure is explicit (``mlflow.parentRunId`` tag). The store is a SQLite file and a local
artifact root under the runs folder; ``mlflow ui --backend-store-uri sqlite:///<runs>/mlflow.db --host 127.0.0.1`` shows
it, and :func:`runs_page_url` is the address of an experiment's training runs in that UI.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

from infra.lifetime import OWNER_PID, interrupts_deferred, owner_gone, owner_tags
from infra.runs import ensure_folder

_MAX_PARAM_LEN = 6000
MAX_DIGEST_CHARS = 36  # MLflow's dataset digest column (String(36) in its SQL store)
# MLflow's experiment kind: "custom_model_development" is the UI's "Machine learning" kind (runs, metrics, models),
# "genai_development" its "GenAI apps & agents" kind (traces, evaluations).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
DEFAULT_UI = "http://127.0.0.1:5000"  # where ``mlflow ui`` / ``mlflow server`` listen by default


def runs_page_url(experiment_id: str, base: str = DEFAULT_UI) -> str:
    """The MLflow UI's page of an experiment's training runs (its "Runs" tab, in the "Model training" workflow).

    MLflow 3.17's UI chooses an experiment's view by its workflow type, not by the experiment's tags: the
    ``workflowType`` query parameter (``genai`` or ``machine_learning``), else the browser's last choice in the
    sidebar's GenAI / Model training switch, which starts at GenAI and so lands on the empty traces "Overview". This
    address names ``machine_learning``, so it shows the runs table, whose chart view and run pages hold the metrics.
    """
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def _json_number(value: Any) -> Any:
    """numpy / pandas scalars as plain numbers (``item()``); missing values as null."""
    if hasattr(value, "item"):
        return value.item()
    if str(value) in ("<NA>", "NaT"):  # pandas' missing values (no item())
        return None
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON serialisable")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested config dicts into dotted keys with string values (MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:_MAX_PARAM_LEN]
    return flat


def _whole(method):
    """A write to the tracking store that a stop signal does not cut in two (``infra.lifetime.interrupts_deferred``):
    the signal's ``KeyboardInterrupt`` comes once the write is done."""
    @functools.wraps(method)
    def write(*args, **kwargs):
        with interrupts_deferred():
            return method(*args, **kwargs)
    return write


class Tracker:
    """Writes the pipeline's runs to a local MLflow store.

    The experiment carries MLflow's experiment kind ``mlflow.experimentKind = custom_model_development`` (model
    training rather than a GenAI app), set when it is created and added to an existing one that lacks it; MLflow 3.17's
    UI picks its view from the URL instead (:func:`runs_page_url`).

    Args:
        tracking_uri: e.g. ``sqlite:////abs/runs/mlflow.db``, or ``http://127.0.0.1:5000`` for ``mlflow server``.
        artifact_root: folder for run artifacts of a local store (created if missing); a server keeps its own.
        experiment: experiment name (the config's ``name``).
    """

    def __init__(self, tracking_uri: str, artifact_root: Path, experiment: str):
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        kind = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        if found is None and tracking_uri.startswith(("http://", "https://")):
            # A tracking server stores artifacts itself (proxied ``mlflow-artifacts:``); a local path would only
            # work on the server's own machine.
            self.experiment_id = self.client.create_experiment(experiment, tags=kind)
        elif found is None:
            ensure_folder(artifact_root)
            try:
                self.experiment_id = self.client.create_experiment(experiment, tags=kind,
                                                                   artifact_location=artifact_root.as_uri())
            except MlflowException as err:  # another process created it since the lookup
                if err.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                    raise
                self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            self.experiment_id = found.experiment_id
            # Made before the tag was set; a kind chosen in the UI is kept. A deleted experiment takes no tags.
            if EXPERIMENT_KIND_TAG not in found.tags and found.lifecycle_stage == "active":
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)

    @_whole
    def start_run(self, name: str, *, parent_id: str | None = None, tags: Mapping[str, str] | None = None) -> str:
        """Create a run (nested under ``parent_id`` if given) and return its id. The run is tagged with this
        process's host, PID and start time (``infra.lifetime.owner_tags``), so that a later command can tell when
        it was left RUNNING by a process that has ended (``fail_abandoned_runs``)."""
        all_tags = {"mlflow.runName": name, **owner_tags(), **(tags or {})}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id

    @_whole
    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    @_whole
    def fail_abandoned_runs(self) -> list[str]:
        """Mark FAILED, in every experiment of the store, the runs left RUNNING by a process of this host that has
        ended (killed, or it could not record its end); returns their ids. Runs of other hosts and untagged runs
        are left alone: whether their process lives cannot be told from here."""
        failed, token = [], None
        while True:
            page = self.client.search_runs(
                [e.experiment_id for e in self.client.search_experiments(view_type=ViewType.ALL)],
                filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_PID}` != ''",
                run_view_type=ViewType.ALL, max_results=1000, page_token=token)
            for found in page:
                if owner_gone(found.data.tags):
                    self.client.set_tag(found.info.run_id, "pretrain.failed_reason",
                                        "left RUNNING by a process that has ended (killed?); marked FAILED by a "
                                        "later command")
                    self.end_run(found.info.run_id, "FAILED")
                    failed.append(found.info.run_id)
            token = page.token
            if not token:
                return failed

    @_whole
    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in flatten(params).items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])

    @_whole
    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @_whole
    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> list[str]:
        """Log finite metrics at an explicit step; returns the names of non-finite ones (never sent to MLflow)."""
        now = int(time.time() * 1000)
        good = [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if math.isfinite(float(v))]
        if good:
            self.client.log_batch(run_id, metrics=good)
        return [k for k, v in metrics.items() if not math.isfinite(float(v))]

    @_whole
    def log_metric_series(self, run_id: str, rows: Iterable[Mapping[str, float]], step_key: str = "step") -> None:
        """Log a sequence of metric dicts, each carrying its own step under ``step_key``."""
        now = int(time.time() * 1000)
        batch = [
            Metric(k, float(v), now, int(row[step_key]))
            for row in rows
            for k, v in row.items()
            if k != step_key and math.isfinite(float(v))
        ]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(run_id, metrics=batch[start : start + 1000])

    @_whole
    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path)

    @_whole
    def log_table(self, run_id: str, frame: Any, artifact_file: str) -> None:
        """A table (pandas DataFrame) as the run's JSON artifact ``artifact_file``, which the MLflow UI shows as a
        table (``MlflowClient.log_table``: a file logged twice is appended to)."""
        self.client.log_table(run_id, data=frame, artifact_file=artifact_file)

    @_whole
    def log_dataset(self, run_id: str, name: str, digest: str, source: Path, context: str, profile: dict) -> None:
        """Record a dataset input: ``name`` (e.g. ``corpus/<source>``, one input per source), ``digest`` (a content
        hash or an artifact key, at most ``MAX_DIGEST_CHARS``), the local ``source`` path, and counts as ``profile``
        (JSON; numpy and pandas integers are written as numbers).

        Raises:
            ValueError: ``digest`` is empty or longer than ``MAX_DIGEST_CHARS``.
        """
        if not digest or len(digest) > MAX_DIGEST_CHARS:
            raise ValueError(f"dataset {name!r}: digest {digest!r} must have 1 to {MAX_DIGEST_CHARS} characters "
                             "(MLflow's limit); shorten it, e.g. the first 32 hex digits of a hash")
        dataset = Dataset(name=name, digest=digest, source_type="local", source=json.dumps({"uri": str(source)}),
                          profile=json.dumps(profile, default=_json_number))
        self.client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def artifact_uri(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.artifact_uri

    @property
    def remote(self) -> bool:
        """Whether this is a tracking server (``http(s)://``) rather than a local store."""
        return self.tracking_uri.startswith(("http://", "https://"))

    def _version(self, name: str, *, source: str, run_id: str, identity: Mapping[str, str],
                 tags: Mapping[str, str] | None = None) -> tuple[int, bool]:
        """(version of ``name`` whose ``source`` equals ``source`` and whose tags hold every ``identity`` item,
        whether it was created now). Only when none matches is ``source`` registered, tagged ``identity`` plus
        ``tags``; the registered model is created first if missing.

        On a tracking server a version cannot point at a local folder (the server refuses local sources), so the
        folder ``source`` is uploaded as the artifact ``registered/<name>`` of ``run_id`` and the version points at
        that copy; an existing version is then matched by its ``identity`` tags alone (its source is run-specific).
        """
        if not self.client.search_registered_models(filter_string=f"name = '{name}'"):
            self.client.create_registered_model(name)
        wanted = {k: str(v) for k, v in identity.items()}
        matches = [int(v.version) for v in self.client.search_model_versions(f"name = '{name}'")
                   if (self.remote or v.source == source) and all(v.tags.get(k) == val for k, val in wanted.items())]
        if matches:
            return min(matches), False
        if self.remote:
            self.client.log_artifacts(run_id, source, f"registered/{name}")
            wanted["local_source"] = source
            source = f"{self.artifact_uri(run_id)}/registered/{name}"
        created = self.client.create_model_version(
            name, source=source, run_id=run_id, tags={**wanted, **{k: str(v) for k, v in (tags or {}).items()}})
        return int(created.version), True

    @_whole
    def register_version(self, name: str, *, source: str, run_id: str, identity: Mapping[str, str],
                         tags: Mapping[str, str] | None = None) -> int:
        """The version of ``name`` with this ``source`` and ``identity`` tags, registered if missing; ``tags``
        are (re)set on it either way. Returns the version number."""
        version, _ = self._version(name, source=source, run_id=run_id, identity=identity)
        for key, value in (tags or {}).items():
            self.client.set_model_version_tag(name, str(version), key, str(value))
        return version

    @_whole
    def point_alias(self, name: str, alias: str, *, source: str, run_id: str, identity: Mapping[str, str],
                    tags: Mapping[str, str] | None = None) -> tuple[int, bool]:
        """Point ``alias`` of the registered model ``name`` at the version identified by ``identity``.

        A version matches when its ``source`` equals ``source`` and its tags hold every ``identity`` item. Only
        when none matches is ``source`` registered as a new version (tags: ``identity`` plus ``tags``), so
        publishing an older decision again moves the alias back to its version instead of adding a duplicate.

        Returns:
            (version number, whether it was created now).
        """
        version, created = self._version(name, source=source, run_id=run_id, identity=identity, tags=tags)
        self.client.set_registered_model_alias(name, alias, str(version))
        return version, created
