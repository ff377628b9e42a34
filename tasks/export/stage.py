"""Export stage: the gate's kept checkpoint and the experiment's tokenizer as a Hugging Face folder.

Outputs: ``model/`` (``tasks.export.hf``: config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json, export.json with the verification figures). The folder exists only if it reloaded through
``transformers`` with the checkpoint's logits and greedy continuations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.stage import StageContext
from tasks.export.hf import EXPORT_STEPS, export_checkpoint

DECISION = "decision.json"  # gate: the kept candidate and its checkpoint path
MODEL_DIR = "model"  # the Hugging Face folder inside the artifact: the registered version's source


def kept_model(gate_dir: Path) -> dict[str, Any]:
    """The gate's decision record: ``kept`` (candidate name), ``kept_checkpoint`` (its folder), ``gate_hash``."""
    return json.loads((Path(gate_dir) / DECISION).read_text())


def run(ctx: StageContext) -> dict[str, Any]:
    """Export and verify the kept checkpoint; returns the verification's headline figures."""
    decision = kept_model(ctx.inputs["gate"])
    with ctx.progress.task("export: load, write, reload and verify the Hugging Face folder (steps)",
                           EXPORT_STEPS) as advance:
        record = export_checkpoint(Path(decision["kept_checkpoint"]), ctx.inputs["tokenizer"], ctx.out / MODEL_DIR,
                                   advance=advance)
    return {"kept": decision["kept"], "architecture": record["architecture"],
            "max_abs_logit_diff": record["max_abs_logit_diff"], "greedy_equal": record["greedy_equal"]}
