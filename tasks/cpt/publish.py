"""What a CPT artifact puts into DuckDB: held-out loss and cloze results of every candidate and the base (each row
with the corpus ``manifest_hash`` of the tokenizer input whose held-out shards were scored), and for a context
extension the loss by position, passkey retrieval, the long-document supply and the long documents' members; into
MLflow: the candidates' text samples as a table."""

from __future__ import annotations

import pandas as pd

from infra.stage import PublishContext, Published
from tasks.readers import recorded_manifest_hash


def publish(ctx: PublishContext) -> Published:
    path, produced_by = ctx.artifact.path, ctx.artifact.meta.get("mlflow_run_id", "")
    cloze = pd.read_parquet(path / "cloze.parquet").drop(columns=["n_option_tokens", "n_option_bytes"],
                                                         errors="ignore")
    # The candidates' continuations of the [samples] prompts at each evaluation point, as an MLflow table.
    tables = {"samples.json": pd.read_parquet(path / "samples.parquet")} if (path / "samples.parquet").exists() else {}
    lineage = {"manifest_hash": recorded_manifest_hash(ctx.inputs.get("tokenizer"))}
    warehouse = {"heldout_loss": pd.read_parquet(path / "heldout.parquet").assign(run_id=produced_by, stage="cpt",
                                                                                 **lineage),
                 "cloze_results": cloze.assign(run_id=produced_by, **lineage)}
    warehouse = {table: frame.astype({"manifest_hash": "string"}) for table, frame in warehouse.items()}  # None: NULL
    files = ["candidates.json", "cloze.parquet"]
    # A context extension (docs/methods.md §15): every table carries its construction (natural / concatenated).
    for table, name in CONTEXT_TABLES.items():
        if (path / name).exists():
            warehouse[table] = pd.read_parquet(path / name).assign(run_id=produced_by)
            files.append(name)
    return Published(tables=warehouse, files=files, mlflow_tables=tables)



CONTEXT_TABLES = {"context_position_loss": "position_loss.parquet", "context_retrieval": "retrieval.parquet",
                  "context_supply": "context_supply.parquet", "context_long_documents": "long_documents.parquet"}
