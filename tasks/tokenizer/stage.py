"""Tokenizer stage: split held-out documents, fit BPE on the training split (or adopt the pretrained tokenizer of
``[tokenizer] pretrained``), pack token shards, report.

Training documents sharing a 13-gram with a held-out document of any source are removed before fitting
(``removals.parquet``, same columns as the corpus ledger, stage ``decontam_heldout``).

Outputs: ``tokenizer.json``, ``splits.parquet`` (doc_id, source, split), ``shards/<source>/<split>.{bin,json,idx.npy}``,
``shards.parquet`` (one header row per shard), ``report.parquet`` (chars/token and tokens/word by language and by
source, on each split: held-out rows measure text the tokenizer never saw), ``fragmentation.parquet`` (the
configured domain terms), ``packing.parquet`` (documents cut and padding under both packing policies at the
experiment's row lengths), ``tokenizer.meta.json`` (hash, EOS and pad ids, vocab sizes, the fit weights and the
characters drawn per source).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tokenizers import Tokenizer

from infra.errors import ConfigError
from infra.stage import StageContext
from tasks.readers import load_kept, manifest_hash
from tasks.train.heldout_overlap import decontaminate_train
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer, padded_vocab_size, sample_texts, tokenizer_hash
from tasks.train.pretrained_tokenizer import files_digest, read_pretrained
from tasks.train.shards import vocab_span
from tasks.train.packing import POLICIES, plan_rows
from tasks.tokenizer.report import fragmentation, tokenizer_reports
from tasks.tokenizer.encode import pack_shards
from tasks.tokenizer.split import assign_splits
from tasks.train.data import TokenStream


def run(ctx: StageContext, cfg: TokenizerConfig) -> dict[str, Any]:
    """Split → fit on a mixture-weighted sample of train only (or adopt ``cfg.pretrained``) → pack every
    (source, split) → report.

    Returns vocab and token counts. (How the shards are cut into rows depends on each model's row length, so the
    packing report is written by the training stages, see :func:`packing_report`.)

    Raises:
        ConfigError: ``fit_weights`` names a source with no training documents; the pretrained tokenizer cannot be
            read or has no EOS.
    """
    kept = load_kept(ctx.inputs["corpus"])
    kept = kept.assign(split=assign_splits(kept, cfg).values)
    kept, removals = decontaminate_train(kept, ngram=cfg.decontam_ngram, common_min_docs=cfg.decontam_common_docs)
    removals.to_parquet(ctx.out / "removals.parquet", index=False)
    kept[["doc_id", "source", "family_id", "split"]].to_parquet(ctx.out / "splits.parquet", index=False)
    if cfg.pretrained:
        tok, meta = _adopt(ctx, cfg)
    else:
        tok, meta = _fit(ctx, cfg, kept[kept["split"] == "train"])
    meta["manifest_hash"] = manifest_hash(ctx.inputs["corpus"])
    headers = _pack(ctx, cfg, tok, kept, meta)
    (ctx.out / "tokenizer.meta.json").write_text(json.dumps(meta, indent=2))
    report = pd.concat([tokenizer_reports(tok, part).assign(split=split)
                        for split, part in kept.groupby("split", sort=True)])
    report.to_parquet(ctx.out / "report.parquet", index=False)
    fragmentation(tok, cfg.domain_terms).to_parquet(ctx.out / "fragmentation.parquet", index=False)
    return {**{k: v for k, v in meta.items() if k not in ("fit_sample_chars", "fit_weights")},
            "decontaminated_train_docs": len(removals),
            "tokens": {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}}


def _fit(ctx: StageContext, cfg: TokenizerConfig, train: pd.DataFrame) -> tuple[Tokenizer, dict[str, Any]]:
    """Fit BPE on a mixture-weighted sample of the training split; writes ``tokenizer.json``."""
    by_source = {name: list(group["text"]) for name, group in train.groupby("source", sort=True)}
    weights = fit_weights(cfg, {name: sum(map(len, texts)) for name, texts in by_source.items()})
    sample, sample_chars = sample_texts(by_source, weights, cfg.sample_max_chars, cfg.seed)
    with ctx.progress.task("tokenizer: fitting BPE", None):
        tok = fit_tokenizer(sample, cfg)
    tok.save(str(ctx.out / "tokenizer.json"))
    pad = tok.token_to_id("<|pad|>")
    return tok, {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": eos_id(tok), "pad_id": eos_id(tok) if pad is None else pad,
        "vocab_size": tok.get_vocab_size(), "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple),
        "fit_weights": weights, "fit_sample_chars": sample_chars, "fit_sample_docs": len(sample),
    }


def _adopt(ctx: StageContext, cfg: TokenizerConfig) -> tuple[Tokenizer, dict[str, Any]]:
    """Adopt ``cfg.pretrained`` as it is (no fit): its ``tokenizer.json`` is copied byte for byte; the meta
    records where it came from, its files' SHA-256 and its EOS token.

    Raises:
        ConfigError: as :func:`tasks.train.pretrained_tokenizer.read_pretrained`.
    """
    pretrained = read_pretrained(cfg.pretrained)
    shutil.copyfile(pretrained.tokenizer_file, ctx.out / "tokenizer.json")
    tok = Tokenizer.from_file(str(ctx.out / "tokenizer.json"))
    return tok, {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": pretrained.eos_id, "pad_id": pretrained.pad_id,
        "vocab_size": pretrained.vocab_size, "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple),
        "pretrained": {"path": str(Path(cfg.pretrained).resolve()), "eos_token": pretrained.eos_token,
                       "files": files_digest(cfg.pretrained)},
    }


def fit_weights(cfg: TokenizerConfig, train_chars: dict[str, int]) -> dict[str, float]:
    """Weights of the fit sample, summing to 1: ``cfg.fit_weights`` normalised, or each source's share of the
    training characters (the natural mixture) when none are given.

    Raises:
        ConfigError: a weighted source has no training documents.
    """
    if not cfg.fit_weights:
        total = sum(train_chars.values())
        return {s: n / total for s, n in sorted(train_chars.items())}
    missing = sorted(s for s, w in cfg.fit_weights.items() if w > 0 and not train_chars.get(s))
    if missing:
        raise ConfigError(f"tokenizer.fit_weights names {missing}, which have no training documents; "
                          f"sources with training text: {sorted(train_chars)}")
    total = sum(cfg.fit_weights.values())
    return {s: w / total for s, w in sorted(cfg.fit_weights.items()) if w > 0}



def _pack(ctx: StageContext, cfg: TokenizerConfig, tok: Tokenizer, kept: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Encode every (source, split) in parts of ``cfg.execution.part_docs`` documents where ``cfg.execution``
    says, and join each into its shard (``tasks.tokenizer.encode``); writes ``shards.parquet``."""
    groups = list(kept.groupby(["source", "split"], sort=True))
    n_calls = sum(-(-len(group) // cfg.execution.part_docs) for _, group in groups)
    with ctx.progress.task("tokenizer: packing shards", n_calls + len(groups)) as advance:
        shard_map = ctx.shard_map_for(cfg.execution, lambda: advance(1))
        headers = pack_shards(groups, tokenizer_path=ctx.out / "tokenizer.json", out=ctx.out,
                              work=ctx.scratch / "encode", part_docs=cfg.execution.part_docs, meta=meta,
                              tokenizer_vocab=vocab_span(tok), shard_map=shard_map, advance=advance)
    shutil.rmtree(ctx.scratch, ignore_errors=True)
    headers.to_parquet(ctx.out / "shards.parquet", index=False)
    return headers
