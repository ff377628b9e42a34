"""What the console summary and ``pretrain report`` show of the tokenizer artifact: characters and tokens per
word by language and source, the fit sample's composition beside the mixture's weights, and the fragmentation of
domain terms."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, Text, rich_table
from infra.stage import ReportContext, SummaryContext
from tasks.readers import CHOICE, load_choice
from tasks.tokenizer.composition import source_table


def summary(ctx: SummaryContext) -> list[Any]:
    """The per-language table of the held-out split, titled with the vocabulary sizes."""
    report = pd.read_parquet(ctx.path / "report.parquet")
    heldout = report["split"] == "heldout" if "split" in report else True  # text the tokenizer never saw
    lang = report[(report["group_by"] == "language") & heldout][["group", "n_docs", "n_tokens", "chars_per_token",
                                                                  "tokens_per_word", "word_unit"]]
    meta = json.loads((ctx.path / "tokenizer.meta.json").read_text())
    out = [rich_table(f"Tokenizer (vocab {meta['vocab_size']:,}, padded {meta['padded_vocab_size']:,}) "
                      "per language, held-out split", lang)]
    composition = fit_composition(ctx.path, ctx.paths.get("mixture"))
    if composition is not None:
        out.append(rich_table(composition_title(meta), composition))
    return out


def fit_composition(path: Path, mixture: Path | None = None) -> pd.DataFrame | None:
    """Per source: role, the fit sample's target weight, characters drawn and their share, the training tokens, the
    natural token share among the general sources (the mixture's reference weights) and, when the mixture artifact
    ``mixture`` is complete, the chosen mixture's weight. None for an artifact without the per-source table or a
    pretrained tokenizer (no fit sample)."""
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    if "fit_weights" not in meta:
        return None
    table = source_table(path)
    frame = pd.DataFrame({
        "source": table["source"], "role": table["role"].replace("", "–"),
        "fit_weight": _floats(table["fit_weight"]), "fit_chars": _ints(table["fit_chars"]),
        "fit_share": _floats(table["fit_share"]), "train_tokens": _ints(table["train_tokens"]),
        "natural_token_share": _floats(table["natural_token_share"])})
    if mixture is not None and (Path(mixture) / CHOICE).exists():
        chosen = load_choice(mixture)
        frame[f"mixture_weight ({chosen['name']})"] = _floats(table["source"].map(_weights(chosen["weights"])))
    return frame


def composition_title(meta: Mapping[str, Any]) -> str:
    """Title of the composition table: the rule and the sample size."""
    rule = {"declared": "[tokenizer] fit_weights", "general_natural": "general sources at their natural shares",
            "general_natural+domain_share": "general sources at their natural shares + [cpt] domain share"}
    drawn = sum(meta.get("fit_sample_chars", {}).values())
    return (f"Tokenizer fit sample ({rule.get(meta.get('fit_rule', ''), 'natural shares of all sources')}; "
            f"{drawn:,} characters, training split) beside the mixture's weights")


def _weights(weights: Mapping[str, float]):
    return lambda source: weights.get(source, 0.0)


def _floats(column: pd.Series) -> list:
    return ["–" if pd.isna(v) else float(v) for v in column]


def _ints(column: pd.Series) -> list:
    return ["–" if pd.isna(v) else int(v) for v in column]


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
    composition = fit_composition(path, ctx.paths.get("mixture"))
    if composition is not None:
        out.append(TableBlock(composition_title(meta), composition))
    columns = ["group", "split", "n_docs", "n_tokens", "chars_per_token", "tokens_per_word", "word_unit"]
    for group_by in ("language", "source"):
        rows = report[report["group_by"] == group_by]
        out.append(TableBlock(f"Characters per token per {group_by} (a Chinese 'word' is a character)",
                              rows[[c for c in columns if c in rows]].sort_values(["group", "split"])))
    if (path / "fragmentation.parquet").exists():
        frag = pd.read_parquet(path / "fragmentation.parquet")
        out.append(TableBlock("Fragmentation of domain terms", frag))
    return out
