"""Domain-adaptation candidates, each trained once and kept in the candidate cache, and their recovery phase.

A candidate of the replay × peak LR × seed grid is the base's weights trained ``budget.steps`` steps on the domain
sources with replay of the general mixture (docs/methods.md §11). With ``[cpt] recovery_steps``, each adapted
candidate also branches into recovered ones: k more optimiser steps on general text only (the replay weights, no
domain source), continuing its weights, its AdamW moments and its loader position, at the constant LR
``CptConfig.recovery_lr`` and without warmup (re-warming the LR raises the loss on the earlier distribution:
Gupta et al. 2023; Ibrahim et al. 2024). The general sources read on where the adapt phase's replay stream
stopped. Under a constant LR the first k′ steps of a k-step recovery are the k′-step recovery, so the recovery of
several lengths trains max(k) steps once: each length continues the cached one before it.

Caching: ``runs/cache/cpt/<key>/`` holds a candidate's ``checkpoint/``, ``train.json`` (step, tokens seen, what the
candidate table reports), ``metrics.json`` (the training metrics and forgetting curve, without the candidate's
name, logged again under it when the candidate is reused) and ``samples.parquet``. An adapted candidate's key
reads what its weights depend on: the ``[cpt]`` section without the grid axes, the evaluation-only fields and the
recovery fields, its replay share, peak LR and seed, the replay weights, packing, samples, the tokenizer
artifact, the base's content and the training code. A recovery's key reads the adapted candidate's key, k, the
recovery LR and the general weights. Adding the recovery axis, or a replay share, trains only what is new.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from infra.artifacts import artifact_key, code_version
from infra.atomic import atomic_dir
from infra.stage import StageContext
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.cpt.digest import base_digest
from tasks.train.checkpoint import Checkpointer, verify_checkpoint
from tasks.train.config import OptimConfig
from tasks.train.corpus import TokenizedCorpus
from tasks.train.data import MixtureSampler
from tasks.train.loop import local_accelerator
from tasks.train.optim import build_optimizer
from tasks.train.packing import PackingConfig
from tasks.train.runner import MetricsToTracker, StepProgress, make_sampler, run_training
from tasks.train.samples import PeriodicSamples, SampleConfig, samples_frame
from tasks.train.sections import AdamWConfig, CptConfig, RunBudget

TRAIN_CODE = ("tasks.cpt.adapt", "tasks.cpt.hf_base", "tasks.train", "models")
# Fields of [cpt] that change no candidate's weights, or that are the candidate's own coordinates.
NOT_TRAINING = {"replay_fractions", "peak_lrs", "seeds", "recovery_steps", "recovery_lr_ratio", "decontaminate",
                "base_checkpoint"}

CurveFn = Callable[[Callable[[dict, int], None], int], Any]  # (log, seq_len) → a PeriodicEval callback


def recovery_name(name: str, steps: int) -> str:
    """The name of candidate ``name`` after a recovery of ``steps`` steps: ``<name>_rec<steps>`` (``name`` at 0)."""
    return f"{name}_rec{steps}" if steps else name


def continue_positions(adapted: dict, sampler: MixtureSampler) -> None:
    """Give the recovery's ``sampler`` (general sources only) the adapt loader's row position of every source both
    read, and its batch count, so the general sources continue where the replay stream stopped; rows drawn and
    carried remainders start at zero (the recovery's realised shares are its own).

    Raises:
        DataError: as ``MixtureSampler.load_state_dict``.
    """
    state = sampler.state_dict()
    for source in sampler.sources:
        saved = adapted["position"].get(source)
        if saved is not None and saved["rows"] == state["position"][source]["rows"]:
            state["position"][source] = dict(saved)
    state["batches_drawn"] = int(adapted["batches_drawn"])
    sampler.load_state_dict(state)


def load_trained(folder: Path, lr: float, adamw: AdamWConfig = AdamWConfig()) -> tuple[Decoder, Any, dict]:
    """The model and AdamW state saved in ``folder/checkpoint`` on the training device, and ``Checkpointer.load``'s
    dict (TrainState, sampler state); ``lr`` only seeds the optimiser's groups (the loop sets it every step);
    ``adamw``: the β1, β2, ε, λ the optimiser is built with (``run_training`` sets them again after the load)."""
    directory = folder / "checkpoint"
    record = verify_checkpoint(directory)
    model = Decoder(ModelConfig(**record["model_config"])).to(local_accelerator().device)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=lr, warmup_steps=0, **adamw.model_dump()))
    loaded = Checkpointer(folder).load(directory, model=model, optimizer=optimizer, restore_rng=False)
    return model, optimizer, loaded


def link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst`` (the cache and the artifact store share a runs folder), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class _Recorder:
    """A metrics function that keeps every (step, metrics) row and forwards it under ``prefix``."""

    def __init__(self, log: Callable[[dict, int], None], prefix: str, rows: list | None = None):
        self.log, self.prefix, self.rows = log, prefix, list(rows or [])

    def __call__(self, metrics, step: int) -> None:
        self.rows.append({"step": int(step), "metrics": {k: float(v) for k, v in metrics.items()}})
        self.log({f"{self.prefix}{k}": v for k, v in metrics.items()}, step)

    def replay(self) -> None:
        for row in self.rows:
            self.log({f"{self.prefix}{k}": v for k, v in row["metrics"].items()}, row["step"])


class CandidateTrainer:
    """Trains the adapted and recovered candidates of domain adaptation, or finds them in ``runs/cache/cpt``.

    Args:
        ctx: the stage context (runs folder, MLflow metrics, tokenizer input).
        cfg: ``[cpt]``; corpus, tokenizer: the experiment's; checkpoint: the base (its content enters the keys);
        base_weights: the replay stream's (and the recovery's) general weights; general: the general sources
            (the forgetting curve); packing, samples: as the stage; load_base: a fresh copy of the base's model;
        curve: the forgetting-curve callback for a metrics function and a window (``_Scorer.curve``).
    """

    def __init__(self, ctx: StageContext, cfg: CptConfig, *, corpus: TokenizedCorpus, tokenizer: Any,
                 checkpoint: Path, base_weights: dict[str, float], general: list[str], packing: PackingConfig,
                 samples: SampleConfig, load_base: Callable[[], Decoder], curve: CurveFn):
        self.ctx, self.cfg, self.corpus, self.tokenizer = ctx, cfg, corpus, tokenizer
        self.base_weights, self.packing, self.samples = dict(base_weights), packing, samples
        self.load_base, self.curve = load_base, curve
        self.folder = ctx.layout.root / "cache" / "cpt"
        self.inputs = {"tokenizer": Path(ctx.inputs["tokenizer"]).name, "base": base_digest(checkpoint)}
        self.extra = {"tokenizer_hash": corpus.meta["tokenizer_hash"],
                      "manifest_hash": corpus.meta.get("manifest_hash", ""), "base": str(checkpoint)}
        self.training = {"cpt": cfg.model_dump(mode="json", exclude=NOT_TRAINING), "base_weights": self.base_weights,
                         "general": sorted(general), "packing": packing.model_dump(mode="json"),
                         "samples": samples.model_dump(mode="json")}
        self.code = code_version(*TRAIN_CODE)
        self.trained = self.reused = 0

    def adapt_key(self, fraction: float, peak_lr: float, seed: int) -> str:
        config = {**self.training, "replay_fraction": fraction, "peak_lr": peak_lr, "seed": int(seed)}
        return artifact_key("cpt-domain-candidate", config, self.inputs, self.code)

    def recovery_key(self, adapt_key: str, steps: int, peak_lr: float) -> str:
        config = {"recovery_steps": int(steps), "recovery_lr": self.cfg.recovery_lr(peak_lr),
                  "weights": self.base_weights, "replay_sampling": self.cfg.replay_sampling}
        return artifact_key("cpt-recovery", config, {"adapted": adapt_key}, self.code)

    def adapt(self, name: str, weights: dict[str, float], fraction: float, peak_lr: float, seed: int,
              advance: Callable[[int], None]) -> tuple[str, Path]:
        """The adapted candidate's key and cache folder, trained now where absent (``weights``: the batch shares of
        the domain and replay sources)."""
        key = self.adapt_key(fraction, peak_lr, seed)
        path = self.folder / key
        if self._cached(path, name, advance, self.cfg.budget.steps):
            return key, path
        model = self.load_base()
        sampler = make_sampler(self.corpus, weights, seq_len=model.cfg.seq_len, batch_size=self.cfg.budget.batch_size,
                               seed=seed, packing=self.packing, sampling=self.cfg.replay_sampling)
        recorder = _Recorder(self.ctx.log_metrics, f"{name}.")
        callbacks = self._callbacks(name, recorder, model.cfg.seq_len, advance)
        result = run_training(model, sampler, peak_lr=peak_lr, budget=self.cfg.budget, seed=seed,
                              callbacks=callbacks, min_lr_ratio=self.cfg.min_lr_ratio)
        realised = sampler.realised_fractions()
        replay = [s for s in weights if s not in self.cfg.domain_sources]
        info = {"realised_replay_fraction": float(sum(realised.get(s, 0.0) for s in replay))}
        self._save(path, model, result, sampler, {**self.extra, "replay_weights": weights}, recorder,
                   self._sample_rows(callbacks), info)
        return key, path

    def recover(self, adapted: tuple[str, Path], name: str, steps: list[int], peak_lr: float, seed: int,
                advance: Callable[[int], None]) -> list[tuple[int, Path]]:
        """(k, cache folder) of each recovery of the adapted candidate ``adapted`` (its key and folder) for ``steps``
        (ascending, > 0), trained now where absent; each length continues the one before it."""
        adapt_key, previous = adapted
        lr, done, found = self.cfg.recovery_lr(peak_lr), 0, []
        adapted_step = json.loads((previous / "train.json").read_text())["step"]
        for k in steps:
            path = self.folder / self.recovery_key(adapt_key, k, peak_lr)
            if not self._cached(path, recovery_name(name, k), advance, k - done):
                self._recover(path, previous, name, k, done, lr, adapted_step, seed, advance)
            found.append((k, path))
            previous, done = path, k
        return found

    def _recover(self, path: Path, previous: Path, name: str, k: int, done: int, lr: float, adapted_step: int,
                 seed: int, advance: Callable[[int], None]) -> None:
        """Train ``path``: the recovery of ``k`` steps, continuing ``previous`` (the adapted candidate, or its
        recovery of ``done`` < k steps) at the constant ``lr``."""
        model, optimizer, loaded = load_trained(previous, lr, self.cfg.budget.adamw)
        sampler = make_sampler(self.corpus, self.base_weights, seq_len=model.cfg.seq_len,
                               batch_size=self.cfg.budget.batch_size, seed=seed, packing=self.packing,
                               sampling=self.cfg.replay_sampling)
        rows, carried = [], []
        if done:  # the recovery of ``done`` steps is this one's beginning: its loader, curve and samples go on
            sampler.load_state_dict(loaded["sampler_state"])
            rows = json.loads((previous / "metrics.json").read_text())
            if (previous / "samples.parquet").exists():
                carried = pd.read_parquet(previous / "samples.parquet").to_dict("records")
        else:
            continue_positions(loaded["sampler_state"], sampler)
        target = recovery_name(name, k)
        recorder = _Recorder(self.ctx.log_metrics, f"{target}.", rows)
        recorder.replay()
        callbacks = self._callbacks(target, recorder, model.cfg.seq_len, advance)
        # WSD without warmup or decay: the LR is ``lr`` at every step after the adapted candidate's last one; AdamW
        # as in the adapt phase, whose moments it continues.
        budget = RunBudget(steps=adapted_step + k, batch_size=self.cfg.budget.batch_size, warmup_steps=0,
                           eval_every=self.cfg.budget.eval_every, eval_tokens=self.cfg.budget.eval_tokens,
                           schedule="wsd", adamw=self.cfg.budget.adamw)
        result = run_training(model, sampler, peak_lr=lr, budget=budget, seed=seed, callbacks=callbacks,
                              state=loaded["state"], optimizer=optimizer, decay_steps=0)
        extra = {**loaded["extra"], "recovery": {"steps": int(k), "lr": lr, "weights": self.base_weights,
                                                 "adapted_step": int(adapted_step)}}
        self._save(path, model, result, sampler, extra, recorder, carried + self._sample_rows(callbacks),
                   {"recovery_steps": int(k), "recovery_lr": lr})

    def _callbacks(self, name: str, recorder: _Recorder, seq_len: int, advance: Callable[[int], None]) -> list:
        callbacks = [MetricsToTracker(recorder, 1), self.curve(recorder, seq_len), StepProgress(advance)]
        if self.samples.prompts:
            callbacks.append(PeriodicSamples(self.samples, self.tokenizer, eos_id=int(self.corpus.meta["eos_id"]),
                                             run=name))
        return callbacks

    @staticmethod
    def _sample_rows(callbacks: list) -> list[dict]:
        return [row for c in callbacks if isinstance(c, PeriodicSamples) for row in c.rows]

    def _cached(self, path: Path, name: str, advance: Callable[[int], None], steps: int) -> bool:
        """True when ``path`` holds a finished candidate: its metrics are logged again under ``name``. Under
        ``--refresh cpt`` (``ctx.reuses``) the candidate trains again and its entry is overwritten."""
        if not self.ctx.reuses(path.name, (path / "train.json").is_file()):
            return False
        _Recorder(self.ctx.log_metrics, f"{name}.", json.loads((path / "metrics.json").read_text())).replay()
        advance(steps)
        self.reused += 1
        return True

    def _save(self, path: Path, model, result, sampler, extra: dict, recorder: _Recorder, samples: list[dict],
              info: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_dir(path, replace=self.ctx.refresh) as tmp:  # refreshed: the new candidate replaces the old
            Checkpointer(tmp, extra=extra).save(tmp / "checkpoint", model=model, optimizer=result.optimizer,
                                                state=result.state, sampler_state=sampler.state_dict())
            if samples:
                samples_frame(samples).to_parquet(tmp / "samples.parquet", index=False)
            (tmp / "metrics.json").write_text(json.dumps(recorder.rows))
            (tmp / "train.json").write_text(json.dumps({"step": int(result.state.step),
                                                        "tokens_seen": int(result.state.tokens_seen),
                                                        "params": info}, indent=2))
        self.ctx.wrote(path.name)
        self.trained += 1
