"""``pretrain eval CHECKPOINT --harness TASKS``: a checkpoint scored by lm-evaluation-harness tasks (Gao et al. 2024).

The checkpoint is a checkpoint directory of this platform (or a stage artifact holding one), or a Hugging Face model
folder the decoder can represent (``models.hf.decoder_from_hf``). Its tokenizer is, in order: ``--tokenizer DIR``;
the tokenizer artifact whose hash the checkpoint records (``flows.export.trained_tokenizer``); the tokenizer files
of a Hugging Face folder. A tokenizer whose hash differs from the recorded one is refused.

``TASKS`` are lm_eval task, group or tag names, or paths of task YAML files (their folders join the harness's include
path); the project's cloze sets are shipped as ``pretrain_cloze_general``, ``pretrain_cloze_domain`` and
``pretrain_cloze_demo`` (``evals/harness_tasks``). The results go to

- DuckDB ``harness_results``: one row per (task, metric): checkpoint, task, metric, filter, value, stderr, n, with
  ``num_fewshot``, ``doc_limit`` (``--limit``), the tokenizer hash and the MLflow run id; rerunning the same
  (checkpoint, task, few-shot, limit) replaces its rows;
- MLflow: one run in the experiment of the run that produced the checkpoint (else the experiment ``harness``),
  metrics ``<task>.<metric>`` and ``<task>.<metric>_stderr``, the output folder as artifacts;
- the output folder (``--out``, default ``<runs>/harness/<key>/``): ``results.json`` (the harness's results without
  samples), ``samples_<task>.jsonl`` (its logged per-document samples) and ``results.parquet``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd

from infra.errors import ConfigError
from flows.export import checkpoint_tokenizer as load_tokenizer, load_checkpoint
from infra.runs import RunsLayout, ensure_folder

DEFAULT_EXPERIMENT = "harness"
TABLE = "harness_results"


def _experiment(layout: RunsLayout, folder: Path) -> tuple[str, str]:
    """(MLflow experiment, producing run id or "") for a checkpoint inside a stage artifact of this store."""
    for parent in [folder, *folder.resolve().parents][:3]:
        meta = parent / "meta.json"
        if meta.is_file():
            run_id = json.loads(meta.read_text()).get("mlflow_run_id", "")
            if run_id:
                try:
                    from mlflow import MlflowClient

                    client = MlflowClient(tracking_uri=layout.tracking_uri)
                    return client.get_experiment(client.get_run(run_id).info.experiment_id).name, run_id
                except Exception:  # the run lives in another store: keep the default experiment
                    return DEFAULT_EXPERIMENT, run_id
    return DEFAULT_EXPERIMENT, ""


def _result_key(identity: str, task: str, num_fewshot: int | None, limit: int | None, tokenizer_hash: str) -> str:
    payload = json.dumps([identity, task, num_fewshot, limit, tokenizer_hash])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _identity(folder: Path) -> str:
    """The checkpoint's content identity: its checksums record, else its config and weights files' hashes."""
    for name in ("checksums.json", "model.safetensors"):
        if (folder / name).is_file():
            return hashlib.sha256((folder / name).read_bytes()).hexdigest()
    return str(folder.resolve())


def harness_eval(checkpoint: Path, tasks: list[str], layout: RunsLayout, *, tokenizer: Path | None = None,
                 limit: int | None = None, num_fewshot: int | None = None, out: Path | None = None,
                 batch_size: int = 16) -> dict[str, Any]:
    """Score ``checkpoint`` on the harness ``tasks`` and record the results (module docstring).

    Returns:
        {"results": DataFrame(task, metric, filter, value, stderr, n), "out": folder written, "mlflow_run_id",
        "experiment", "tokenizer": the tokenizer's path}.

    Raises:
        CheckpointError, ConfigError: as ``load_checkpoint``, ``load_tokenizer`` and ``evals.harness.evaluate``
            (unknown tasks, missing task files, bad ``limit`` / ``num_fewshot``).
    """
    from evals.harness import DecoderLM, evaluate, results_frame
    from infra.tracking import Tracker
    from infra.warehouse import Warehouse

    if not tasks:
        raise ConfigError("--harness names no task; give a comma list of lm_eval task names or task YAML paths")
    model, record, folder = load_checkpoint(checkpoint)
    tok = load_tokenizer(folder, record, tokenizer, layout)
    if tok["tokenizer"].get_vocab_size() > model.cfg.vocab_size:
        raise ConfigError(f"the tokenizer {tok['path']} has {tok['tokenizer'].get_vocab_size()} tokens, more than "
                          f"the model's {model.cfg.vocab_size} embedding rows")
    started = time.time()
    lm = DecoderLM(model, tok["tokenizer"], tok["eos_id"], batch_size=batch_size)
    output = evaluate(lm, tasks, limit=limit, num_fewshot=num_fewshot, log_samples=True)
    frame = results_frame(output)
    identity = _identity(folder)
    key = _result_key(identity, ",".join(tasks), num_fewshot, limit, tok["tokenizer_hash"])
    folder_out = Path(out) if out is not None else layout.root / "harness" / key
    folder_out.mkdir(parents=True, exist_ok=True)
    samples = output.pop("samples", {}) or {}
    (folder_out / "results.json").write_text(json.dumps(output, indent=2, default=str))
    for task, rows in samples.items():
        with open(folder_out / f"samples_{task}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, default=str, ensure_ascii=False) + "\n")
    ensure_folder(layout.root)
    experiment, source_run = _experiment(layout, folder)
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, experiment)
    run_id = tracker.start_run(f"harness {folder.name}", tags={"harness.checkpoint": str(folder),
                                                                "harness.source_run": source_run})
    try:
        tracker.log_params(run_id, {"checkpoint": str(folder), "tasks": ",".join(tasks), "limit": limit,
                                    "num_fewshot": num_fewshot, "tokenizer_hash": tok["tokenizer_hash"],
                                    "batch_size": batch_size, "lm_eval_version": _lm_eval_version()})
        metrics = {}
        for row in frame.to_dict("records"):
            name = _metric_name(row["task"], row["metric"], row["filter"])
            metrics[name] = row["value"]
            metrics[f"{name}_stderr"] = row["stderr"]
        tracker.log_metrics(run_id, metrics, step=0)
        table = frame.assign(checkpoint=str(folder), num_fewshot=num_fewshot, doc_limit=limit,
                             tokenizer_hash=tok["tokenizer_hash"], checkpoint_identity=identity,
                             mlflow_run_id=run_id, evaluated_at=pd.Timestamp.fromtimestamp(started, tz="UTC"))
        # Typed even when unset: a first table created from all-None columns would be typed NULL in DuckDB.
        table = table.astype({"num_fewshot": "Int64", "doc_limit": "Int64"})
        table.to_parquet(folder_out / "results.parquet", index=False)
        warehouse = Warehouse(layout.duckdb)
        for task, rows in table.groupby("task", sort=False):
            warehouse.replace(TABLE, rows.reset_index(drop=True),
                              _result_key(identity, str(task), num_fewshot, limit, tok["tokenizer_hash"]))
        tracker.log_artifact(run_id, folder_out, "harness")
        tracker.end_run(run_id)
    except BaseException:
        tracker.end_run(run_id, status="FAILED")
        raise
    return {"results": frame, "out": folder_out, "mlflow_run_id": run_id, "experiment": experiment,
            "tokenizer": tok["path"]}


def _metric_name(task: str, metric: str, filter_name: str) -> str:
    """``<task>.<metric>`` (``.<filter>`` unless ``none``), in the characters MLflow accepts."""
    name = f"{task}.{metric}" + ("" if filter_name == "none" else f".{filter_name}")
    return re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", name)


def _lm_eval_version() -> str:
    import lm_eval

    return lm_eval.__version__
