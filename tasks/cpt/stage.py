"""CPT stage: continued pretraining of the main checkpoint on the domain source with replay.

A grid of replay fraction × peak LR; each candidate starts from the same base weights with a fresh AdamW
state and a short warmup (SPEC §11). The replay stream is the base run's mixture (same general sources and
weights) taking ``replay_fraction`` of every batch. General and domain held-out loss are evaluated every
``cpt.budget.eval_every`` steps, so the forgetting curve is visible in MLflow, and the cloze set at the end.

Outputs: ``candidates/<name>/`` checkpoints, ``evals/<name>.npz`` (per-window general/domain nats and
tokens, cloze correctness — the paired units the gate compares), ``heldout.parquet``, ``cloze.parquet``,
``candidates.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evals.cloze import ClozeItem, score_cloze
from infra.stage import StageContext
from tasks.mixture.stage import load_choice
from tasks.tokenizer.stage import TokenizedCorpus
from tasks.train.checkpoint import load_model, save_checkpoint
from tasks.train.runner import (MetricsToTracker, PeriodicEval, evals_frame, evaluate_sources, make_sampler,
                                run_training, seed_everything, StepProgress)
from tasks.train.sections import CptConfig
from tasks.tokenizer.config import PackingConfig


def replay_weights(domain: list[str], general_weights: dict[str, float], replay_fraction: float) -> dict[str, float]:
    """Batch shares: domain sources split 1 − f evenly; general sources get f times their base-mixture weight."""
    weights = {name: (1.0 - replay_fraction) / len(domain) for name in domain}
    for name, w in general_weights.items():
        weights[name] = weights.get(name, 0.0) + replay_fraction * w
    return weights


def run(ctx: StageContext, cfg: CptConfig, *, general: list[str], cloze_items: list[ClozeItem],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Score the base, then train and score every grid candidate."""
    seed_everything(ctx.seed, ctx.torch_threads)
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    tokenizer = corpus.tokenizer
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    base_weights = load_choice(ctx.inputs["mixture"])["weights"]
    checkpoint = ctx.inputs["main"] / "checkpoint"
    scorer = _Scorer(ctx, corpus, general, cfg, cloze_items, encode)
    scorer.score("base", load_model(checkpoint), {"replay_fraction": None, "peak_lr": None}, step=0)
    grid = [(f, lr) for f in cfg.replay_fractions for lr in cfg.peak_lrs]
    with ctx.progress.task("cpt: replay × LR grid steps", len(grid) * cfg.budget.steps) as advance:
        for index, (fraction, peak_lr) in enumerate(grid):
            name = f"replay{fraction:g}_lr{peak_lr:g}"
            model = load_model(checkpoint)
            weights = replay_weights(cfg.domain_sources, base_weights, fraction)
            sampler = make_sampler(corpus, weights, seq_len=model.cfg.seq_len, batch_size=cfg.budget.batch_size,
                                   seed=ctx.seed + index, packing=packing)
            callbacks = [MetricsToTracker(ctx.log_metrics, 1, prefix=f"{name}."), scorer.curve(name, model.cfg.seq_len),
                         StepProgress(advance)]
            result = run_training(model, sampler, peak_lr=peak_lr, budget=cfg.budget, seed=ctx.seed + index,
                                  callbacks=callbacks, min_lr_ratio=cfg.min_lr_ratio)
            save_checkpoint(ctx.out / "candidates" / name, model=model, optimizer=result.optimizer,
                            state=result.state, sampler_state=sampler.state_dict(),
                            extra={"tokenizer_hash": corpus.meta["tokenizer_hash"], "replay_weights": weights,
                                   "manifest_hash": corpus.meta.get("manifest_hash", "")})
            realised = sampler.realised_fractions()
            params = {"replay_fraction": fraction, "peak_lr": peak_lr,
                      "realised_replay_fraction": float(sum(realised.get(g, 0.0) for g in general))}
            scorer.score(name, model, params, step=result.state.step)
    return scorer.write()


class _Scorer:
    """Scores models on the held-out splits and the cloze items; collects the rows and paired arrays."""

    def __init__(self, ctx, corpus, general, cfg, items, encode):
        self.ctx, self.corpus, self.general, self.cfg = ctx, corpus, general, cfg
        self.items, self.encode = items, encode
        self.heldout, self.cloze, self.candidates = [], [], {}
        (ctx.out / "evals").mkdir(parents=True, exist_ok=True)

    def _arrays(self, model, sources) -> tuple[np.ndarray, np.ndarray, list]:
        evals = evaluate_sources(model, self.corpus, sources, seq_len=model.cfg.seq_len,
                                 eval_tokens=self.cfg.budget.eval_tokens)
        nats = np.concatenate([e.loss.window_nats for e in evals])
        tokens = np.concatenate([e.loss.window_tokens for e in evals])
        return nats / np.maximum(tokens, 1), tokens, evals

    def score(self, name: str, model, params: dict, step: int) -> None:
        g_nats, g_tokens, g_evals = self._arrays(model, self.general)
        d_nats, d_tokens, d_evals = self._arrays(model, self.cfg.domain_sources)
        cloze = score_cloze(model, self.encode, self.items, max_len=model.cfg.seq_len).assign(checkpoint=name)
        np.savez(self.ctx.out / "evals" / f"{name}.npz", general_window_nats=g_nats, general_window_tokens=g_tokens,
                 domain_window_nats=d_nats, domain_window_tokens=d_tokens,
                 cloze_correct=cloze["correct"].to_numpy(bool))
        self.heldout.append(evals_frame(g_evals + d_evals, checkpoint=name, step=step,
                                        tokens_seen=step * self.cfg.budget.batch_size * model.cfg.seq_len))
        self.cloze.append(cloze)
        self.candidates[name] = {**params, "general_loss_nats": float(np.average(g_nats, weights=g_tokens)),
                                 "domain_loss_nats": float(np.average(d_nats, weights=d_tokens)),
                                 "cloze_accuracy": float(cloze["correct"].mean())}

    def curve(self, name: str, seq_len: int) -> PeriodicEval:
        def report(step, tokens_seen, evals):
            by_role = {"general": self.general, "domain": self.cfg.domain_sources}
            metrics = {}
            for role, sources in by_role.items():
                mine = [e for e in evals if e.source in sources]
                metrics[f"{name}.{role}_loss_nats"] = sum(e.loss.sum_nats for e in mine) / max(
                    1, sum(e.loss.n_tokens for e in mine))
            self.ctx.log_metrics(metrics, step)

        return PeriodicEval(self.corpus, self.general + self.cfg.domain_sources, seq_len=seq_len,
                            eval_tokens=self.cfg.budget.eval_tokens, report=report)

    def write(self) -> dict[str, Any]:
        pd.concat(self.heldout, ignore_index=True).to_parquet(self.ctx.out / "heldout.parquet", index=False)
        cloze = pd.concat(self.cloze, ignore_index=True)
        cloze["logprobs"] = cloze["logprobs"].map(lambda v: json.dumps([float(x) for x in v]))
        cloze.to_parquet(self.ctx.out / "cloze.parquet", index=False)
        (self.ctx.out / "candidates.json").write_text(json.dumps(self.candidates, indent=2))
        return {"candidates": self.candidates}


def load_candidates(path: Path) -> dict[str, dict]:
    return json.loads((path / "candidates.json").read_text())
