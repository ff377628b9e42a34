"""The continued-pretraining stage's face: key (grid, packing, seed, the cloze files' bytes, the base's weights),
run, publish."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def base_digest(folder: Path) -> str:
    """SHA-256 over the files that define a CPT base: the ``checksums.json`` of a checkpoint of this platform (it
    lists every file's SHA-256), else every regular file of a Hugging Face model folder (config, weights, tokenizer),
    by name. A base replaced in place under the same path then gets a new key. Each file is read once per process
    and size and modification time: a large base costs one read of its files per process."""
    folder = Path(folder)
    files = [folder / "checksums.json"] if (folder / "checksums.json").is_file() else sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}\0{_file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)}\0".encode())
    return digest.hexdigest()


def key_extra(cfg: Any) -> dict[str, Any]:
    """The cloze files' bytes, and the content of ``[cpt] base_checkpoint`` when one is given (its path alone is in
    the section): the stage's outputs depend on both."""
    from evals.cloze import cloze_files

    extra: dict[str, Any] = {"cloze_items": [hashlib.sha256(p.read_bytes()).hexdigest()[:16]
                                             for p in cloze_files(cfg.gate.cloze_paths)]}
    if cfg.cpt.base_checkpoint:
        extra["base_weights"] = base_digest(Path(cfg.cpt.base_checkpoint))
    return extra


def run_cpt(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from evals.cloze import cloze_files, load_cloze_sets
    from tasks.cpt.stage import run

    return run(ctx, cfg.cpt, general=cfg.general_sources, cloze_items=load_cloze_sets(cloze_files(cfg.gate.cloze_paths)),
               packing=cfg.packing, samples=cfg.samples)


STAGE = Stage(name="cpt", inputs=("tokenizer", "mixture", "main"), code="tasks.cpt", run=run_cpt,
              sections=("cpt", "packing"), seeded=True, key_extra=key_extra, publish=lazy("tasks.cpt.publish:publish"),
              step_unit="optimiser steps (metrics prefixed by candidate)",
              summary=lazy("tasks.cpt.views:summary"), report=lazy("tasks.cpt.views:report"))
