"""What the console summary and ``pretrain report`` show of the corpus artifact: the funnel per source, the near
dedup settings and what they found, and the sources' warnings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text, rich_table
from infra.stage import ReportContext, SummaryContext
from tasks.readers import load_removals


def funnel_frame(corpus: Path) -> pd.DataFrame:
    """Documents in, kept and removed per source of the corpus artifact ``corpus``, with its three most frequent
    removal rules (``rule count, ...``).

    Raises:
        OSError: ``manifest.json`` or the removal ledger cannot be read.
    """
    from tasks.corpus.stage import manifest_rows

    manifest = manifest_rows(json.loads((corpus / "manifest.json").read_text()))
    removals = load_removals(corpus, ["source", "rule"])
    top = (removals.groupby(["source", "rule"]).size().rename("n").reset_index()
           .sort_values("n", ascending=False).groupby("source").head(3))
    reasons = top.groupby("source").apply(lambda g: ", ".join(f"{r} {n:,}" for r, n in zip(g["rule"], g["n"])),
                                          include_groups=False)
    return pd.DataFrame({
        "source": manifest["source"], "role": manifest["role"], "docs in": manifest["docs_in"].astype(int),
        "kept": manifest["docs_out"].astype(int), "removed": (manifest["docs_in"] - manifest["docs_out"]).astype(int),
        "top removal rules": [reasons.get(s, "") for s in manifest["source"]],
    })


def summary(ctx: SummaryContext) -> list[Any]:
    """The funnel table, the manifest hash with the boilerplate and near-dup counts, and each source's warnings."""
    out: list[Any] = [rich_table("Corpus funnel per source", funnel_frame(ctx.path))]
    corpus_manifest = json.loads((ctx.path / "manifest.json").read_text())
    out.append(f"  manifest {corpus_manifest['manifest_hash'][:12]} · boilerplate units cut "
               f"{corpus_manifest['boilerplate_units']:,} · near-dup candidate pairs "
               f"{corpus_manifest['near_dedup'].get('candidate_pairs', 0):,} (LSH threshold "
               f"{corpus_manifest['near_dedup']['implied_threshold']:.2f})")
    for name, info in corpus_manifest["sources"].items():
        for warning in info["warnings"]:
            out.append(f"  [yellow]warning:[/] {warning}")
    return out


def report(ctx: ReportContext) -> list[Block]:
    """Sources and corpus: documents (and tokens, from DuckDB) per source, removals by rule, the funnel and LSH
    S-curve figures (written into ``ctx.plots_dir``), the near dedup settings and the sources' warnings."""
    from tasks.corpus.plots import corpus_figures, funnel_counts

    path = ctx.path
    manifest = json.loads((path / "manifest.json").read_text())
    out: list[Block] = [Heading("Sources and corpus")]
    funnel = funnel_frame(path)
    tokens = ctx.warehouse.query("SELECT source, tokens FROM manifest WHERE artifact_key = ?", [path.name]) \
        if ctx.warehouse.has_table("manifest") else pd.DataFrame()
    if not tokens.empty:
        funnel = funnel.merge(tokens, on="source", how="left")
    out.append(Text(f"Manifest `{manifest['manifest_hash'][:16]}` · {len(manifest['sources'])} sources · "
                    f"boilerplate units cut {manifest['boilerplate_units']:,}"))
    out.append(TableBlock("Documents per source (tokens: train + held-out after tokenization)", funnel))
    kept = pd.Series({name: int(info["docs_out"]) for name, info in manifest["sources"].items()})
    by_rule = funnel_counts(load_removals(path, ["source", "rule"]), kept)
    out.append(TableBlock("Documents kept and removed by rule, per source",
                          by_rule.reset_index().rename(columns={"index": "source"})))
    figures = {p.name: p for p in corpus_figures(path, ctx.plots_dir)}
    out.append(Figure(figures["funnel.png"], "Corpus funnel per source: kept, and removed by each rule"))
    near = json.loads((path / "meta.json").read_text())["config"]["corpus"]["near_dedup"]
    found = manifest["near_dedup"]
    out.append(Text(f"Near dedup: {near['bands']} bands × {near['rows']} rows of {near['num_perm']} MinHash values "
                    f"({near['family']}, {near['shingle_size']}-word shingles, scope {near['scope']}); the S-curve is "
                    f"steepest at s = {found['implied_threshold']:.3f}, candidates are removed at exact Jaccard ≥ "
                    f"{near['jaccard_threshold']:g}. Candidate pairs {found.get('candidate_pairs', 0):,}, verified "
                    f"{found.get('verified_pairs', 0):,}."))
    out.append(Figure(figures["s_curve.png"], "LSH S-curve of the configured bands and rows"))
    for name, info in manifest["sources"].items():
        out.extend(Text(f"Warning ({name}): {w}") for w in info.get("warnings", []))
    return out
