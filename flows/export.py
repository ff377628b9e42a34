"""``pretrain export CHECKPOINT OUT``: any checkpoint as a verified Hugging Face folder; and how every command that
reads a checkpoint (export, generate, eval --harness) finds the model and its tokenizer.

A checkpoint is a checkpoint directory (``model.safetensors`` + ``state.json`` + ``checksums.json``), a stage
artifact folder holding one in ``checkpoint/``, a named checkpoint of a main-run artifact (``<artifact>@<name>``,
or ``main@<name>`` for the runs folder's only main artifact; names such as ``step_00000400``, ``ema``, ``average``:
``tasks.train.milestones``), or a Hugging Face model folder the decoder represents exactly (an
export, or a released base; ``models.hf.decoder_from_hf``). Its tokenizer is the one it was trained with: the
tokenizer artifact whose hash the checkpoint's state.json records (``extra.tokenizer_hash``), looked up in the runs
folder that holds the checkpoint and in the configured runs folder; for a Hugging Face folder, its own tokenizer
files. ``--tokenizer`` names one instead, and must have the recorded hash when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError, ConfigError
from infra.runs import RunsLayout


def checkpoint_folder(path: Path, runs_root: Path | None = None) -> Path:
    """``path`` itself, or its ``checkpoint/`` when ``path`` is a stage artifact folder (``runs/artifacts/main/<key>``),
    or its ``model/`` when it is an export artifact, or the named checkpoint ``<artifact>@<name>`` / ``main@<name>``
    (``tasks.train.milestones.resolve_named``; ``main@`` reads ``runs_root``, default ``RunsLayout.resolve()``).

    Raises:
        CheckpointError: nothing exists at ``path``, a folder that is none of these (e.g. ``runs/artifacts/main``),
            or an unknown name (the message lists the artifact's names).
    """
    from tasks.train.milestones import resolve_named, split_name

    if split_name(path) is not None and not Path(path).exists():
        root = Path(runs_root) if runs_root is not None else RunsLayout.resolve().root
        return resolve_named(path, runs_root=root)
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; give a checkpoint directory (one holding model.safetensors "
                              "and state.json, e.g. runs/artifacts/main/<key>/checkpoint)")
    if (path / "checkpoint").is_dir() and not (path / "state.json").exists():
        return path / "checkpoint"
    if (path / "model" / "config.json").is_file() and not (path / "config.json").exists():
        return path / "model"  # an export stage artifact: its Hugging Face folder
    if path.is_dir() and not any((path / name).exists() for name in ("state.json", "config.json",
                                                                     "model.safetensors")):
        raise CheckpointError(f"{path} is not a checkpoint: it holds no state.json or config.json; give a checkpoint "
                              "directory (runs/artifacts/main/<key>/checkpoint), a stage artifact holding one, or a "
                              "Hugging Face model folder")
    return path


def owning_runs(checkpoint: Path) -> Path | None:
    """The runs folder ``checkpoint`` lies in (the parent of its ``artifacts/`` store), or None."""
    return next((p.parent for p in Path(checkpoint).resolve().parents if p.name == "artifacts"), None)


def _runs_folders(checkpoint: Path, layout: RunsLayout) -> list[RunsLayout]:
    """The runs folder a checkpoint lies in, then the configured one."""
    own = [root for root in [owning_runs(checkpoint)] if root is not None]
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


def load_checkpoint(checkpoint: Path) -> tuple[Any, dict, Path]:
    """(Decoder, its state.json record or {} for a Hugging Face folder, the folder read).

    Raises:
        CheckpointError: missing or corrupt checkpoint. ConfigError: a Hugging Face architecture the decoder cannot
            represent exactly.
    """
    from models.hf import decoder_from_hf, is_hf_folder

    folder = checkpoint_folder(Path(checkpoint))
    if is_hf_folder(folder):
        return decoder_from_hf(folder), {}, folder
    from tasks.train.checkpoint import load_model, verify_checkpoint

    record = verify_checkpoint(folder)
    return load_model(folder), record, folder


def checkpoint_tokenizer(folder: Path, record: dict, tokenizer: Path | None, layout: RunsLayout) -> dict[str, Any]:
    """The tokenizer to read ``folder`` with: ``tokenizer`` when given; else the one the checkpoint was trained with
    (:func:`trained_tokenizer`); else, for a Hugging Face folder, its own tokenizer files. Returns {"tokenizer"
    (``tokenizers.Tokenizer``), "eos_id", "tokenizer_hash", "path"}.

    Raises:
        ConfigError: no tokenizer is recorded or found (pass ``--tokenizer DIR``), or the given one's hash differs
            from the one the checkpoint was trained with.
    """
    from tokenizers import Tokenizer

    from models.hf import is_hf_folder
    from tasks.train.pretrained_tokenizer import read_pretrained, tokenizer_hash

    saved = record.get("extra", {}).get("tokenizer_hash")
    if tokenizer is None and is_hf_folder(folder) and (folder / "tokenizer.json").is_file():
        tokenizer = folder
    if tokenizer is None:
        try:
            tokenizer = trained_tokenizer(folder, layout, record or None)
        except CheckpointError as err:
            raise ConfigError(f"no tokenizer for {folder}: {err}") from None
    path = Path(tokenizer)
    if (path / "tokenizer.meta.json").is_file() and (path / "tokenizer.json").is_file():
        meta = json.loads((path / "tokenizer.meta.json").read_text())
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        eos_id, found = int(meta["eos_id"]), meta.get("tokenizer_hash") or tokenizer_hash(tok)
    else:
        pretrained = read_pretrained(path)  # ConfigError naming what is missing
        tok, eos_id, found = pretrained.load(), pretrained.eos_id, pretrained.tokenizer_hash
    if saved and found != saved:
        raise ConfigError(f"{folder} was trained with tokenizer {saved!r}, {path} holds {found!r}: use the "
                          "tokenizer it was trained with")
    return {"tokenizer": tok, "eos_id": eos_id, "tokenizer_hash": found, "path": path}


def export(checkpoint: Path, out: Path, tokenizer: Path | None, layout: RunsLayout) -> dict[str, Any]:
    """Export ``checkpoint`` (a checkpoint directory, a stage artifact holding one, or a Hugging Face model folder)
    to ``out`` with its tokenizer: ``tokenizer`` when given (a tokenizer artifact, a Hugging Face tokenizer folder
    or a ``tokenizer.json``), else the one it was trained with, else a Hugging Face folder's own. Returns the
    verified record (``tasks.export.hf.export_checkpoint``)."""
    from tasks.export.hf import export_checkpoint

    from models.hf import is_hf_folder

    checkpoint = checkpoint_folder(checkpoint, layout.root)
    if tokenizer is not None:
        tokenizer_dir = Path(tokenizer)
    elif is_hf_folder(checkpoint):  # an exported or released model folder: its own tokenizer files
        if not (checkpoint / "tokenizer.json").is_file():
            raise CheckpointError(f"{checkpoint} is a Hugging Face model folder without tokenizer.json; pass "
                                  "--tokenizer (its tokenizer folder or tokenizer.json)")
        tokenizer_dir = checkpoint
    else:
        tokenizer_dir = trained_tokenizer(checkpoint, layout)
    return export_checkpoint(checkpoint, tokenizer_dir, Path(out))
