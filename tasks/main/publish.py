"""What a main-run artifact puts into DuckDB and MLflow: held-out loss per source (with the corpus ``manifest_hash``
of the text it was scored on; rows of checkpoint "main", and "ema" / "average_last<K>" for its averaged weights),
training events, the packing report, the epochs per source, the lineage of the two
proxy decisions it consumed, its training mixture, its LR schedule (tags; under WSD the trunk key of its stable
checkpoints), and its text samples (an MLflow table)."""

from __future__ import annotations

import json

import pandas as pd

from infra.stage import Dataset, PublishContext, Published
from tasks.readers import recorded_manifest_hash
from tasks.train.epochs import epoch_warnings


def publish(ctx: PublishContext) -> Published:
    path, produced_by = ctx.artifact.path, ctx.artifact.meta.get("mlflow_run_id", "")
    mixture, sweep, tokenizer = (ctx.inputs.get(name) for name in ("mixture", "sweep", "tokenizer"))
    heldout = pd.read_parquet(path / "heldout.parquet").assign(run_id=produced_by, stage="main")
    if (path / "averaged_heldout.parquet").exists():  # [main] ema_decay / average_last: checkpoint "ema", ...
        averaged = pd.read_parquet(path / "averaged_heldout.parquet").assign(run_id=produced_by, stage="main")
        heldout = pd.concat([heldout, averaged], ignore_index=True)
    out = Published(tables={"heldout_loss": heldout.assign(manifest_hash=recorded_manifest_hash(tokenizer, [path / "checkpoint"]))
                            .astype({"manifest_hash": "string"})},
                    tags={"checkpoint_path": str(path / "checkpoint")})
    if heldout_hash := out.tables["heldout_loss"]["manifest_hash"].dropna().unique().tolist():
        out.tags["manifest_hash"] = heldout_hash[0]
    choice = json.loads((mixture.path / "choice.json").read_text()) if mixture else None
    if sweep is not None:  # lineage of the two proxy decisions the run consumed
        best = json.loads((sweep.path / "best.json").read_text())
        out.tags |= {"sweep_artifact_key": sweep.key, "sweep_study": best["study_name"]}
    if choice is not None:
        out.tags |= {"mixture_artifact_key": mixture.key, "mixture_choice": choice["name"]}
    if tokenizer is not None and choice is not None and (tokenizer.path / "shards.parquet").exists():
        # What this run trained on (logged by cached runs too: each run's record shows what its model saw).
        weights = choice["weights"]
        headers = pd.read_parquet(tokenizer.path / "shards.parquet")
        profile = {f"{r.source}/train": int(r.n_tokens) for r in headers.itertuples()
                   if r.split == "train" and weights.get(r.source, 0) > 0}
        profile |= {f"weight/{k}": float(v) for k, v in weights.items()}
        out.datasets.append(Dataset("main_training_mixture", f"{tokenizer.key}-{mixture.key}",
                                    tokenizer.path / "shards", "training", profile))
    run = json.loads((path / "run.json").read_text())
    out.tags["schedule"] = run.get("schedule", "cosine")
    if run.get("schedule") == "wsd":  # where the stable checkpoints of this run (and its decay branches) live
        out.tags |= {"trunk_key": run["trunk_key"], "decay_start": run["decay_start"], "decay_shape": run["decay_shape"]}
    main_epochs = run.get("epochs", {})
    out.metrics = {f"epochs.{source}": e for source, e in main_epochs.items()}
    # The threshold is read from the current config, so a cached run is judged by today's limit.
    warnings = epoch_warnings(main_epochs, ctx.cfg.mixture.max_epochs)
    if warnings:
        out.tags["epoch_warnings"] = " | ".join(warnings)
    if (path / "events.parquet").exists():
        out.tables["train_events"] = pd.read_parquet(path / "events.parquet").assign(run_id=produced_by)
    if (path / "packing.parquet").exists():
        packing = pd.read_parquet(path / "packing.parquet")
        out.tables["packing_report"] = packing
        totals = packing.groupby(["policy", "seq_len"])[["docs_cut", "n_docs"]].sum()
        out.metrics |= {f"docs_cut_share.{policy}.T{seq_len}": r.docs_cut / max(r.n_docs, 1)
                        for (policy, seq_len), r in totals.iterrows()}
    if (path / "samples.parquet").exists():  # the prompts' continuations at each evaluation point
        out.mlflow_tables["samples.json"] = pd.read_parquet(path / "samples.parquet")
    if run.get("kept_weights"):  # names for main@<name> (tasks.train.milestones)
        out.tags["kept_weights"] = ",".join(run["kept_weights"])
    out.files = ["run.json", "heldout.parquet",
                 *[name for name in ("packing.parquet", "events.parquet", "averaged_heldout.parquet")
                   if (path / name).exists()]]
    return out
