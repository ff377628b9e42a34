"""The pipeline flow: every stage a cached Prefect task around a plain function, tracked in MLflow and DuckDB.

    pretrain run configs/demo.toml                   # whole chain, cached stages reused
    pretrain run configs/demo.toml --refresh main    # recompute main and everything downstream

Caching: a stage's artifact key (``infra.artifacts.artifact_key``) is also its Prefect cache key. When the
artifact directory is missing or unfinished the task runs with ``refresh_cache``, so a cached result whose
directory is gone is recomputed, never trusted. Prefect's default hash of pickled inputs is never used.
This module must be imported after ``RunsLayout.prepare_environment()`` (Prefect reads PREFECT_HOME on import).
"""


import logging
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from prefect import flow, task
from prefect.context import get_run_context

from flows.config import ExperimentConfig, load_config
from flows.forecasts import after_stage
from flows.gates import record_gate
from flows.keys import StageKey, chain_keys
from flows.preflight import preflight
from flows.progress import PlainProgress, RichProgress, duration, make_progress
from flows.publish import PublishTarget, publish
from flows.registry import STAGES, downstream, get_stage, stage_names
from flows.versions import moved_notices, write_record
from flows.runlog import adopt_library_loggers, captured_unless_active
from infra.artifacts import Artifact, ArtifactStore, disk_full_error
from infra.errors import DataError
from infra.leases import describe
from infra.shard_map import RAY_CALLS_FILE, one_connection, shard_map_for
from infra.runs import RunsLayout
from infra.stage import Stage, StageContext, scratch_folder
from infra.threads import ThreadPolicy, thread_policy
from infra.tracking import Tracker
from infra.warehouse import Warehouse


# Typed flow parameters: a deployment's UI and API refuse a stage name that does not exist.
StageName = Literal[stage_names()]


@dataclass
class Env:
    """What every stage of one pipeline run shares."""

    cfg: ExperimentConfig
    layout: RunsLayout
    store: ArtifactStore
    tracker: Tracker
    warehouse: Warehouse
    parent_run_id: str
    flow_run_id: str
    refresh: set[str] = field(default_factory=set)  # recomputed: the stages --refresh names and their downstream
    named: set[str] = field(default_factory=set)  # the stages --refresh names: they do not read their own caches
    progress: RichProgress | PlainProgress = field(default_factory=make_progress)
    threads: ThreadPolicy = field(default_factory=lambda: thread_policy(None))

    @property
    def target(self) -> PublishTarget:
        return PublishTarget(self.tracker, self.warehouse, self.cfg.name, self.parent_run_id, self.flow_run_id)


@dataclass
class Position:
    """Where this process's pipeline run is: the stages whose artifacts it has (computed or reused), in order, and
    the stage running now with its artifact key (None between stages). ``pretrain run`` says it when interrupted
    (``flows.interrupt``)."""

    done: list[str] = field(default_factory=list)
    running: str | None = None
    key: str | None = None


POSITION = Position()


@task(persist_result=True)
def execute_stage(name: str, key: str, env: Env, input_paths: dict[str, Path], meta: dict[str, Any]) -> dict:
    """Compute a stage's artifact unless a complete one exists; returns {key, path, computed}.

    Concurrent runs of the same config take turns per artifact: one computes, the others wait for its lease and
    then reuse what it committed.
    """
    existing = env.store.get(name, key)
    if existing is not None and name not in env.refresh:
        return {"key": key, "path": str(existing.path), "computed": False}
    asked = time.time()
    with env.store.computing(name, key, on_wait=lambda who: env.progress.say(
            f"{name}: {describe(who)} holds the lease on artifact {key} ({env.store.lock_path(name, key)}) and is "
            "computing it; waiting, then reusing it")):
        # Another run of the same config may have finished this artifact while we waited: a fresh one is reused
        # (even under --refresh, since it was computed after this run asked).
        existing = env.store.get(name, key)
        if existing is not None and (name not in env.refresh or existing.meta.get("committed_at", 0) > asked):
            return {"key": key, "path": str(existing.path), "computed": False}
        return _compute(name, key, env, input_paths, meta)


