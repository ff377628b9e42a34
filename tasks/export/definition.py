"""The export stage's face: the gate's kept model as a verified Hugging Face folder (key: the tokenizer and gate
artifacts, the code, the installed ``transformers`` version), run, expectations, publish."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from infra.errors import DataError
from infra.stage import Stage, StageContext, lazy


def key_transformers(cfg: Any) -> dict[str, str]:
    """The written config.json and the verification depend on the transformers release."""
    return {"transformers": version("transformers")}


def run_export(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.export.stage import run

    return run(ctx)


def check_export(out: Path, cfg: Any) -> None:
    """The folder is complete and its own verification passed."""
    from tasks.export.stage import MODEL_DIR

    folder = out / MODEL_DIR
    missing = [name for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                                 "tokenizer_config.json", "export.json") if not (folder / name).is_file()]
    if missing:
        raise DataError(f"export artifact {folder} lacks {missing}")
    record = json.loads((folder / "export.json").read_text())
    if not record.get("passed"):
        raise DataError(f"export artifact {folder} records a failed verification: {record}")


STAGE = Stage(name="export", inputs=("tokenizer", "gate"), code="tasks.export", run=run_export,
              key_extra=key_transformers, validate=check_export, publish=lazy("tasks.export.publish:publish"),
              summary=lazy("tasks.export.publish:summary"))
