"""What an export artifact puts into MLflow: the verification record, and the model registry: the exported
folder is the version behind the alias ``kept`` of ``<experiment>-base``, so
``mlflow.artifacts.download_artifacts("models:/<experiment>-base@kept")`` gives a folder ``transformers`` loads."""

from __future__ import annotations

import json
from typing import Any

from infra.stage import PublishContext, Published, Registration, SummaryContext
from tasks.export.stage import MODEL_DIR, kept_model


def publish(ctx: PublishContext) -> Published:
    path, key, experiment = ctx.artifact.path, ctx.artifact.key, ctx.cfg.name
    record = json.loads((path / MODEL_DIR / "export.json").read_text())
    gate = ctx.inputs.get("gate")
    decision = kept_model(gate.path) if gate is not None else {}
    out = Published(files=[f"{MODEL_DIR}/export.json"],
                    metrics={"max_abs_logit_diff": record["max_abs_logit_diff"],
                             "greedy_equal": float(record["greedy_equal"])},
                    tags={"architecture": record["architecture"], "exported_checkpoint": record["checkpoint"],
                          "transformers_version": record["transformers_version"]},
                    parent_tags={"exported_model": str(path / MODEL_DIR)})
    # Cached or not: a cached export may repeat an older decision after a different one moved the alias. The
    # version is found by the export artifact key and the folder; it is created the first time only.
    tags = {"candidate": decision.get("kept", ""), "gate_hash": decision.get("gate_hash", ""),
            "checkpoint": record["checkpoint"], "format": "transformers", "architecture": record["architecture"],
            "max_abs_logit_diff": f"{record['max_abs_logit_diff']:.3g}"}
    if gate is not None:
        tags["gate_artifact_key"] = gate.key
    out.registrations.append(Registration(f"{experiment}-base", str(path / MODEL_DIR),
                                          identity={"export_artifact_key": key}, tags=tags, alias="kept"))
    return out


def summary(ctx: SummaryContext) -> list[Any]:
    """Where the exported folder is and what its verification measured."""
    record = json.loads((ctx.path / MODEL_DIR / "export.json").read_text())
    experiment = ctx.cfg.name if ctx.cfg is not None else "<experiment>"
    return [f"[bold]Hugging Face export[/]\n{record['architecture']} in {ctx.path / MODEL_DIR}: max |logit "
            f"difference| {record['max_abs_logit_diff']:.2g} (tolerance {record['tolerance']:g}, fp32), greedy "
            f"continuations {'equal' if record['greedy_equal'] else 'differ'}; registered as "
            f"models:/{experiment}-base@kept"]
