"""After each stage: mirror its artifact into DuckDB and describe it in its nested MLflow run.

DuckDB rows are rewritten from the artifact on every run (cached or not, keyed by artifact key), so the
warehouse always matches the artifact store. MLflow files are logged only by the run that produced the
artifact; a cached stage's run is tagged ``cached=true`` with ``produced_by_run`` pointing at that run.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from infra.artifacts import Artifact
from tasks.mixture.candidates import epoch_warnings

if TYPE_CHECKING:
    from flows.pipeline import Env


def publish(stage: str, artifact: Artifact, env: "Env", run_id: str, *, cached: bool) -> None:
    summary = artifact.meta.get("summary", {})
    env.tracker.set_tags(run_id, {
        "cached": str(cached).lower(), "produced_by_run": artifact.meta.get("mlflow_run_id", ""),
        "artifact_path": str(artifact.path)})
    numeric = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    env.tracker.log_metrics(run_id, numeric, step=0)
    PUBLISHERS.get(stage, lambda *a: None)(artifact, env, run_id, cached)
    _log_plots(stage, artifact, env, run_id, cached)
    env.warehouse.append("stage_runs", pd.DataFrame([{
        "experiment": env.cfg.name, "stage": stage, "artifact_key": artifact.key, "cached": cached,
        "mlflow_run_id": run_id, "produced_by_run": artifact.meta.get("mlflow_run_id", ""),
        "prefect_flow_run_id": env.flow_run_id, "parent_run_id": env.parent_run_id,
        "wall_s": float(artifact.meta.get("wall_s", 0.0)), "input_keys": json.dumps(artifact.meta.get("input_keys", {})),
        "code_version": artifact.meta.get("code_version", ""),
        "recorded_at": pd.Timestamp.now(tz="UTC").tz_localize(None)}]))


def _log_files(env: "Env", run_id: str, cached: bool, artifact: Artifact, *names: str) -> None:
    if cached:
        return
    for name in names:
        path = artifact.path / name
        if path.exists():
            env.tracker.log_artifact(run_id, path, None if path.is_file() else name)


def _log_plots(stage: str, artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    """The stage's figures (``flows.plots.stage_plots``) as the ``plots/`` artifact folder of the run that produced
    the artifact; the main run's curves come from the metrics that run logged."""
    if cached or stage not in ("corpus", "mixture", "main"):
        return
    from flows.plots import stage_plots, training_history

    history = training_history(env.tracker.client, run_id) if stage == "main" else None
    with tempfile.TemporaryDirectory() as tmp:
        if stage_plots(stage, artifact.path, Path(tmp), history):
            env.tracker.log_artifact(run_id, Path(tmp), "plots")


