"""Main-run stage: the decoder trained on the chosen mixture at the swept peak LR.

Writes resumable checkpoints to the stage's scratch folder every ``main.checkpoint_every`` steps, so a crash
resumes from the newest complete one (a corrupt one is skipped with a warning); the final full-state checkpoint goes into the artifact.

Outputs: ``checkpoint/`` (model.safetensors, optimizer.pt, state.json, checksums.json), ``heldout.parquet``
(held-out loss and bits per byte per source at the end), ``run.json`` (peak LR, mixture, tokens seen, timing,
the step it resumed from, and the epochs of each mixture source e_s = w_s · D / U_s, SPEC §8).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd

from infra.errors import CheckpointError
from infra.stage import StageContext
from tasks.mixture.candidates import epoch_warnings, epochs
from tasks.mixture.stage import load_choice
from tasks.sweep.stage import load_best
from tasks.tokenizer.stage import TokenizedCorpus
from tasks.train.checkpoint import CheckpointCallback, latest_checkpoint, load_checkpoint, save_checkpoint
from tasks.train.optim import build_optimizer
from tasks.train.config import OptimConfig
from tasks.train.runner import (EventLog, MetricsToTracker, PeriodicEval, build_model, evals_frame, evaluate_sources,
                                make_sampler, run_training, seed_everything, StepProgress)
from models.planning import require_fit
from tasks.train.sections import MainConfig
from tasks.tokenizer.config import PackingConfig
from tasks.tokenizer.stage import packing_report


def run(ctx: StageContext, cfg: MainConfig, *, sources: list[str], max_epochs: float = 4.0,
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Train the main model and score it on every source's held-out split.

    Before training, refuses a layout whose memory (SPEC §3) exceeds 90% of the detected device's (ConfigError
    naming the numbers), and prints a warning for each mixture source the planned run repeats more than ``max_epochs``
    times (w·D/U, SPEC §8); the threshold only shapes that message, so it is not part of the stage key.
    """
    seed_everything(ctx.seed, ctx.torch_threads)
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    choice = load_choice(ctx.inputs["mixture"])
    peak_lr = cfg.peak_lr or load_best(ctx.inputs["sweep"])["best_lr"]
    model_cfg = cfg.model.build(corpus.vocab_size)
    require_fit(model_cfg, cfg.budget.batch_size)  # refuse before allocating anything (SPEC §3 arithmetic)
    model = build_model(model_cfg, ctx.seed)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=peak_lr, warmup_steps=cfg.budget.warmup_steps))
    sampler = make_sampler(corpus, choice["weights"], seq_len=model_cfg.seq_len,
                           batch_size=cfg.budget.batch_size, seed=ctx.seed, packing=packing)
    extra = {"tokenizer_hash": corpus.meta["tokenizer_hash"], "manifest_hash": corpus.meta.get("manifest_hash", ""), "mixture": choice["weights"], "peak_lr": peak_lr}
    main_epochs = planned_epochs(cfg, choice["weights"], corpus)
    for warning in epoch_warnings(main_epochs, max_epochs):
        print(f"warning: main run: {warning}")
    state = _resume(ctx.scratch, model, optimizer, sampler)
    # Training advances ``state`` in place: read the resume point before it moves.
    resumed_from_step = state.step if state else 0

    def report(step: int, tokens_seen: int, evals) -> None:
        ctx.log_metrics({f"heldout.{e.source}.loss_nats": e.loss.loss_nats for e in evals}, step)

    checkpointer = CheckpointCallback(ctx.scratch, extra=extra, keep_last=cfg.keep_checkpoints,
                                      asynchronous=cfg.async_checkpoints)
    callbacks = [
        MetricsToTracker(ctx.log_metrics, cfg.log_every),
        PeriodicEval(corpus, sources, seq_len=model_cfg.seq_len, eval_tokens=cfg.budget.eval_tokens, report=report),
        checkpointer,
    ]
    events = EventLog(ctx.log_metrics)

    def rewind():
        """Reload the newest complete checkpoint's weights, optimiser and loop state; the loader moves on."""
        checkpointer.wait()
        latest = latest_checkpoint(ctx.scratch)
        return None if latest is None else load_checkpoint(latest, model=model, optimizer=optimizer)["state"]

    started = time.perf_counter()
    with ctx.progress.task("main: training steps", cfg.budget.steps) as advance:
        advance(state.step if state else 0)
        result = run_training(model, sampler, peak_lr=peak_lr, budget=cfg.budget, seed=ctx.seed,
                              callbacks=[*callbacks, events, StepProgress(advance)], state=state, optimizer=optimizer,
                              checkpoint_every=cfg.checkpoint_every, stability=cfg.stability, rewind=rewind)
    checkpointer.wait()
    events.frame().to_parquet(ctx.out / "events.parquet", index=False)
    wall_s = time.perf_counter() - started
    save_checkpoint(ctx.out / "checkpoint", model=model, optimizer=result.optimizer, state=result.state,
                    sampler_state=sampler.state_dict(), extra=extra)
    evals = evaluate_sources(model, corpus, sources, seq_len=model_cfg.seq_len, eval_tokens=cfg.budget.eval_tokens)
    frame = evals_frame(evals, checkpoint="main", step=result.state.step, tokens_seen=result.state.tokens_seen)
    frame.to_parquet(ctx.out / "heldout.parquet", index=False)
    packing_report(corpus, [model_cfg.seq_len]).to_parquet(ctx.out / "packing.parquet", index=False)
    summary = {"peak_lr": peak_lr, "steps": result.state.step, "tokens_seen": result.state.tokens_seen,
               "train_wall_s": wall_s, "mixture": choice["name"],
               "final_loss_nats": float(result.metrics[-1]["loss_nats"]) if result.metrics else None,
               "resumed_from_step": resumed_from_step, "epochs": main_epochs, "spike_events": len(result.events)}
    (ctx.out / "run.json").write_text(json.dumps(summary, indent=2))
    shutil.rmtree(ctx.scratch, ignore_errors=True)
    return summary


def planned_epochs(cfg: MainConfig, weights: dict[str, float], corpus: TokenizedCorpus) -> dict[str, float]:
    """Epochs of each mixture source over the planned run, e_s = w_s · D / U_s (SPEC §8).

    D = steps · batch_size · seq_len tokens (the ``[main]`` budget); U_s = the source's training-split tokens.
    """
    tokens = cfg.budget.steps * cfg.budget.batch_size * cfg.model.seq_len
    return epochs(weights, tokens, corpus.train_sizes(list(weights)))


def _resume(folder: Path, model, optimizer, sampler):
    """Load the newest complete scratch checkpoint, if any; returns its TrainState or None."""
    for candidate in sorted(folder.glob("step_*"), reverse=True):
        try:
            saved = load_checkpoint(candidate, model=model, optimizer=optimizer)
        except CheckpointError as err:  # a torn or corrupt checkpoint: fall back to the previous one
            print(f"warning: skipping unusable checkpoint {candidate.name}: {err}")
            continue
        sampler.load_state_dict(saved["sampler_state"])
        print(f"{folder.parent.name}: resuming from step {saved['state'].step:,} ({candidate})")
        return saved["state"]
    return None


def load_heldout(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path / "heldout.parquet")
