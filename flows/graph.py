"""The stage graph: each stage's inputs, the config fields in its key, its code, and its plain function.

Data flows one way (docs/methods.md §13: ): sources → corpus → tokenizer → mixture → sweep → main → cpt → gate.
``key_config`` holds only fields that change a stage's result; cosmetic ones (log intervals, thread counts,
checkpoint intervals) stay out, so changing them reuses the cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evals.cloze import load_cloze_items, load_cloze_sets
from flows.config import ExperimentConfig
from infra.errors import ConfigError
from infra.expectations import check_heldout, check_kept_corpus, check_ledger, check_shards
from infra.stage import StageContext


@dataclass(frozen=True)
class StageDef:
    name: str
    inputs: tuple[str, ...]
    modules: tuple[str, ...]
    key_config: Callable[[ExperimentConfig], dict[str, Any]]
    run: Callable[[StageContext, ExperimentConfig], dict[str, Any]]
    validate: Callable[[Path, ExperimentConfig], None] = lambda out, cfg: None


def cloze_paths(cfg: ExperimentConfig) -> list[Path]:
    paths = [Path(p) for p in cfg.gate.cloze_paths]
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"gate.cloze_items: {path} not found (relative paths are read from the working "
                              "directory)")
    return paths


def _sources(cfg):
    """Source configs plus what determines their content, so a key names one content only.

    Debian sources: the release the apt package lists resolve now (version, architecture, .deb SHA256; offline,
    ``tasks.sources.deb.resolve_debs``) instead of the pin, so a moved archive is a new key and pinning the version
    already used keeps the key. Local files: a digest of each matched file's relative path, size and bytes
    (metadata such as mtimes can stay the same while bytes change, as with ``cp -p`` or ``touch -r``).
    """
    from tasks.sources import deb
    from tasks.sources.read import match_files

    releases = deb.resolve_debs((s.package, s.version) for s in cfg.sources.values() if s.kind == "deb")
    keyed = {}
    for name, src in cfg.sources.items():
        keyed[name] = src.model_dump(exclude={"version"})
        if src.kind == "deb":
            keyed[name]["resolved"] = releases[(src.package, src.version)].key_fields()
        else:
            files = match_files(src.include, None)
            keyed[name]["files"] = _file_digest_list([(rel, p.stat().st_size, _content_digest(p)) for rel, p in files])
    return keyed


def _file_digest_list(rows: list) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _content_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _run_sources(ctx, cfg):
    """Fetch the Debian releases the key was computed from (``ctx.key_config``), never ones resolved again later;
    without a key config (library use) they are resolved now."""
    from tasks.sources.deb import DebRelease
    from tasks.sources.stage import run

    keyed = (ctx.key_config or {}).get("sources", {})
    releases = {name: DebRelease(package=src.package, **keyed[name]["resolved"])
                for name, src in cfg.sources.items() if src.kind == "deb" and "resolved" in keyed.get(name, {})}
    return run(ctx, cfg.sources, releases=releases)


def eval_items(cfg: ExperimentConfig):
    """Every evaluation text the platform reports on, for decontamination: the gate's cloze items (context plus
    correct option) and the files in ``corpus.decontamination.eval_files``."""
    from tasks.corpus.decontam import EvalItem, load_eval_files

    cloze = [EvalItem(f"cloze:{path.name}", item.item_id, item.context + item.options[item.answer])
             for path in cloze_paths(cfg) for item in load_cloze_items(path)]
    return cloze + load_eval_files(cfg.corpus.decontamination.eval_files)


def _corpus_key(cfg: ExperimentConfig) -> dict[str, Any]:
    """Corpus settings (without how it is executed) and a digest of every evaluation text it is checked against."""
    items = eval_items(cfg) if cfg.corpus.decontamination.enabled else []
    digest = hashlib.sha256(json.dumps([[i.set_name, i.item_id, i.text] for i in items]).encode()).hexdigest()[:16]
    return {"corpus": cfg.corpus.model_dump(exclude={"execution"}), "eval_items": digest}


def _run_corpus(ctx, cfg):
    from tasks.corpus.stage import run
    return run(ctx, cfg.corpus, eval_items=eval_items(cfg) if cfg.corpus.decontamination.enabled else [])


def _check_corpus(out: Path, cfg: ExperimentConfig) -> None:
    import pandas as pd

    from tasks.corpus.stage import manifest_rows

    languages = cfg.corpus.languages + (["unknown"] if cfg.corpus.unknown_language == "keep" else [])
    kept = pd.read_parquet(out / "kept.parquet", columns=["doc_id", "source", "language", "n_chars"])
    removals = pd.read_parquet(out / "removals.parquet", columns=["doc_id", "source", "stage", "rule"])
    counts = removals.groupby(["source", "rule"]).size()
    why = {str(src): "removed by " + ", ".join(f"{rule} ×{n}" for rule, n in rows.droplevel(0).nlargest(4).items())
           for src, rows in counts.groupby(level=0)}
    check_kept_corpus(kept, list(cfg.sources), languages, why)
    rows = manifest_rows(json.loads((out / "manifest.json").read_text()))
    removed = removals["source"].value_counts()
    check_ledger(rows.assign(removed=[int(removed.get(s, 0)) for s in rows["source"]]), removals)


def _run_tokenizer(ctx, cfg):
    from tasks.tokenizer.stage import run
    return run(ctx, cfg.tokenizer)


def _check_tokenizer(out: Path, cfg: ExperimentConfig) -> None:
    import pandas as pd

    from tasks.tokenizer.shards import shard_facts

    meta = json.loads((out / "tokenizer.meta.json").read_text())
    headers = pd.read_parquet(out / "shards.parquet")
    facts = pd.DataFrame([shard_facts(out / "shards" / r.source / r.split) for r in headers.itertuples()])
    check_shards(pd.concat([headers[["source", "split"]], facts], axis=1), meta["padded_vocab_size"])


def _run_mixture(ctx, cfg):
    from tasks.mixture.stage import run
    return run(ctx, cfg.mixture, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


def _run_sweep(ctx, cfg):
    from tasks.sweep.stage import run
    return run(ctx, cfg.sweep, cfg.proxy, general=cfg.general_sources, packing=cfg.packing)


def _run_main(ctx, cfg):
    from tasks.train.stage import run
    return run(ctx, cfg.main, sources=cfg.general_sources + cfg.domain_sources, max_epochs=cfg.mixture.max_epochs,
               packing=cfg.packing)


def _check_main(out: Path, cfg: ExperimentConfig) -> None:
    import pandas as pd
    check_heldout(pd.read_parquet(out / "heldout.parquet"))


def _run_cpt(ctx, cfg):
    from tasks.cpt.stage import run
    return run(ctx, cfg.cpt, general=cfg.general_sources, cloze_items=load_cloze_sets(cloze_paths(cfg)),
               packing=cfg.packing)


def _run_gate(ctx, cfg):
    from tasks.gate.stage import run
    return run(ctx, cfg.gate)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


STAGES: tuple[StageDef, ...] = (
    StageDef("sources", (), ("tasks.sources",), lambda c: {"sources": _sources(c)}, _run_sources),
    StageDef("corpus", ("sources",), ("tasks.corpus", "infra.expectations"),
             _corpus_key, _run_corpus, _check_corpus),
    StageDef("tokenizer", ("corpus",), ("tasks.tokenizer",),
             lambda c: {"tokenizer": c.tokenizer.model_dump()}, _run_tokenizer, _check_tokenizer),
    StageDef("mixture", ("tokenizer",), ("tasks.mixture", "tasks.train", "models", "evals.heldout"),
             lambda c: {"mixture": c.mixture.model_dump(exclude={"max_epochs"}), "proxy": c.proxy.model_dump(),
                        "packing": c.packing.model_dump(), "seed": c.seed}, _run_mixture),
    StageDef("sweep", ("tokenizer", "mixture"), ("tasks.sweep", "tasks.train", "models", "evals.heldout"),
             lambda c: {"sweep": c.sweep.model_dump(), "proxy": c.proxy.model_dump(), "packing": c.packing.model_dump(),
                        "seed": c.seed}, _run_sweep),
    StageDef("main", ("tokenizer", "mixture", "sweep"), ("tasks.train", "models", "evals.heldout"),
             lambda c: {"main": c.main.model_dump(exclude={"log_every": True, "checkpoint_every": True,
                                                          "keep_checkpoints": True, "async_checkpoints": True,
                                                          "distributed": True,
                                                          "stability": {"instrument_every"}}),
                        "packing": c.packing.model_dump(), "seed": c.seed},
             _run_main, _check_main),
    StageDef("cpt", ("tokenizer", "mixture", "main"), ("tasks.cpt", "tasks.train", "models", "evals"),
             lambda c: {"cpt": c.cpt.model_dump(), "packing": c.packing.model_dump(), "seed": c.seed,
                        "cloze_items": [_file_digest(p) for p in cloze_paths(c)]},
             _run_cpt),
    StageDef("gate", ("main", "cpt"), ("tasks.gate", "evals"),
             lambda c: {"gate": c.gate.model_dump(), "seed": c.seed}, _run_gate),
)

STAGE_NAMES = tuple(s.name for s in STAGES)


def downstream(names: set[str]) -> set[str]:
    """The given stages and every stage that consumes them, directly or not."""
    closed = set(names)
    for stage in STAGES:
        if closed.intersection(stage.inputs):
            closed.add(stage.name)
    return closed
