"""Tokenizer stage: split held-out documents, fit BPE on the training split (or adopt the pretrained tokenizer of
``[tokenizer] pretrained``), pack token shards, report.

Training documents sharing a 13-gram with a held-out document of any source are removed before fitting
(``removals.parquet``, same columns as the corpus ledger, stage ``decontam_heldout``).

Outputs: ``tokenizer.json``, ``splits.parquet`` (doc_id, source, split), ``shards/<source>/<split>.{bin,json,idx.npy}``,
``shards.parquet`` (one header row per shard), ``report.parquet`` (chars/token and tokens/word by language and by
source, on each split: held-out rows measure text the tokenizer never saw), ``fragmentation.parquet`` (the
configured domain terms), ``packing.parquet`` (documents cut and padding under both packing policies at the
experiment's row lengths), ``tokenizer.meta.json`` (hash, EOS and pad ids, vocab sizes, the fit rule, weights,
roles, training characters and the characters drawn per source), ``sources.parquet`` (per source: documents,
bytes and tokens of each split, the fit sample's weight, characters drawn and share;
``tasks.tokenizer.composition.SOURCE_COLUMNS``).
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
from tasks.train.heldout_overlap import decontam_documents, decontaminate_train
from tasks.tokenizer.composition import (RULE_DECLARED, RULE_GENERAL, RULE_GENERAL_DOMAIN, default_fit_weights,
                                         source_counts)
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer, padded_vocab_size, sample_texts, tokenizer_hash
from tasks.train.pretrained_tokenizer import files_digest, read_pretrained
from tasks.train.shards import vocab_span
from tasks.train.packing import POLICIES, plan_rows
from tasks.tokenizer.report import fragmentation, tokenizer_reports
from tasks.tokenizer.encode import pack_shards
from tasks.tokenizer.split import assign_splits
from tasks.train.data import TokenStream


def run(ctx: StageContext, cfg: TokenizerConfig, *, general: Sequence[str] | None = None,
        domain: Sequence[str] = ()) -> dict[str, Any]:
    """Split → fit on a mixture-weighted sample of train only (or adopt ``cfg.pretrained``) → pack every
    (source, split) → report.

    ``general`` (the general sources; None: every source) and ``domain`` (``[cpt] domain_sources``) set the fit
    sample's default weights (:func:`fit_weights`).

    Returns vocab and token counts. (How the shards are cut into rows depends on each model's row length, so the
    packing report is written by the training stages, see :func:`packing_report`.)

    Raises:
        ConfigError: ``fit_weights`` names a source with no training documents, no general source has training
            text, or ``fit_domain_share`` has no domain source to draw from; the pretrained tokenizer cannot be
            read or has no EOS.
    """
    kept = load_kept(ctx.inputs["corpus"])
    with ctx.progress.task("tokenizer: held-out split (documents)", len(kept)) as advance:
        kept = kept.assign(split=assign_splits(kept, cfg, advance).values)
    if cfg.decontam_ngram:
        with ctx.progress.task(f"tokenizer: held-out decontamination, {cfg.decontam_ngram}-grams (documents)",
                               decontam_documents(kept)) as advance:
            kept, removals = decontaminate_train(kept, ngram=cfg.decontam_ngram,
                                                 common_min_docs=cfg.decontam_common_docs, advance=advance)
    else:
        kept, removals = decontaminate_train(kept, ngram=0, common_min_docs=cfg.decontam_common_docs)
    removals.to_parquet(ctx.out / "removals.parquet", index=False)
    kept[["doc_id", "source", "family_id", "split"]].to_parquet(ctx.out / "splits.parquet", index=False)
    if cfg.pretrained:
        tok, meta = _adopt(ctx, cfg)
    else:
        tok, meta = _fit(ctx, cfg, kept[kept["split"] == "train"], general=general, domain=domain)
    meta["manifest_hash"] = manifest_hash(ctx.inputs["corpus"])
    headers = _pack(ctx, cfg, tok, kept, meta)
    (ctx.out / "tokenizer.meta.json").write_text(json.dumps(meta, indent=2))
    train_chars = kept[kept["split"] == "train"].groupby("source")["text"].agg(lambda t: sum(map(len, t)))
    sources = source_counts(headers, meta, roles=_roles(kept["source"].unique(), general),
                            train_chars={s: int(n) for s, n in train_chars.items()})
    sources.to_parquet(ctx.out / "sources.parquet", index=False)
    with ctx.progress.task("tokenizer: efficiency reports (documents)", len(kept)) as advance:
        report = pd.concat([tokenizer_reports(tok, part, advance=advance).assign(split=split)
                            for split, part in kept.groupby("split", sort=True)])
    report.to_parquet(ctx.out / "report.parquet", index=False)
    fragmentation(tok, cfg.domain_terms).to_parquet(ctx.out / "fragmentation.parquet", index=False)
    return {**{k: v for k, v in meta.items() if k not in ("fit_sample_chars", "fit_weights", "fit_roles",
                                                           "fit_train_chars")},
            "decontaminated_train_docs": len(removals),
            "tokens": {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}}


def _fit(ctx: StageContext, cfg: TokenizerConfig, train: pd.DataFrame, *, general: Sequence[str] | None,
         domain: Sequence[str]) -> tuple[Tokenizer, dict[str, Any]]:
    """Fit BPE on a mixture-weighted sample of the training split; writes ``tokenizer.json``."""
    by_source = {name: list(group["text"]) for name, group in train.groupby("source", sort=True)}
    train_chars = {name: sum(map(len, texts)) for name, texts in by_source.items()}
    weights = fit_weights(cfg, train_chars, general=general, domain=domain)
    sample, sample_chars = sample_texts(by_source, weights, cfg.sample_max_chars, cfg.seed)
    with ctx.progress.task("tokenizer: fitting BPE", None):
        tok = fit_tokenizer(sample, cfg)
    tok.save(str(ctx.out / "tokenizer.json"))
    pad = tok.token_to_id("<|pad|>")
    return tok, {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": eos_id(tok), "pad_id": eos_id(tok) if pad is None else pad,
        "vocab_size": tok.get_vocab_size(), "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple),
        "fit_rule": fit_rule(cfg), "fit_weights": weights, "fit_sample_chars": sample_chars,
        "fit_sample_docs": len(sample), "fit_train_chars": dict(sorted(train_chars.items())),
        "fit_roles": _roles(train_chars, general),
    }


def _roles(sources, general: Sequence[str] | None) -> dict[str, str]:
    """Source → "general" or "domain" (every source is general when ``general`` is None)."""
    return {s: "general" if general is None or s in general else "domain" for s in sorted(sources)}


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


def fit_rule(cfg: TokenizerConfig) -> str:
    """How the fit sample was weighed: ``declared`` (``fit_weights``), ``general_natural``, or
    ``general_natural+domain_share`` (``tasks.tokenizer.composition``)."""
    if cfg.fit_weights:
        return RULE_DECLARED
    return RULE_GENERAL_DOMAIN if cfg.fit_domain_share > 0 else RULE_GENERAL


def fit_weights(cfg: TokenizerConfig, train_chars: dict[str, int], *, general: Sequence[str] | None = None,
                domain: Sequence[str] = ()) -> dict[str, float]:
    """Weights of the fit sample, summing to 1: ``cfg.fit_weights`` normalised; when none are given, the general
    sources at their shares of the training characters, and ``cfg.fit_domain_share`` split equally among the
    ``domain`` sources (:func:`tasks.tokenizer.composition.default_fit_weights`; ``general`` None: every source
    is general, so the weights are the natural mixture of all sources).

    Raises:
        ConfigError: a weighted source has no training documents; no general source has training text.
    """
    if not cfg.fit_weights:
        return default_fit_weights(train_chars, general, domain, cfg.fit_domain_share)
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
    headers.to_parquet(ctx.out / "shards.parquet", index=False)
    return headers
