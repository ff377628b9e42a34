"""A stage added from outside the built-in ones: words per source of the sources artifact.

Everything the stage is lives in this folder; registering it is one line (``flows.registry.register``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock
from infra.stage import PublishContext, Published, ReportContext, Stage, StageContext, SummaryContext


def run(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    # A journal in scratch, as resumable stages keep one: an attempt that finds it says it resumed.
    journal = ctx.scratch / "journal.txt"
    resumed = journal.is_file()
    journal.write_text("counted\n")
    rows = []
    for path in sorted((ctx.inputs["sources"] / "docs").glob("*.parquet")):
        docs = pd.read_parquet(path, columns=["content"])
        rows.append({"source": path.stem, "n_docs": len(docs),
                     "n_words": int(docs["content"].fillna("").str.split().str.len().sum())})
    pd.DataFrame(rows).to_parquet(ctx.out / "word_counts.parquet", index=False)
    return {"n_sources": len(rows), "n_words": sum(r["n_words"] for r in rows), "resumed": resumed}


def check(out, cfg: Any) -> None:
    from infra.errors import DataError

    if pd.read_parquet(out / "word_counts.parquet")["n_docs"].min() < 1:
        raise DataError("wordcount: a source without documents")


def publish(ctx: PublishContext) -> Published:
    counts = pd.read_parquet(ctx.artifact.path / "word_counts.parquet")
    return Published(tables={"toy_word_counts": counts.assign(experiment=ctx.cfg.name)},
                     metrics={f"words.{r.source}": r.n_words for r in counts.itertuples()},
                     params={"toy.sources": len(counts)}, files=["word_counts.parquet"])


def summary(ctx: SummaryContext) -> list[Any]:
    counts = pd.read_parquet(ctx.path / "word_counts.parquet")
    return [f"[bold]Word counts:[/] {int(counts['n_words'].sum()):,} words in {len(counts)} sources"]


def report(ctx: ReportContext) -> list[Block]:
    return [Heading("Word counts"), TableBlock("Words per source", pd.read_parquet(ctx.path / "word_counts.parquet"))]


STAGE = Stage(name="wordcount", inputs=("sources",), code="tests.unit.toy_stage", run=run,
              sections=("tokenizer",), validate=check, publish=publish, step_unit="none",
              summary=summary, report=report)
