"""What a tokenizer artifact puts into DuckDB and MLflow: its reports, the held-out decontamination removals, the
per-source table (tokens per split, the fit sample's composition; ``tokenizer_sources``), the token shards of each
source as a dataset input, token counts in the corpus manifest, and chars/token metrics."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from infra.stage import Dataset, PublishContext, Published, TableUpdate
from tasks.tokenizer.composition import source_table

OPTIONAL_TABLES = {"fragmentation.parquet": "tokenizer_fragmentation"}


def publish(ctx: PublishContext) -> Published:
    path, key = ctx.artifact.path, ctx.artifact.key
    report = pd.read_parquet(path / "report.parquet")
    out = Published(tables={"tokenizer_report": report})
    if (path / "removals.parquet").exists():  # held-out decontamination joins the one removal ledger
        out.tables["removals"] = pd.read_parquet(path / "removals.parquet")
    present = [name for name in OPTIONAL_TABLES if (path / name).exists()]
    out.tables |= {OPTIONAL_TABLES[name]: pd.read_parquet(path / name) for name in present}
    out.metrics, out.params = _metrics(path, report), _params(path)
    headers = pd.read_parquet(path / "shards.parquet")
    corpus_key = ctx.artifact.meta["input_keys"]["corpus"]
    sources = source_table(path, headers)
    out.tables["tokenizer_sources"] = sources.assign(corpus_key=corpus_key)
    out.datasets += source_datasets(key, path / "shards", sources)
    # The manifest's own column, for the last tokenizer published on that corpus; tokenizer_sources keeps every one.
    out.updates = [TableUpdate("manifest", {"tokens": int(r.tokens)}, {"artifact_key": corpus_key, "source": r.source})
                   for r in sources.itertuples()]
    out.files = ["tokenizer.json", "tokenizer.meta.json", "report.parquet", "sources.parquet", *present]
    return out


def source_datasets(key: str, shards: Path, sources: pd.DataFrame) -> list[Dataset]:
    """One MLflow dataset input per source, ``token_shards/<source>``: digest the first 16 hex digits of
    SHA-256(tokenizer key / source) (an artifact's content is fixed by its key), profile its documents and tokens
    per split."""
    datasets = []
    for r in sources.itertuples():
        digest = hashlib.sha256(f"{key}/{r.source}".encode()).hexdigest()[:16]
        profile = {"train_docs": int(r.train_docs), "train_tokens": int(r.train_tokens),
                   "heldout_docs": int(r.heldout_docs), "heldout_tokens": int(r.heldout_tokens),
                   "tokens": int(r.tokens), "tokenizer_hash": r.tokenizer_hash, "manifest_hash": r.manifest_hash}
        datasets.append(Dataset(f"token_shards/{r.source}", digest, shards / r.source, "training", profile))
    return datasets


def _metrics(path: Path, report: pd.DataFrame) -> dict[str, float]:
    """Held-out chars/token and tokens/word per language and source (tokens per non-space character where the
    word unit is the character), and the tokens per domain term."""
    metrics = {}
    for r in (report[report["split"] == "heldout"] if "split" in report else report).itertuples():
        metrics[f"chars_per_token.{r.group_by}.{r.group}"] = r.chars_per_token
        unit = "nonspace_char" if r.word_unit == "char" else r.word_unit
        metrics[f"tokens_per_{unit}.{r.group_by}.{r.group}"] = r.tokens_per_word
    if (path / "fragmentation.parquet").exists():
        for r in pd.read_parquet(path / "fragmentation.parquet").itertuples():
            metrics[f"tokens_per_term.{r.term}"] = r.n_tokens
    return metrics


def _params(path: Path) -> dict:
    """The fit sample's rule, weights and characters drawn per source."""
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    return {**({"fit_rule": meta["fit_rule"]} if "fit_rule" in meta else {}),
            **{f"fit_weight.{s}": round(w, 6) for s, w in meta.get("fit_weights", {}).items()},
            **{f"fit_sample_chars.{s}": n for s, n in meta.get("fit_sample_chars", {}).items()}}
