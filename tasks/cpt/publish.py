"""What a CPT artifact puts into DuckDB: held-out loss and cloze results of every candidate and the base; into
MLflow: the candidates' text samples as a table."""

from __future__ import annotations

import pandas as pd

from infra.stage import PublishContext, Published


def publish(ctx: PublishContext) -> Published:
    path, produced_by = ctx.artifact.path, ctx.artifact.meta.get("mlflow_run_id", "")
    cloze = pd.read_parquet(path / "cloze.parquet").drop(columns=["n_option_tokens"], errors="ignore")
    # The candidates' continuations of the [samples] prompts at each evaluation point, as an MLflow table.
    tables = {"samples.json": pd.read_parquet(path / "samples.parquet")} if (path / "samples.parquet").exists() else {}
    return Published(tables={"heldout_loss": pd.read_parquet(path / "heldout.parquet").assign(run_id=produced_by,
                                                                                            stage="cpt"),
                             "cloze_results": cloze.assign(run_id=produced_by)},
                     files=["candidates.json", "cloze.parquet"], mlflow_tables=tables)
