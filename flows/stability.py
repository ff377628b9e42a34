"""``pretrain stability``: the stability grid (docs/methods.md §6) on the experiment's token shards, as a Prefect flow.

    pretrain stability configs/demo.toml         # needs the tokenizer stage: run `pretrain run` first

Trains every (peak LR, cumulative interventions) cell of ``[stability]`` on the tokenizer artifact's training
shards with the experiment's mixture-free natural weights, then writes the table to DuckDB ``stability_runs``
and one MLflow run with the table and the sensitivity plot. Must be imported after
``RunsLayout.prepare_environment()`` (Prefect reads PREFECT_HOME on import).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.context import get_run_context

from flows.audit import find_stage_artifact
from flows.config import load_config
from infra.artifacts import ArtifactStore, artifact_key, code_version
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.tracking import Tracker
from infra.warehouse import Warehouse
from tasks.stability.experiment import run_grid, sensitivity_plot
from tasks.train.packing import PackingConfig
from tasks.train.corpus import TokenizedCorpus
from tasks.train.runner import make_sampler


@flow(name="pretrain-stability")
def stability(config_path: str, runs_dir: str) -> dict[str, Any]:
    """Run the grid; returns {experiment, mlflow_run_id, rows}.

    Raises:
        ConfigError: the experiment has no tokenizer artifact yet.
    """
    cfg = load_config(config_path)
    layout = RunsLayout.resolve(runs_dir)
    tokenizer, current = find_stage_artifact(cfg, layout, ArtifactStore(layout.artifacts), "tokenizer")
    if tokenizer is None:
        raise ConfigError(f"no tokenizer artifact for experiment {cfg.name!r} under {layout.root}: run "
                          f"`pretrain run {config_path}` first (the grid trains on its token shards)")
    if not current:
        print(f"warning: the config or code changed since the tokenizer stage ran; using {tokenizer.key}")
    corpus = TokenizedCorpus(tokenizer.path)
    sizes = corpus.train_sizes(cfg.general_sources)
    total = sum(sizes.values())
    weights = {s: n / total for s, n in sizes.items() if n}
    st = cfg.stability
    table = run_grid(st, lambda seed: make_sampler(corpus, weights, seq_len=st.seq_len, batch_size=st.batch_size,
                                                   seed=seed, packing=PackingConfig(policy="concat")),
                     corpus.vocab_size, cfg.seed,
                     on_cell=lambda r: print(f"lr {r['lr']:g} {r['interventions']}: final CE {r['final_ce']:.3f}, "
                                             f"max |attention logit| {r['max_attention_logit']:.1f}"))
    key = artifact_key("stability", {"stability": st.model_dump(), "seed": cfg.seed, "weights": weights},
                       {"tokenizer": tokenizer.key}, code_version("tasks.stability", "tasks.train", "models"))
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, cfg.name)
    run_id = tracker.start_run("stability", tags={"kind": "stability_experiment", "stability_key": key,
                                                  "tokenizer_artifact": tokenizer.key,
                                                  "prefect_flow_run_id": str(get_run_context().flow_run.id)})
    try:
        tracker.log_params(run_id, {"stability": st.model_dump(), "weights": weights})
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stability"
            out.mkdir()
            table.to_csv(out / "stability.csv", index=False)
            sensitivity_plot(table, out / "sensitivity.png")
            tracker.log_artifact(run_id, out, "stability")
        for i, row in table.iterrows():  # one step per cell, in grid order (step unit: cell index)
            tracker.log_metrics(run_id, {"final_ce": row.final_ce, "max_attention_logit": row.max_attention_logit,
                                         "mean_log_z": row.mean_log_z, "max_grad_norm": row.max_grad_norm}, step=i)
        Warehouse(layout.duckdb).replace("stability_runs", table.assign(
            experiment=cfg.name, mlflow_run_id=run_id, interventions=table["interventions"].astype(str)), key)
    except BaseException:
        tracker.end_run(run_id, "FAILED")
        raise
    tracker.end_run(run_id)
    return {"experiment": cfg.name, "mlflow_run_id": run_id, "rows": json.loads(table.to_json(orient="records"))}

