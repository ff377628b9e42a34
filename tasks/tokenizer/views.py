"""What the console summary and ``pretrain report`` show of the tokenizer artifact: characters and tokens per
word by language and source, and the fragmentation of domain terms."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, Text, rich_table
from infra.stage import ReportContext, SummaryContext


def summary(ctx: SummaryContext) -> list[Any]:
    """The per-language table of the held-out split, titled with the vocabulary sizes."""
    report = pd.read_parquet(ctx.path / "report.parquet")
    heldout = report["split"] == "heldout" if "split" in report else True  # text the tokenizer never saw
    lang = report[(report["group_by"] == "language") & heldout][["group", "n_docs", "n_tokens", "chars_per_token",
                                                                  "tokens_per_word", "word_unit"]]
    meta = json.loads((ctx.path / "tokenizer.meta.json").read_text())
    return [rich_table(f"Tokenizer (vocab {meta['vocab_size']:,}, padded {meta['padded_vocab_size']:,}) "
                       "per language, held-out split", lang)]


def report(ctx: ReportContext) -> list[Block]:
    """The tokenizer's vocabulary, hash and fit weights, its tables per language and per source, and the
    fragmentation of domain terms when the artifact has it."""
    path = ctx.path
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    report = pd.read_parquet(path / "report.parquet")
    origin = (f"Pretrained tokenizer `{meta['pretrained']['path']}` (EOS `{meta['pretrained']['eos_token']}`)"
              if "pretrained" in meta else "Byte-level BPE")
    out: list[Block] = [Heading("Tokenizer"), Text(
        f"{origin}, vocabulary {meta['vocab_size']:,} (embedding padded to {meta['padded_vocab_size']:,}), "
        f"hash `{meta['tokenizer_hash'][:16]}`."
        + ("" if "pretrained" in meta else " Fit sample weights: "
           + ", ".join(f"{s} {w:.3f}" for s, w in meta.get("fit_weights", {}).items())))]
    columns = ["group", "split", "n_docs", "n_tokens", "chars_per_token", "tokens_per_word", "word_unit"]
    for group_by in ("language", "source"):
        rows = report[report["group_by"] == group_by]
        out.append(TableBlock(f"Characters per token per {group_by} (a Chinese 'word' is a character)",
                              rows[[c for c in columns if c in rows]].sort_values(["group", "split"])))
    if (path / "fragmentation.parquet").exists():
        frag = pd.read_parquet(path / "fragmentation.parquet")
        frag["pieces"] = frag["pieces"].map(lambda p: " · ".join(map(str, p)))
        out.append(TableBlock("Fragmentation of domain terms", frag))
    return out
