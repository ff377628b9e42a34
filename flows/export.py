"""``pretrain export CHECKPOINT OUT``: any checkpoint directory as a verified Hugging Face folder.

The tokenizer is the one the checkpoint was trained with: the tokenizer artifact whose hash the checkpoint's
state.json records (``extra.tokenizer_hash``), looked up in the runs folder that holds the checkpoint and in the
configured runs folder. ``--tokenizer DIR`` names it instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.errors import CheckpointError
from infra.runs import RunsLayout


def checkpoint_folder(path: Path) -> Path:
    """``path`` itself, or its ``checkpoint/`` when ``path`` is a stage artifact folder (``runs/artifacts/main/<key>``).

    Raises:
        CheckpointError: nothing exists at ``path``.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; give a checkpoint directory (one holding model.safetensors "
                              "and state.json, e.g. runs/artifacts/main/<key>/checkpoint)")
    if (path / "checkpoint").is_dir() and not (path / "state.json").exists():
        return path / "checkpoint"
    return path


def _runs_folders(checkpoint: Path, layout: RunsLayout) -> list[RunsLayout]:
    """The runs folder a checkpoint lies in (the parent of its ``artifacts/``), then the configured one."""
    own = [parent.parent for parent in checkpoint.resolve().parents if parent.name == "artifacts"][:1]
    return [RunsLayout(root) for root in dict.fromkeys([*own, layout.root])]


def trained_tokenizer(checkpoint: Path, layout: RunsLayout, record: dict | None = None) -> Path:
    """The tokenizer artifact the checkpoint was trained with (module docstring); ``record`` is the checkpoint's
    ``verify_checkpoint`` record when the caller has it already (the check hashes every file).

    Raises:
        CheckpointError: the checkpoint records no tokenizer hash, or no runs folder searched has a tokenizer
            artifact with it; the message says to pass ``--tokenizer DIR``.
    """
    from flows.evaluate import find_tokenizer
    from tasks.train.checkpoint import verify_checkpoint

    saved = (record if record is not None else verify_checkpoint(checkpoint)).get("extra", {}).get("tokenizer_hash")
    if not saved:
        raise CheckpointError(f"{checkpoint} records no tokenizer_hash, so its tokenizer cannot be found; pass "
                              "--tokenizer DIR (a folder with tokenizer.json and tokenizer.meta.json)")
    errors = []
    for runs in _runs_folders(checkpoint, layout):
        try:
            return find_tokenizer(runs, saved)
        except CheckpointError as err:
            errors.append(str(err))
    raise CheckpointError(f"{checkpoint} was trained with tokenizer {saved!r}, which no runs folder searched holds "
                          f"({'; '.join(errors)}); pass --tokenizer DIR, or --runs-dir the runs folder that has it")


def export(checkpoint: Path, out: Path, tokenizer: Path | None, layout: RunsLayout) -> dict[str, Any]:
    """Export ``checkpoint`` (or a stage artifact's checkpoint) to ``out`` with its tokenizer; the verified record
    (``tasks.export.hf.export_checkpoint``), plus ``tokenizer_dir``."""
    from tasks.export.hf import export_checkpoint

    checkpoint = checkpoint_folder(checkpoint)
    tokenizer_dir = Path(tokenizer) if tokenizer is not None else trained_tokenizer(checkpoint, layout)
    return export_checkpoint(checkpoint, tokenizer_dir, Path(out))
