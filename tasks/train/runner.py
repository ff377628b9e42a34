"""Shared machinery of every training stage (mixture proxies, sweep trials, main run, CPT candidates).

Builds a seeded model, samples batches from token shards by mixture weights, runs the training loop with
callbacks for MLflow metrics and periodic held-out evaluation, and scores held-out loss per source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from evals.heldout import HeldoutLoss, bits_per_byte, heldout_loss
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.packing import PackingConfig
from tasks.train.corpus import TokenizedCorpus
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.intervals import YoungInterval
from tasks.train.loop import Callback, SpikeRule, TrainResult, TrainState, seed_everything, train
from tasks.train.optim import set_adamw
from tasks.train.sections import RunBudget, StabilityConfig

MetricsFn = Callable[[Mapping[str, float], int], None]


def build_model(cfg: ModelConfig, seed: int) -> Decoder:
    seed_everything(seed)
    return Decoder(cfg)


def make_sampler(corpus: TokenizedCorpus, weights: Mapping[str, float], *, seq_len: int, batch_size: int,
                 seed: int, packing: PackingConfig = PackingConfig(), sampling: str = "exact") -> MixtureSampler:
    """A loader over the train shards of the sources with non-zero weight, packed as ``packing`` says."""
    active = {k: float(v) for k, v in weights.items() if v > 0}
    streams = {name: corpus.stream(name, "train") for name in active}
    return MixtureSampler(streams, active, seq_len=seq_len, batch_size=batch_size, seed=seed,
                          packing=packing.policy, document_mask=packing.document_mask, pad_id=corpus.pad_id,
                          sampling=sampling)


@dataclass
class SourceEval:
    source: str
    split: str
    loss: HeldoutLoss
    bits_per_byte: float


def evaluate_sources(model: torch.nn.Module, corpus: TokenizedCorpus, sources: Sequence[str], *,
                     seq_len: int, eval_tokens: int, split: str = "heldout") -> list[SourceEval]:
    """Held-out loss (nats/token) and bits per byte per source on the first ``eval_tokens`` of each shard."""
    results = []
    for source in sources:
        if not corpus.has(source, split):
            continue
        tokens = corpus.tokens(source, split)
        loss = heldout_loss(model, tokens, seq_len=seq_len, batch_size=8, max_tokens=eval_tokens)
        bpb = bits_per_byte(loss.loss_nats, corpus.tokens_per_byte(source, split))
        results.append(SourceEval(source, split, loss, bpb))
    return results


def evals_frame(evals: Sequence[SourceEval], **columns) -> pd.DataFrame:
    """DuckDB ``heldout_loss`` rows: source, split, tokens, loss_nats, bits_per_byte plus given columns."""
    return pd.DataFrame([
        {**columns, "source": e.source, "split": e.split, "tokens": int(e.loss.n_tokens),
         "loss_nats": float(e.loss.loss_nats), "bits_per_byte": float(e.bits_per_byte)}
        for e in evals
    ])


def token_weighted_loss(evals: Sequence[SourceEval]) -> float:
    """Mean nats/token over all evaluated tokens of the given sources."""
    return float(sum(e.loss.sum_nats for e in evals) / max(1, sum(e.loss.n_tokens for e in evals)))


class MetricsToTracker(Callback):
    """Sends per-step training metrics to the tracker every ``every`` steps (step unit: optimiser steps)."""

    def __init__(self, log: MetricsFn, every: int, prefix: str = ""):
        self.log, self.every, self.prefix = log, max(1, every), prefix

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        if state.step % self.every == 0:
            self.log({f"{self.prefix}{k}": float(v) for k, v in metrics.items() if _is_number(v)}, state.step)


class EventLog(Callback):
    """Collects loss-spike / non-finite events (step, batches_drawn, loss_nats, median, action, rewound_to) and
    sends each to the tracker at its step as ``spike_event`` = 1 (the loss itself only when finite)."""

    COLUMNS = ["step", "batches_drawn", "loss_nats", "median", "action", "rewound_to"]

    def __init__(self, log: MetricsFn):
        self.log, self.events = log, []

    def on_event(self, state: TrainState, event: dict) -> None:
        self.events.append(event)
        self.log({"spike_event": 1.0, "spike_loss_nats": float(event["loss_nats"])}, int(event["step"]))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.events, columns=self.COLUMNS).astype(
            {"step": "int64", "batches_drawn": "int64", "loss_nats": "float64", "median": "float64",
             "action": "string", "rewound_to": "float64"})


class StepProgress(Callback):
    """Advances a progress bar by one per optimiser step."""

    def __init__(self, advance: Callable[[int], None]):
        self.advance = advance

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        self.advance(1)


class PeriodicEval(Callback):
    """Held-out loss per source at each evaluation point, passed to ``report(step, tokens_seen, evals)``."""

    def __init__(self, corpus: TokenizedCorpus, sources: Sequence[str], *, seq_len: int, eval_tokens: int,
                 report: Callable[[int, int, list[SourceEval]], None]):
        self.corpus, self.sources, self.report = corpus, list(sources), report
        self.seq_len, self.eval_tokens = seq_len, eval_tokens

    def on_eval(self, state: TrainState, model: torch.nn.Module) -> None:
        evals = evaluate_sources(model, self.corpus, self.sources, seq_len=self.seq_len, eval_tokens=self.eval_tokens)
        self.report(state.step, state.tokens_seen, evals)


def run_training(model: torch.nn.Module, sampler: MixtureSampler, *, peak_lr: float, budget: RunBudget,
                 seed: int, callbacks: Sequence[Callback] = (), min_lr_ratio: float = 0.1,
                 state: TrainState | None = None, optimizer=None, checkpoint_every: int | YoungInterval = 0,
                 stability: StabilityConfig | None = None, rewind=None, accelerator=None,
                 decay_steps: int | None = None) -> TrainResult:
    """AdamW training for ``budget.steps`` optimiser steps under ``budget.schedule`` (warmup-cosine or WSD, floor
    ``min_lr_ratio``·peak; docs/methods.md §6 settings); with ``stability``, its z-loss, accumulation, instruments
    and spike policy (``rewind`` reloads the last checkpoint). ``decay_steps``: WSD decay length in steps instead
    of ``budget.decay_fraction`` (a decay branch; 0 = the stable trunk, no decay).

    AdamW's β1, β2, ε and λ are ``budget.adamw``'s, also for a given (e.g. resumed) ``optimizer``, whose groups are
    set to them (``optim.set_adamw``). ``checkpoint_every``: steps, or a schedule (``tasks.train.intervals``)."""
    st = stability or StabilityConfig(spike_policy="warn", instrument_every=0)
    optim = OptimConfig(peak_lr=peak_lr, warmup_steps=budget.warmup_steps, min_lr_ratio=min_lr_ratio,
                        z_loss=st.z_loss, micro_batches=st.micro_batches, schedule=budget.schedule,
                        decay_fraction=budget.decay_fraction, decay_shape=budget.decay_shape, decay_steps=decay_steps,
                        **budget.adamw.model_dump())
    if optimizer is not None:
        set_adamw(optimizer, optim)
    spike = None if stability is None else SpikeRule(
        window=st.spike_window, factor=st.spike_factor, min_history=st.spike_min_history, policy=st.spike_policy,
        lr_factor=st.rewind_lr_factor, max_consecutive=st.max_consecutive_spikes)
    return train(model, sampler, optim, total_steps=budget.steps, eval_every=budget.eval_every,
                 callbacks=list(callbacks), state=state, optimizer=optimizer, seed=seed,
                 checkpoint_every=checkpoint_every, spike=spike, rewind=rewind,
                 instrument_every=st.instrument_every, accelerator=accelerator)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