def _compute(name: str, key: str, env: Env, input_paths: dict[str, Path], meta: dict[str, Any]) -> dict:
    stage = get_stage(name)
    note = _interrupted_attempt(name, key, env)
    if note:
        env.progress.say(note)
    tmp = env.store.begin(name, key)
    ctx = StageContext(
        out=tmp, inputs=input_paths, layout=env.layout, key=key, key_config=meta["config"], experiment=env.cfg.name,
        seed=env.cfg.seed,
        torch_threads=env.threads.torch_threads, threads=env.threads, progress=env.progress,
        refresh=name in env.named,
        log_metrics=lambda metrics, step: env.tracker.log_metrics(meta["mlflow_run_id"], metrics, step),
        log_child=lambda child, params, rows: _log_child(env, meta["mlflow_run_id"], child, params, rows),
        shard_map_for=partial(shard_map_for, record=tmp / RAY_CALLS_FILE),  # Ray records where calls ran
    )
    started = time.perf_counter()
    try:
        with one_connection():  # the stage's Ray passes share one connection
            summary = stage.run(ctx, env.cfg)
        stage.validate(tmp, env.cfg)
    except BaseException as err:
        full = disk_full_error(err, tmp, name)  # before abort frees the space
        env.store.abort(tmp)
        if full is not None:
            raise full from err
        raise
    artifact = env.store.commit(name, key, tmp, {**meta, "summary": summary, "wall_s": time.perf_counter() - started,
                                                   "threads": env.threads.params()})
    # Only now: a kill between the stage's end and the commit must find its checkpoints and journals again.
    shutil.rmtree(scratch_folder(env.layout.root, name, key), ignore_errors=True)
    return {"key": key, "path": str(artifact.path), "computed": True}


