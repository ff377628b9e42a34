"""What a tokenizer artifact puts into DuckDB and MLflow: its reports, the held-out decontamination removals, the
token shards as a dataset input, token counts in the corpus manifest, and chars/token metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from infra.stage import Dataset, PublishContext, Published, TableUpdate

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
    tokens = {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}
    out.datasets.append(Dataset("token_shards", key, path / "shards", "training", tokens))
    corpus_key = ctx.artifact.meta["input_keys"]["corpus"]
    out.updates = [TableUpdate("manifest", {"tokens": int(n)}, {"artifact_key": corpus_key, "source": source})
                   for source, n in headers.groupby("source")["n_tokens"].sum().items()]
    out.files = ["tokenizer.json", "tokenizer.meta.json", "report.parquet", *present]
    return out


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
    """The fit sample's weights and characters drawn per source."""
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    return {**{f"fit_weight.{s}": round(w, 6) for s, w in meta.get("fit_weights", {}).items()},
            **{f"fit_sample_chars.{s}": n for s, n in meta.get("fit_sample_chars", {}).items()}}
