"""Tokenizer stage: split held-out documents, fit BPE on the training split, pack token shards, report.

Training documents sharing a 13-gram with a held-out document of any source are removed before fitting
(``removals.parquet``, same columns as the corpus ledger, stage ``decontam_heldout``).

Outputs: ``tokenizer.json``, ``splits.parquet`` (doc_id, source, split), ``shards/<source>/<split>.{bin,json,idx.npy}``,
``shards.parquet`` (one header row per shard), ``report.parquet`` (chars/token and tokens/word by language and
source), ``tokenizer.meta.json`` (hash, EOS id, vocab sizes, the fit sample drawn per source).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from tokenizers import Tokenizer

from infra.stage import StageContext
from tasks.corpus.stage import load_kept, manifest_hash
from tasks.tokenizer.decontam import decontaminate_train
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer, padded_vocab_size, sample_texts, tokenizer_hash
from tasks.tokenizer.report import tokenizer_report
from tasks.tokenizer.shards import encode_documents, read_shard, write_shard
from tasks.tokenizer.split import assign_splits


def run(ctx: StageContext, cfg: TokenizerConfig) -> dict[str, Any]:
    """Split → fit on train only → pack every (source, split) → report; returns vocab and token counts."""
    kept = load_kept(ctx.inputs["corpus"])
    kept = kept.assign(split=assign_splits(kept, cfg).values)
    kept, removals = decontaminate_train(kept, ngram=cfg.decontam_ngram, common_min_docs=cfg.decontam_common_docs)
    removals.to_parquet(ctx.out / "removals.parquet", index=False)
    kept[["doc_id", "source", "family_id", "split"]].to_parquet(ctx.out / "splits.parquet", index=False)
    train = kept[kept["split"] == "train"]
    by_source = {name: list(group["text"]) for name, group in train.groupby("source", sort=True)}
    natural = {name: sum(map(len, texts)) for name, texts in by_source.items()}
    total = sum(natural.values())
    drawn = sample_texts(by_source, {k: v / total for k, v in natural.items()}, cfg.sample_max_chars, cfg.seed)
    sample, sample_chars = drawn if isinstance(drawn, tuple) else (drawn, {})
    with ctx.progress.task("tokenizer: fitting BPE", None):
        tok = fit_tokenizer(sample, cfg)
    tok.save(str(ctx.out / "tokenizer.json"))
    meta = {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": eos_id(tok), "vocab_size": tok.get_vocab_size(),
        "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple), "fit_sample_chars": sample_chars,
        "fit_sample_docs": len(sample), "manifest_hash": manifest_hash(ctx.inputs["corpus"]),
    }
    headers = _pack(ctx, tok, kept, meta)
    (ctx.out / "tokenizer.meta.json").write_text(json.dumps(meta, indent=2))
    report = pd.concat([tokenizer_report(tok, kept, by=by).assign(group_by=by) for by in ("language", "source")])
    report.to_parquet(ctx.out / "report.parquet", index=False)
    return {**{k: v for k, v in meta.items() if k != "fit_sample_chars"}, "decontaminated_train_docs": len(removals),
            "tokens": {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}}


def _pack(ctx: StageContext, tok: Tokenizer, kept: pd.DataFrame, meta: dict) -> pd.DataFrame:
    rows = []
    groups = list(kept.groupby(["source", "split"], sort=True))
    with ctx.progress.task("tokenizer: packing shards", len(groups)) as advance:
        for (source, split), group in groups:
            tokens, offsets = encode_documents(tok, list(group["text"]))
            path = ctx.out / "shards" / source / split
            path.parent.mkdir(parents=True, exist_ok=True)
            write_shard(path, tokens, vocab_size=meta["padded_vocab_size"], eos_id=meta["eos_id"],
                        tokenizer_hash=meta["tokenizer_hash"], n_bytes=int(group["n_bytes"].sum()),
                        doc_offsets=offsets,
                        extra={"source": source, "split": split, "manifest_hash": meta["manifest_hash"]})
            rows.append({"source": source, "split": split, "n_tokens": int(len(tokens)), "n_docs": len(group),
                         "n_bytes": int(group["n_bytes"].sum()), "vocab_size": meta["padded_vocab_size"],
                         "dtype": str(tokens.dtype)})
            advance(1)
    headers = pd.DataFrame(rows)
    headers.to_parquet(ctx.out / "shards.parquet", index=False)
    return headers


class TokenizedCorpus:
    """Read access to a tokenizer artifact: the tokenizer, its identity and the token shards."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.meta = json.loads((self.path / "tokenizer.meta.json").read_text())
        self.headers = pd.read_parquet(self.path / "shards.parquet")

    @property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.path / "tokenizer.json"))

    @property
    def vocab_size(self) -> int:
        return int(self.meta["padded_vocab_size"])

    def tokens(self, source: str, split: str):
        """The shard's flat token array (memmap), checked against this tokenizer's hash."""
        shard = read_shard(self.path / "shards" / source / split, expected_tokenizer_hash=self.meta["tokenizer_hash"])
        return shard.tokens

    def tokens_per_byte(self, source: str, split: str) -> float:
        row = self.headers[(self.headers["source"] == source) & (self.headers["split"] == split)].iloc[0]
        return float(row["n_tokens"]) / float(row["n_bytes"])

    def train_sizes(self, sources: list[str]) -> dict[str, int]:
        train = self.headers[self.headers["split"] == "train"].set_index("source")["n_tokens"]
        return {name: int(train.get(name, 0)) for name in sources}

    def has(self, source: str, split: str) -> bool:
        return bool(((self.headers["source"] == source) & (self.headers["split"] == split)).any())