def _interrupted_attempt(name: str, key: str, env: Env) -> str | None:
    """One line saying what this attempt resumes from, when an earlier attempt at the artifact was interrupted
    (its ``.tmp-<key>-*`` folder remains, or its scratch folder holds files); removes the dead attempt's folders.

    Called under the artifact's lease, so no live process is writing a ``.tmp`` folder of this key.
    """
    stale = [p for p in (env.store.root / name).glob(f".tmp-{key}-*") if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    folder = scratch_folder(env.layout.root, name, key)
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    if files:
        mib = sum(p.stat().st_size for p in files) / 2**20
        return (f"{name}: resuming after an interrupted attempt, which left {len(files)} file(s) ({mib:.1f} MiB) in "
                f"{folder.relative_to(env.layout.root)}; the stage reuses what in them is complete")
    if stale:
        return f"{name}: an earlier attempt was interrupted before it left anything resumable; computing from the start"
    return None


def _log_child(env: Env, stage_run_id: str, name: str, params: dict, rows: list[dict]) -> None:
    run_id = env.tracker.start_run(name, parent_id=stage_run_id)
    env.tracker.log_params(run_id, params)
    env.tracker.log_metric_series(run_id, rows)
    env.tracker.end_run(run_id)


def run_stage(stage: Stage, stage_key: StageKey, env: Env, upstream: dict[str, Artifact]) -> tuple[Artifact, bool]:
    """Run one stage through Prefect (cache key = artifact key) inside its nested MLflow run."""
    key, config, input_keys, version = stage_key.key, stage_key.config, stage_key.input_keys, stage_key.code_version
    run_id = env.tracker.start_run(stage.name, parent_id=env.parent_run_id, tags={
        "stage": stage.name, "artifact_key": key, "code_version": version, "prefect_flow_run_id": env.flow_run_id,
        "metric_step_unit": stage.step_unit,
        **{f"input.{k}": v for k, v in input_keys.items()}})
    env.tracker.log_params(run_id, config)
    # Prefect's cache key is the artifact key; a missing or refreshed artifact forces a recompute
    # (refresh_cache) so a cached result is never trusted without its directory.
    cache_token = f"{stage.name}-{key}"
    # A reused artifact is checked against its checksums first: a corrupt one is moved aside and recomputed.
    found, corrupt = env.store.verify(stage.name, key) if stage.name not in env.refresh else (None, None)
    if corrupt:
        env.progress.say(f"{stage.name}: {corrupt}; computing it again")
    must_run = stage.name in env.refresh or found is None
    prefect_task = execute_stage.with_options(
        name=f"stage-{stage.name}", refresh_cache=must_run, cache_key_fn=lambda _ctx, _params: cache_token)
    meta = {"config": config, "input_keys": input_keys, "code_version": version, "mlflow_run_id": run_id,
            "prefect_flow_run_id": env.flow_run_id}
    position = f"[{stage_names().index(stage.name) + 1}/{len(STAGES)}]"
    started = time.perf_counter()
    if must_run:
        env.progress.say(f"{position} {stage.name}: started (key {key})")
    env.progress.activity(stage.name)
    adopt_library_loggers()  # a library the previous stage imported logs to the run log, not over the progress
    try:
        state = prefect_task(stage.name, key, env, {n: upstream[n].path for n in stage.inputs}, meta,
                             return_state=True)
        outcome = state.result()
        artifact = env.store.get(stage.name, key)
        if artifact is None:
            raise DataError(f"stage {stage.name}: artifact {key} missing after the task finished")
        cached = state.name == "Cached" or not outcome["computed"]
        publish(stage, artifact, {n: upstream[n] for n in stage.inputs}, env.cfg, env.target, run_id, cached=cached)
    except BaseException as err:
        env.progress.activity(None)
        record_failure(env.tracker, run_id, err, f"stage {stage.name}")
        raise
    env.progress.activity(None)
    env.tracker.end_run(run_id)
    env.progress.say(f"{position} {stage.name}: " + (f"cached (key {key})" if cached else
                                                     f"ran in {duration(time.perf_counter() - started)}"))
    return artifact, cached


def record_failure(tracker: Tracker, run_id: str, err: BaseException, what: str) -> None:
    """Mark the MLflow run FAILED after ``err``; when that fails too (the store's disk is full, the store is gone),
    log a warning and return, so that ``err`` stays the reported cause. A run left RUNNING this way is marked
    FAILED by the next command on the runs folder (``Tracker.fail_abandoned_runs``)."""
    try:
        tracker.end_run(run_id, "FAILED")
    except Exception as secondary:
        # On a full disk, the error that says so (SQLite's "database or disk is full"), not MLflow's SQL around it.
        from infra.artifacts import full_disk_exception

        said = full_disk_exception(secondary) or secondary
        logging.getLogger(__name__).warning(
            "%s failed (%s); recording that in MLflow failed too: %s: %s", what, type(err).__name__,
            type(said).__name__, " ".join(str(said).split())[:300])


# No log_prints: a stage's own lines (resume notes, warnings) go to the run's stdout, where the user and a worker's
# log see them; as Prefect INFO records they would sit below the WARNING level the CLI keeps Prefect at.
@flow(name="pretrain-pipeline")
def pipeline(config_path: str, runs_dir: str, refresh: list[StageName] | None = None, until: StageName | None = None,
             seed: int | None = None, launch: Literal["inprocess", "accelerate"] | None = None,
             processes: int | None = None, accelerate_config: str | None = None) -> dict[str, Any]:
    """Run the chain for one experiment config; returns per-stage keys and cache hits.

    Args:
        config_path: the experiment TOML (read by the process that runs the flow).
        runs_dir: the runs folder.
        refresh: stages to recompute, with everything downstream of them.
        until: stop after this stage (its upstream runs or is reused as usual); None runs the whole chain.
        seed, launch, processes, accelerate_config: typed overrides of the config's ``seed`` and
            ``main.distributed.{launch, processes, accelerate_config}`` (a deployment's parameters: the same
            config on a GPU pool; None keeps the file's value). The launch layout is not in any artifact key.

    Raises:
        ConfigError: unknown stage names in ``refresh`` or ``until``, or an invalid config.
    """
    # A flow run started by a served deployment (a process of its own) logs to its own run log, as ``pretrain run``.
    with captured_unless_active(RunsLayout.resolve(runs_dir)) as log_path:
        result = _pipeline(config_path, runs_dir, refresh, until, seed, launch, processes, accelerate_config)
        if log_path is not None:
            print(f"Run log: {log_path}", flush=True)
        return result


def _pipeline(config_path: str, runs_dir: str, refresh: list[StageName] | None, until: StageName | None,
              seed: int | None, launch: Literal["inprocess", "accelerate"] | None, processes: int | None,
              accelerate_config: str | None) -> dict[str, Any]:
    overrides = {k: v for k, v in {"seed": seed, "main.distributed.launch": launch,
                                   "main.distributed.processes": processes,
                                   "main.distributed.accelerate_config": accelerate_config}.items() if v is not None}
    cfg = load_config(config_path, overrides)
    layout = RunsLayout.resolve(runs_dir)
    preflight(cfg, refresh or [], until=until)
    env = _environment(cfg, layout, set(refresh or []))
    upstream: dict[str, Artifact] = {}
    cached: dict[str, bool] = {}
    try:
        # Before the first stage: a gate this run is the first to see is hashed and timestamped before any CPT
        # candidate trains (marked when CPT evidence of the experiment exists already).
        record_gate(cfg, env.warehouse, env.tracker, env.parent_run_id)
        keys = chain_keys(cfg, until)
        POSITION.done.clear()
        POSITION.running = POSITION.key = None
        with env.progress:
            # A Debian source whose candidate version moved since this experiment's last run is named before the
            # recomputation it causes starts.
            sources = keys["sources"]
            for line in moved_notices(cfg, sources.config, layout,
                                      artifact_exists=env.store.get("sources", sources.key) is not None):
                env.progress.say(line)
            for stage in STAGES[:len(keys)]:
                POSITION.running, POSITION.key = stage.name, keys[stage.name].key
                upstream[stage.name], cached[stage.name] = run_stage(stage, keys[stage.name], env, upstream)
                POSITION.done.append(stage.name)
                POSITION.running = POSITION.key = None
                if stage.name == "sources":
                    write_record(cfg, sources.config, layout)
                # The ladder's forecast goes on record before main starts, and is checked once main exists.
                after_stage(stage.name, upstream, keys["main"].key if "main" in keys else None, env.target,
                            env.store)
    except BaseException as err:
        record_failure(env.tracker, env.parent_run_id, err, "the pipeline")
        raise
    env.tracker.end_run(env.parent_run_id)
    return {"experiment": cfg.name, "experiment_id": env.tracker.experiment_id, "parent_run_id": env.parent_run_id,
            "cached": cached, "keys": {name: a.key for name, a in upstream.items()},
            "paths": {n: str(a.path) for n, a in upstream.items()}}


def _environment(cfg: ExperimentConfig, layout: RunsLayout, named: set[str]) -> Env:
    threads = thread_policy(cfg.torch_threads)  # before the parent run: a bad export leaves no run behind
    torch.set_num_threads(threads.torch_threads)  # every in-process stage (proxies, sweep trials, CPT) uses it
    tracker = Tracker(layout.tracking_uri, layout.mlflow_artifacts, cfg.name)
    flow_run_id = str(get_run_context().flow_run.id)
    parent = tracker.start_run("pipeline", tags={"prefect_flow_run_id": flow_run_id, "git_commit": _git_commit()})
    tracker.log_params(parent, {"config": cfg.name, "seed": cfg.seed, **threads.params()})
    threads.announce()
    return Env(cfg=cfg, layout=layout, store=ArtifactStore(layout.artifacts), tracker=tracker,
               warehouse=Warehouse(layout.duckdb), parent_run_id=parent, flow_run_id=flow_run_id,
               refresh=downstream(named), named=named,
               threads=threads)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"