def _corpus(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    from tasks.corpus.stage import manifest_rows

    manifest = manifest_rows(json.loads((artifact.path / "manifest.json").read_text())).assign(
        experiment=env.cfg.name, tokens=pd.NA)
    env.warehouse.replace("manifest", manifest.astype({"tokens": "Int64"}), artifact.key)
    env.warehouse.replace("removals", pd.read_parquet(artifact.path / "removals.parquet"), artifact.key)
    funnel = pd.read_parquet(artifact.path / "funnel.parquet")
    env.warehouse.replace("funnel", funnel, artifact.key)
    docs = {r["source"]: int(r["docs_out"]) for r in manifest.to_dict("records")}
    env.tracker.log_dataset(run_id, "kept_corpus", artifact.key, artifact.path / "kept.parquet", "training", docs)
    env.warehouse.replace("decontamination", pd.read_parquet(artifact.path / "decontamination.parquet"),
                          artifact.key)
    env.warehouse.replace("boilerplate", pd.read_parquet(artifact.path / "boilerplate.parquet").astype(
        {"unit_hash": "string"}), artifact.key)
    body = json.loads((artifact.path / "manifest.json").read_text())
    env.tracker.set_tags(run_id, {"manifest_hash": body["manifest_hash"]})
    near = body["near_dedup"]
    env.tracker.log_params(run_id, {"near_dedup.implied_threshold": round(near["implied_threshold"], 4)})
    # The LSH S-curve: P(candidate) at Jaccard s, logged with step = round(100·s) (step unit: Jaccard percent).
    for s, p in near["s_curve"]:
        env.tracker.log_metrics(run_id, {"near_dedup.p_candidate": p}, step=int(round(100 * s)))
    _log_files(env, run_id, cached, artifact, "manifest.json", "funnel.parquet", "decontamination.parquet",
               "boilerplate.parquet")


def _tokenizer(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    if (artifact.path / "removals.parquet").exists():  # held-out decontamination joins the one removal ledger
        env.warehouse.replace("removals", pd.read_parquet(artifact.path / "removals.parquet"), artifact.key)
    report = pd.read_parquet(artifact.path / "report.parquet")
    env.warehouse.replace("tokenizer_report", report, artifact.key)
    optional = {"fragmentation.parquet": "tokenizer_fragmentation"}
    for name, table in optional.items():  # absent in artifacts written before these reports existed
        if (artifact.path / name).exists():
            env.warehouse.replace(table, pd.read_parquet(artifact.path / name), artifact.key)
    _log_tokenizer_metrics(env, run_id, artifact.path, report)
    headers = pd.read_parquet(artifact.path / "shards.parquet")
    tokens = {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}
    env.tracker.log_dataset(run_id, "token_shards", artifact.key, artifact.path / "shards", "training", tokens)
    corpus_key = artifact.meta["input_keys"]["corpus"]
    with env.warehouse.connect() as con:
        for source, tokens in headers.groupby("source")["n_tokens"].sum().items():
            con.execute("UPDATE manifest SET tokens = ? WHERE artifact_key = ? AND source = ?",
                        [int(tokens), corpus_key, source])
    _log_files(env, run_id, cached, artifact, "tokenizer.json", "tokenizer.meta.json", "report.parquet",
               *[name for name in optional if (artifact.path / name).exists()])


def _log_tokenizer_metrics(env: "Env", run_id: str, path: Path, report: pd.DataFrame) -> None:
    """Held-out chars/token and tokens/word per language and source (tokens per non-space character where the
    word unit is the character), the fit sample's weights and characters drawn per source, and the tokens per
    domain term, as MLflow metrics and params."""
    metrics = {}
    for r in (report[report["split"] == "heldout"] if "split" in report else report).itertuples():
        metrics[f"chars_per_token.{r.group_by}.{r.group}"] = r.chars_per_token
        unit = "nonspace_char" if r.word_unit == "char" else r.word_unit
        metrics[f"tokens_per_{unit}.{r.group_by}.{r.group}"] = r.tokens_per_word
    if (path / "fragmentation.parquet").exists():
        for r in pd.read_parquet(path / "fragmentation.parquet").itertuples():
            metrics[f"tokens_per_term.{r.term}"] = r.n_tokens
    _log_named_metrics(env, run_id, metrics)
    meta = json.loads((path / "tokenizer.meta.json").read_text())
    env.tracker.log_params(run_id, {**{f"fit_weight.{s}": round(w, 6) for s, w in meta.get("fit_weights", {}).items()},
                                    **{f"fit_sample_chars.{s}": n for s, n in meta.get("fit_sample_chars", {}).items()}})


def _log_named_metrics(env: "Env", run_id: str, metrics: dict) -> None:
    # MLflow names allow word characters, '.', '-', '/', ' ' and ':' only; terms like "C++" are made to fit.
    env.tracker.log_metrics(run_id, {re.sub(r"[^\w.\-/ :]", "_", k): float(v) for k, v in metrics.items()
                                     if pd.notna(v)}, step=0)


def _mixture(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    trials = pd.read_parquet(artifact.path / "trials.parquet")
    if "unique_train_tokens" in trials:
        # Epochs each source would get in the main run under each candidate, e = w·D/U (docs/methods.md §8), D from
        # today's [main] budget: the main budget is not in the mixture key, so this is computed at publish time.
        main_tokens = env.cfg.main.budget.steps * env.cfg.main.budget.batch_size * env.cfg.main.model.seq_len
        trials["main_epochs"] = trials["weight"] * main_tokens / trials["unique_train_tokens"].clip(lower=1)
        trials["epochs_over_limit"] = trials["main_epochs"] > env.cfg.mixture.max_epochs
    env.warehouse.replace("mixture_trials", trials, artifact.key)
    choice = json.loads((artifact.path / "choice.json").read_text())
    env.tracker.log_params(run_id, {"choice.mixture": choice["name"], "choice.rule_text": choice["rule"][:500],
                                    "choice.runner_up": str(choice.get("runner_up")),
                                    **{f"choice.weight.{s}": round(w, 6) for s, w in choice["weights"].items()}})
    if choice.get("transfer"):
        t = choice["transfer"]
        env.tracker.set_tags(run_id, {"choice.transfer_winner_flips": str(t["winner_flips"]).lower(),
                                      "choice.transfer_flipped_pairs": json.dumps(t["flipped_pairs"])[:500]})
    over = trials[trials.get("epochs_over_limit", False) & trials["candidate"].eq(choice["name"])] \
        if "epochs_over_limit" in trials else trials.iloc[0:0]
    if not over.empty:
        env.tracker.set_tags(run_id, {"epoch_warnings": " | ".join(
            f"{r.source}: {r.main_epochs:.2f} epochs" for r in over.drop_duplicates("source").itertuples())})
    _log_files(env, run_id, cached, artifact, "choice.json", "mixture_loss.png")


def _sweep(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    env.warehouse.replace("sweep_trials", pd.read_parquet(artifact.path / "trials.parquet"), artifact.key)
    best = json.loads((artifact.path / "best.json").read_text())
    env.tracker.log_params(run_id, {"choice.best_lr": best["best_lr"], "choice.study_name": best["study_name"]})
    for row in best.get("widths", []):  # best LR against width: one metric point per width (step = d_model)
        env.tracker.log_metrics(run_id, {"best_lr_by_width": row["best_lr"]}, step=int(row["d_model"]))
    forecasts = best.get("forecast")
    if isinstance(forecasts, list):
        _log_named_metrics(env, run_id, {f"forecast_error_nats.window_{f['window']:g}": f["error"] for f in forecasts})
    _log_files(env, run_id, cached, artifact, "best.json")


def _main(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    frame = pd.read_parquet(artifact.path / "heldout.parquet").assign(
        run_id=artifact.meta.get("mlflow_run_id", run_id), stage="main")
    env.warehouse.replace("heldout_loss", frame, artifact.key)
    env.tracker.set_tags(run_id, {"checkpoint_path": str(artifact.path / "checkpoint")})
    # Lineage of the two proxy decisions the run consumed: the mixture choice and the sweep's study.
    inputs = artifact.meta.get("input_keys", {})
    decisions = {}
    if inputs.get("sweep") and (env.layout.artifacts / "sweep" / inputs["sweep"] / "best.json").exists():
        best = json.loads((env.layout.artifacts / "sweep" / inputs["sweep"] / "best.json").read_text())
        decisions |= {"sweep_artifact_key": inputs["sweep"], "sweep_study": best["study_name"]}
    if inputs.get("mixture") and (env.layout.artifacts / "mixture" / inputs["mixture"] / "choice.json").exists():
        choice = json.loads((env.layout.artifacts / "mixture" / inputs["mixture"] / "choice.json").read_text())
        decisions |= {"mixture_artifact_key": inputs["mixture"], "mixture_choice": choice["name"]}
    if decisions:
        env.tracker.set_tags(run_id, decisions)
    if inputs.get("tokenizer") and inputs.get("mixture"):
        # What this run trained on (logged by cached runs too: each run's record shows what its model saw): the token shards of its mixture's sources, as an MLflow dataset input.
        shards = env.layout.artifacts / "tokenizer" / inputs["tokenizer"]
        choice_path = env.layout.artifacts / "mixture" / inputs["mixture"] / "choice.json"
        weights = json.loads(choice_path.read_text())["weights"] if choice_path.exists() else {}
        if (shards / "shards.parquet").exists() and weights:
            headers = pd.read_parquet(shards / "shards.parquet")
            profile = {f"{r.source}/train": int(r.n_tokens) for r in headers.itertuples()
                       if r.split == "train" and weights.get(r.source, 0) > 0}
            profile |= {f"weight/{k}": float(v) for k, v in weights.items()}
            env.tracker.log_dataset(run_id, "main_training_mixture", f"{inputs['tokenizer']}-{inputs['mixture']}",
                                    shards / "shards", "training", profile)
    main_epochs = json.loads((artifact.path / "run.json").read_text()).get("epochs", {})
    env.tracker.log_metrics(run_id, {f"epochs.{source}": e for source, e in main_epochs.items()}, step=0)
    # The threshold is read from the current config, so a cached run is judged by today's limit.
    warnings = epoch_warnings(main_epochs, env.cfg.mixture.max_epochs)
    if warnings:
        env.tracker.set_tags(run_id, {"epoch_warnings": " | ".join(warnings)})
    if (artifact.path / "events.parquet").exists():
        env.warehouse.replace("train_events", pd.read_parquet(artifact.path / "events.parquet").assign(
            run_id=artifact.meta.get("mlflow_run_id", run_id)), artifact.key)
    if (artifact.path / "packing.parquet").exists():
        packing = pd.read_parquet(artifact.path / "packing.parquet")
        env.warehouse.replace("packing_report", packing, artifact.key)
        totals = packing.groupby(["policy", "seq_len"])[["docs_cut", "n_docs"]].sum()
        _log_named_metrics(env, run_id, {f"docs_cut_share.{policy}.T{seq_len}": r.docs_cut / max(r.n_docs, 1)
                                         for (policy, seq_len), r in totals.iterrows()})
    _log_files(env, run_id, cached, artifact, "run.json", "heldout.parquet",
               *[name for name in ("packing.parquet", "events.parquet") if (artifact.path / name).exists()])


def _cpt(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    produced_by = artifact.meta.get("mlflow_run_id", run_id)
    heldout = pd.read_parquet(artifact.path / "heldout.parquet").assign(run_id=produced_by, stage="cpt")
    env.warehouse.replace("heldout_loss", heldout, artifact.key)
    cloze = pd.read_parquet(artifact.path / "cloze.parquet").drop(columns=["n_option_tokens"], errors="ignore")
    env.warehouse.replace("cloze_results", cloze.assign(run_id=produced_by), artifact.key)
    _log_files(env, run_id, cached, artifact, "candidates.json", "cloze.parquet")


def _gate(artifact: Artifact, env: "Env", run_id: str, cached: bool) -> None:
    decision = json.loads((artifact.path / "decision.json").read_text())
    table = pd.read_parquet(artifact.path / "decisions.parquet").assign(
        experiment=env.cfg.name, gate_hash=decision["gate_hash"])
    env.warehouse.replace("gate_decisions", table, artifact.key)
    env.tracker.set_tags(env.parent_run_id, {"gate_kept": decision["kept"], "gate_hash": decision["gate_hash"]})
    _headline(decision, table, env, artifact.meta.get("input_keys", {}).get("cpt"))
    _log_files(env, run_id, cached, artifact, "decisions.parquet", "decision.json", "gate_scatter.png")
    # Each candidate's verdict and failing criteria as tags of the gate run, and on its registered version.
    failing = {row["candidate"]: [c.removeprefix("status_") for c in table.columns
                                  if c.startswith("status_") and row[c] != "pass"]
               for row in table.to_dict("records")}
    env.tracker.set_tags(run_id, {f"verdict.{name}": f"{row['decision']}" + (
        f" ({', '.join(failing[name])})" if failing[name] else "") for name, row in
        ((r["candidate"], r) for r in table.to_dict("records"))})
    cpt_dir = Path(decision["candidates_dir"]) if decision.get("candidates_dir") else None
    if cpt_dir is not None and env.tracker.remote:
        # A server registers uploaded copies only; the rejected candidates' verdicts stay as tags of this run
        # and their checkpoints in the artifact store, rather than uploading every candidate of the grid.
        env.tracker.set_tags(run_id, {"candidates_registry": f"not registered on a tracking server; checkpoints in "
                                                            f"{cpt_dir}"})
    elif cpt_dir is not None:
        for row in table.to_dict("records"):
            if row["candidate"] == decision["kept"]:
                continue
            verdict = "rejected" if row["decision"] == "fail" else row["decision"]
            env.tracker.register_version(f"{env.cfg.name}-cpt-candidates", source=str(cpt_dir / row["candidate"]),
                                         run_id=run_id, identity={"gate_artifact_key": artifact.key,
                                                                  "candidate": row["candidate"]},
                                         tags={"verdict": verdict, "failing_criteria": ", ".join(failing[row["candidate"]]),
                                               "gate_hash": decision["gate_hash"]})
    # Cached or not: a cached gate may repeat an older decision after a different one moved the alias.
    _register(decision, artifact.key, env, run_id)


def _headline(decision: dict, table: pd.DataFrame, env: "Env", cpt_key: str | None) -> None:
    """The parent run's headline: the kept model's held-out loss and bits per byte per source (from the gate's
    input CPT artifact, found by its key in the store), and the verdict, so the MLflow experiment table compares
    runs without opening them."""
    kept = decision["kept"]
    passed = int((table["decision"] == "pass").sum())
    verdict = f"kept {kept}" if kept != "base" else "no candidate passed; the base is kept"
    env.tracker.set_tags(env.parent_run_id, {"gate_verdict": verdict})
    metrics = {"gate.candidates": float(len(table)), "gate.candidates_passed": float(passed),
               "gate.kept_is_base": float(kept == "base")}
    cpt = env.store.get("cpt", cpt_key) if cpt_key else None
    if cpt is not None and (cpt.path / "heldout.parquet").exists():
        heldout = pd.read_parquet(cpt.path / "heldout.parquet")
        rows = heldout[heldout["checkpoint"] == kept].drop_duplicates("source", keep="last")
        for row in rows.to_dict("records"):
            metrics[f"kept.heldout_loss_nats.{row['source']}"] = row["loss_nats"]
            metrics[f"kept.heldout_bits_per_byte.{row['source']}"] = row["bits_per_byte"]
    env.tracker.log_metrics(env.parent_run_id, metrics, step=0)


def _register(decision: dict, gate_key: str, env: "Env", run_id: str) -> None:
    """Point the alias ``kept`` of ``<experiment>-base`` at this gate decision's kept checkpoint.

    The version is looked up by the gate artifact key and the checkpoint path (its ``source`` in the artifact
    store); it is created only the first time that decision is published.
    """
    name = f"{env.cfg.name}-base"
    version, created = env.tracker.point_alias(
        name, "kept", source=decision["kept_checkpoint"], run_id=run_id, identity={"gate_artifact_key": gate_key},
        tags={"candidate": decision["kept"], "gate_hash": decision["gate_hash"]})
    env.tracker.set_tags(run_id, {"registered_model": name, "registered_version": version,
                                  "registered_version_created": str(created).lower()})
    env.tracker.set_tags(env.parent_run_id, {"registered_version": version})


PUBLISHERS: dict[str, Callable[[Artifact, "Env", str, bool], None]] = {
    "corpus": _corpus, "tokenizer": _tokenizer, "mixture": _mixture, "sweep": _sweep,
    "main": _main, "cpt": _cpt, "gate": _gate,
}
