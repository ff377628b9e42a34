"""Main-run stage: the decoder trained on the chosen mixture at the swept peak LR.

Writes resumable checkpoints to the stage's scratch folder every ``main.checkpoint_every`` steps (or at Young's
interval from the measured save and step times, ``checkpoint_every = "young"``: ``tasks.train.intervals``, whose
figures go to MLflow and ``run.json`` as ``checkpoint_schedule``), so a crash
resumes from the newest complete one (a corrupt one is skipped with a warning); the final full-state checkpoint goes into the artifact.

Outputs: ``checkpoint/`` (model.safetensors, optimizer.pt, state.json, checksums.json), ``heldout.parquet``
(held-out loss and bits per byte per source at the end), ``run.json`` (peak LR, mixture, tokens seen, timing,
the step it resumed from, and the epochs of each mixture source e_s = w_s · D / U_s, docs/methods.md §8), and with
``[samples]`` prompts ``samples.parquet`` (their continuations at every evaluation point, ``tasks.train.samples``).
With ``[main] milestone_every`` / ``milestones``, ``ema_decay``, ``average_last`` also ``milestones/step_XXXXXXXX/``,
``ema/``, ``average/`` (weights-only checkpoints, nameable as ``main@<name>``) and ``averaged_heldout.parquet`` (the
averaged models scored like the final weights, checkpoint "ema" / "average_last<K>"): ``tasks.train.milestones``.

Under ``budget.schedule = "wsd"`` the run also keeps stable-phase checkpoints at its branch steps and its last stable
step in ``<runs>/cache/stable/<trunk_key>/`` (``tasks.train.trunk``), and a run without scratch checkpoints starts
from the newest of those at or before its own decay start: growing the budget retrains only the steps it adds.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from accelerate import Accelerator

from infra.artifacts import code_version_closure
from infra.errors import ConfigError
from infra.stage import ProgressReporter, StageContext
from tasks.train.epochs import epoch_warnings, epochs
from tasks.readers import load_choice
from tasks.readers import load_best, nearest_width_lr
from tasks.train.corpus import TokenizedCorpus
from tasks.train.checkpoint import Checkpointer, load_model
from tasks.train.loop import local_accelerator
from tasks.train.parallel import all_sum, check_layout, parallelize
from tasks.train.intervals import YoungInterval, checkpoint_schedule
from tasks.train.optim import build_optimizer
from tasks.train.config import OptimConfig
from tasks.train.runner import (EventLog, MetricsToTracker, PeriodicEval, build_model, evals_frame, evaluate_sources,
                                make_sampler, run_training, seed_everything, StepProgress)
from models.planning import require_fit
from tasks.train.sections import MainConfig
from tasks.train.trunk import (StableSaver, resume_trunk, stable_steps, trunk_checkpoints, trunk_config, trunk_folder,
                               trunk_key)
from tasks.train.milestones import MILESTONES, MilestoneSaver, collect_milestones, keep_averaged
from tasks.train.averaging import EMA
from tasks.train.samples import PeriodicSamples, SampleConfig
from infra.threads import ThreadPolicy, apply_wait_policy
from tasks.train.packing import PackingConfig
from tasks.train.corpus import packing_report


@dataclass
class MainJob:
    """Everything one main-run process needs, JSON-serialisable so launched workers receive it as a file."""

    out: str
    scratch: str
    inputs: dict[str, str]
    seed: int
    torch_threads: int  # intra-op threads of each process
    cfg: dict
    sources: list[str]
    max_epochs: float
    packing: dict
    samples: dict = field(default_factory=dict)  # [samples]: prompts continued at each evaluation point
    trunk: str = ""  # WSD: the stable-checkpoint folder (tasks.train.trunk); "" under cosine
    trunk_steps: list[int] = field(default_factory=list)  # steps whose state is kept there
    resume_trunk: bool = True  # False under --refresh main: recompute the stable phase too

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> "MainJob":
        return cls(**json.loads(Path(path).read_text()))


def run(ctx: StageContext, cfg: MainConfig, *, sources: list[str], max_epochs: float = 4.0,
        packing: PackingConfig = PackingConfig(), samples: SampleConfig = SampleConfig()) -> dict[str, Any]:
    """Train the main model and score it on every source's held-out split.

    In process (``[main.distributed] launch = "inprocess"``) or through ``accelerate launch`` of
    ``tasks.main.worker`` on ``processes`` workers, whose rank 0 streams metrics back to this stage's MLflow run.

    Before training, refuses a layout whose memory (docs/methods.md §3) exceeds 90% of the detected device's (ConfigError
    naming the numbers), and prints a warning for each mixture source the planned run repeats more than ``max_epochs``
    times (w·D/U, docs/methods.md §8); the threshold only shapes that message, so it is not part of the stage key.

    With ``samples.prompts``, each evaluation point also continues those prompts (``tasks.train.samples``) into
    ``samples.parquet``; sampling leaves the weights unchanged, so ``[samples]`` is not part of the key either.
    """
    job = MainJob(out=str(ctx.out), scratch=str(ctx.scratch), inputs={k: str(v) for k, v in ctx.inputs.items()},
                  seed=ctx.seed, torch_threads=ctx.torch_threads, cfg=cfg.model_dump(), sources=list(sources),
                  max_epochs=max_epochs, packing=packing.model_dump(), samples=samples.model_dump())
    if cfg.budget.schedule == "wsd":
        job.trunk = str(trunk_folder(ctx.layout.root, main_trunk_key(cfg, ctx.inputs, packing=packing, seed=ctx.seed)))
        job.trunk_steps = stable_steps(cfg)
        job.resume_trunk = not ctx.refresh
    if cfg.distributed.launch == "accelerate":
        from tasks.main.launch import launch

        threads = ctx.threads or ThreadPolicy(ctx.torch_threads, "config", *apply_wait_policy())
        worker = threads.split(cfg.distributed.processes)  # the run's threads, shared among its workers
        job.torch_threads = worker.torch_threads
        return launch(job, cfg.distributed, log_metrics=ctx.log_metrics, progress=ctx.progress, threads=worker)
    return train_main(job, log_metrics=ctx.log_metrics, progress=ctx.progress, accelerator=local_accelerator())


def train_main(job: MainJob, *, log_metrics, progress: ProgressReporter, accelerator: Accelerator) -> dict:
    """The main run on this process as one rank of ``accelerator``'s world: in process (one rank,
    ``loop.local_accelerator()``) or launched (every rank calls this; rank 0 alone logs, reports progress and
    writes the artifact files). Returns the run summary on rank 0, {} elsewhere."""
    cfg = MainConfig(**job.cfg)
    packing = PackingConfig(**job.packing)
    out, scratch = Path(job.out), Path(job.scratch)
    main_rank, processes = accelerator.is_main_process, accelerator.num_processes
    dist = cfg.distributed
    seed_everything(job.seed, job.torch_threads)  # per process: a launcher has split the run's threads
    corpus = TokenizedCorpus(Path(job.inputs["tokenizer"]))
    choice = load_choice(Path(job.inputs["mixture"]))
    model_cfg = cfg.model.build(corpus.vocab_size)
    peak_lr, lr_source = main_peak_lr(cfg, load_best(Path(job.inputs["sweep"])) if "sweep" in job.inputs else None)
    check_layout(cfg.budget.batch_size, cfg.stability.micro_batches, processes)
    sharded = processes > 1 and dist.strategy != "ddp"
    # Refuse before allocating anything (docs/methods.md §3 arithmetic), for one rank's share of the work.
    require_fit(model_cfg, cfg.budget.batch_size // (processes * cfg.stability.micro_batches),
                zero_stage=3 if sharded else 0, ranks=processes, checkpointing=dist.activation_checkpointing,
                local_processes=processes)
    model = parallelize(build_model(model_cfg, job.seed), accelerator, dist.strategy, shard_size=dist.shard_size,
                        activation_checkpointing=dist.activation_checkpointing)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=peak_lr, warmup_steps=cfg.budget.warmup_steps,
                                                   **cfg.budget.adamw.model_dump()))
    sampler = make_sampler(corpus, choice["weights"], seq_len=model_cfg.seq_len,
                           batch_size=cfg.budget.batch_size, seed=job.seed, packing=packing)
    extra = {"tokenizer_hash": corpus.meta["tokenizer_hash"], "manifest_hash": corpus.meta.get("manifest_hash", ""),
             "mixture": choice["weights"], "peak_lr": peak_lr}
    main_epochs = planned_epochs(cfg, choice["weights"], corpus)
    if main_rank:
        for warning in epoch_warnings(main_epochs, job.max_epochs):
            print(f"warning: main run: {warning}")
    # [main] ema_decay: the EMA is built on the initial weights; a resume loads the saved one over it.
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay else None
    companions = {"ema": ema} if ema is not None else None
    checkpointer = Checkpointer(scratch, accelerator=accelerator, extra=extra, keep_last=cfg.keep_checkpoints,
                                asynchronous=cfg.async_checkpoints, companions=companions)
    state = _resume(checkpointer, model, optimizer, sampler)
    resumed_from = "scratch" if state else ""
    # WSD: the stable phase of a run with another budget is this run's too
    if state is None and job.trunk and job.resume_trunk:
        saved = resume_trunk(Path(job.trunk), checkpointer, model, optimizer, sampler,
                             max_step=min([cfg.budget.decay_start, *[s - 1 for s in cfg.milestone_steps]]))
        if saved is not None:
            state, resumed_from = saved["state"], "stable"
            if main_rank:
                print(f"main: resuming from stable checkpoint step {state.step:,} ({saved['directory']})")
    # Training advances ``state`` in place: read the resume point before it moves.
    resumed_from_step = state.step if state else 0
    if not main_rank:
        log_metrics, progress = (lambda metrics, step: None), ProgressReporter()
    # "young": every rank saves at the interval from the ranks' mean δ and step time (saves are collective).
    checkpoints = checkpoint_schedule(cfg.checkpoint_every, cfg.mtbf_hours, report=log_metrics,
                                      agree=lambda values: [v / processes for v in all_sum(values, accelerator)])

    def report(step: int, tokens_seen: int, evals) -> None:
        log_metrics({f"heldout.{e.source}.loss_nats": e.loss.loss_nats for e in evals}, step)

    samples, text_samples = SampleConfig(**job.samples), None
    if samples.prompts:  # rank 0 journals the rows in scratch, so a resumed run keeps the earlier points'
        text_samples = PeriodicSamples(samples, corpus.tokenizer, eos_id=int(corpus.meta["eos_id"]), run="main",
                                       lockstep=processes > 1, journal=scratch / "samples.jsonl" if main_rank else None)
    callbacks = [
        MetricsToTracker(log_metrics, cfg.log_every),
        PeriodicEval(corpus, job.sources, seq_len=model_cfg.seq_len, eval_tokens=cfg.budget.eval_tokens,
                     report=report),
        *([text_samples] if text_samples is not None else []),
        checkpointer,
    ]
    saver = None
    if job.trunk and job.trunk_steps:
        saver = StableSaver(Path(job.trunk), job.trunk_steps, model=model, optimizer=optimizer, sampler=sampler,
                            accelerator=accelerator, extra=extra, companions=companions)
        callbacks.append(saver)
    milestones = None
    if cfg.milestone_steps:  # weights at the declared steps, into scratch now, into the artifact at the end
        milestones = MilestoneSaver(scratch / MILESTONES, cfg.milestone_steps, model=model, accelerator=accelerator,
                                    extra=extra)
        callbacks.append(milestones)
    if ema is not None:  # first: the savers after it keep the EMA of the step they save
        callbacks.insert(0, ema)
    events = EventLog(log_metrics)
    started = time.perf_counter()
    with progress.task("main: training steps", cfg.budget.steps) as advance:
        advance(state.step if state else 0)
        result = run_training(model, sampler, peak_lr=peak_lr, budget=cfg.budget, seed=job.seed,
                              callbacks=[*callbacks, events, StepProgress(advance)], state=state, optimizer=optimizer,
                              checkpoint_every=checkpoints, stability=cfg.stability,
                              rewind=lambda: checkpointer.rewind(model, optimizer),
                              accelerator=accelerator, min_lr_ratio=cfg.min_lr_ratio)
    checkpointer.wait()
    wall_s = time.perf_counter() - started
    checkpointer.save_final(out / "checkpoint", model=model, optimizer=result.optimizer, state=result.state,
                            sampler_state=sampler.state_dict())
    if not main_rank:
        return {}
    if processes > 1:
        model = load_model(out / "checkpoint")  # rank 0 scores the consolidated weights alone
    if milestones is not None:
        collect_milestones(scratch / MILESTONES, out, cfg.milestone_steps)
    average_steps = cfg.averaged_steps_pool[-cfg.average_last:] if cfg.average_last else []
    averaged = keep_averaged(out, model=model, state=result.state, extra=extra, ema=ema, average_steps=average_steps)
    events.frame().to_parquet(out / "events.parquet", index=False)
    evals = evaluate_sources(model, corpus, job.sources, seq_len=model_cfg.seq_len,
                             eval_tokens=cfg.budget.eval_tokens)
    frame = evals_frame(evals, checkpoint="main", step=result.state.step, tokens_seen=result.state.tokens_seen)
    frame.to_parquet(out / "heldout.parquet", index=False)
    if averaged:  # the averaged models, scored like the final weights (beside them: heldout.parquet stays final)
        labels = {"ema": "ema", "average": f"average_last{cfg.average_last}"}
        device = next(model.parameters()).device
        pd.concat([evals_frame(evaluate_sources(load_model(path).to(device), corpus, job.sources,
                                                seq_len=model_cfg.seq_len, eval_tokens=cfg.budget.eval_tokens),
                               checkpoint=labels[name], step=result.state.step, tokens_seen=result.state.tokens_seen)
                   for name, path in averaged.items()], ignore_index=True).to_parquet(
            out / "averaged_heldout.parquet", index=False)
    packing_report(corpus, [model_cfg.seq_len]).to_parquet(out / "packing.parquet", index=False)
    if text_samples is not None:
        text_samples.frame().to_parquet(out / "samples.parquet", index=False)
    summary = {"peak_lr": peak_lr, "steps": result.state.step, "tokens_seen": result.state.tokens_seen,
               "train_wall_s": wall_s, "mixture": choice["name"],
               "final_loss_nats": result.state.loss_nats,  # also when resumed at the last step, from the checkpoint
               "resumed_from_step": resumed_from_step, "epochs": main_epochs, "spike_events": len(result.events),
               "schedule": cfg.budget.schedule,
               "peak_lr_source": lr_source,
               "world_size": processes, "strategy": dist.strategy if processes > 1 else "single",
               "activation_checkpointing": dist.activation_checkpointing}
    if resumed_from:
        summary["resumed_from"] = resumed_from
    if cfg.milestone_steps or averaged:  # the weights kept beside the final ones (tasks.train.milestones names)
        summary |= {"milestones": cfg.milestone_steps, "ema_decay": cfg.ema_decay, "average_last": cfg.average_last,
                    "averaged_steps": average_steps, "kept_weights": ["final", *[f"step_{s:08d}" for s in
                                                                                 cfg.milestone_steps], *averaged]}
    if isinstance(checkpoints, YoungInterval):  # δ, step time, τ and the interval in steps it was derived from
        summary["checkpoint_schedule"] = {"kind": "young", **checkpoints.record,
                                          "checkpoints_saved": len(checkpoints.saved_at)}
    if cfg.budget.schedule == "wsd":
        summary |= {"decay_start": cfg.budget.decay_start, "decay_steps": cfg.budget.decay_steps,
                    "decay_shape": cfg.budget.decay_shape, "min_lr_ratio": cfg.min_lr_ratio,
                    "trunk_key": Path(job.trunk).name,
                    # the run's stable-phase checkpoints in the trunk, whichever attempt (or run) wrote them
                    "stable_checkpoints": sorted({s for s, _ in trunk_checkpoints(Path(job.trunk))
                                                  if s in job.trunk_steps and s <= result.state.step})}
    (out / "run.json").write_text(json.dumps(summary, indent=2))
    return summary


def main_peak_lr(cfg: MainConfig, best: dict | None) -> tuple[float, dict]:
    """The main run's peak LR and where it came from.

    ``[main] peak_lr`` when set; otherwise the sweep's best LR at the swept width nearest the main model's
    d_model (by ratio). Under the standard parametrisation the best LR moves with width, so a study at the main
    width, or the nearest one to it, beats the proxy width's.

    Raises:
        ConfigError: no ``[main] peak_lr`` and no sweep result to take one from.
    """
    if cfg.peak_lr:
        return cfg.peak_lr, {"from": "config"}
    if best is None:
        raise ConfigError("the main run has no peak LR: set [main] peak_lr or run the sweep stage")
    target = cfg.model.d_model
    nearest = nearest_width_lr(best, target)
    return float(nearest["best_lr"]), {"from": "sweep", "d_model": nearest["d_model"], "study": nearest["study_name"],
                                       "main_d_model": target}


def main_trunk_key(cfg: MainConfig, inputs: dict[str, Path], *, packing: PackingConfig, seed: int) -> str:
    """The trunk key of the WSD main run (``tasks.train.trunk.trunk_key``) from its input artifacts: the tokenizer's
    key, the mixture's weights and the peak LR it resolves to (``main_peak_lr``), and the code of this module's
    import closure (the training library included)."""
    choice = load_choice(Path(inputs["mixture"]))
    peak_lr, _ = main_peak_lr(cfg, load_best(Path(inputs["sweep"])) if "sweep" in inputs else None)
    config = trunk_config(cfg, packing=packing, seed=seed, peak_lr=peak_lr, weights=choice["weights"])
    return trunk_key(config, Path(inputs["tokenizer"]).name, code_version_closure("tasks.main.stage"))


def planned_epochs(cfg: MainConfig, weights: dict[str, float], corpus: TokenizedCorpus) -> dict[str, float]:
    """Epochs of each mixture source over the planned run, e_s = w_s · D / U_s (docs/methods.md §8).

    D = steps · batch_size · seq_len tokens (the ``[main]`` budget); U_s = the source's training-split tokens.
    """
    tokens = cfg.budget.steps * cfg.budget.batch_size * cfg.model.seq_len
    return epochs(weights, tokens, corpus.train_sizes(list(weights)))


def _resume(checkpointer: Checkpointer, model, optimizer, sampler):
    """Load the newest complete scratch checkpoint, if any (a corrupt one is skipped with a warning); returns its
    TrainState or None. Sharded checkpoints load on any world size; every rank reaches the same verdict."""
    saved = checkpointer.resume(model, optimizer, sampler)
    if saved is None:
        return None
    if checkpointer.main_process:
        written, processes = saved.get("world_size"), checkpointer.accelerator.num_processes
        note = f", written by {written} processes" if written and written != processes else ""
        print(f"{checkpointer.root.parent.name}: resuming from step {saved['state'].step:,} "
              f"({saved['directory']}{note})")
    return saved["state"]


def load_heldout(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path / "heldout.parquet")
