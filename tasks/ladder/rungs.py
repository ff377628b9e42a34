"""One rung of the scaling ladder: the main model at a smaller width, trained for one token budget on the chosen
mixture at the main run's LR rule and schedule (warmup-cosine unless the main run decays WSD), scored on the general sources' held-out splits (docs/methods.md §5).

Every rung's result is cached on its own under ``<runs>/cache/ladder/<key>.parquet`` (keyed by its shape, budget,
LR, mixture weights, packing, stability settings, seed, evaluated sources, tokenizer and this module's and the
training library's code), so adding a width or a budget trains only the new rungs, and a change to the fit or the
views retrains nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from infra.artifacts import artifact_key, code_version
from infra.atomic import atomic_file
from infra.errors import ConfigError, DataError
from infra.stage import StageContext
from models.arithmetic import param_count
from tasks.readers import nearest_width_lr
from tasks.train.corpus import TokenizedCorpus
from tasks.train.packing import PackingConfig
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training
from tasks.train.sections import MainConfig, ModelShape, RunBudget, StabilityConfig

RUNG_CODE = ("tasks.ladder.rungs", "tasks.train", "models", "evals.heldout")
N_CONVENTION = ("N = non-embedding parameters: the L decoder blocks with their norms, without the token embedding, "
                "the output head and the final norm (Kaplan et al. 2020)")


def rung_shape(main: ModelShape, width: int, scale_layers: bool = False) -> ModelShape:
    """``main`` at d_model = ``width``: d_ff in proportion (a multiple of 8), heads and seq_len kept; with
    ``scale_layers``, n_layers = max(1, round(n_layers · width / d_model)) as well.

    Raises:
        DataError: ``width`` is not a multiple of 2 × n_heads (an even head dimension for RoPE).
    """
    if width % main.n_heads or (width // main.n_heads) % 2:
        raise DataError(f"ladder width {width} is not a multiple of 2 × n_heads = {2 * main.n_heads} of the main "
                        "model: pick another width")
    d_ff = max(8, int(round(main.d_ff * width / main.d_model / 8)) * 8)
    layers = max(1, int(round(main.n_layers * width / main.d_model))) if scale_layers else main.n_layers
    return main.model_copy(update={"d_model": width, "d_ff": d_ff, "n_layers": layers})


def rung_peak_lr(main: MainConfig, best: dict | None, width: int) -> tuple[float, dict]:
    """The rung's peak LR by the main run's rule (``tasks.main.stage.main_peak_lr``) applied at the rung's width:
    ``[main] peak_lr`` when set, else the sweep's best LR at the swept width nearest ``width`` (by ratio).

    Raises:
        ConfigError: no ``[main] peak_lr`` and no sweep result.
    """
    if main.peak_lr:
        return main.peak_lr, {"from": "config"}
    if best is None:
        raise ConfigError("the ladder has no peak LR: set [main] peak_lr or run the sweep stage")
    nearest = nearest_width_lr(best, width)
    return float(nearest["best_lr"]), {"from": "sweep", "d_model": nearest["d_model"]}


def rung_budget(main: MainConfig, steps: int, batch_size: int) -> RunBudget:
    """``steps`` optimiser steps of ``batch_size`` rows under the main run's schedule (warmup-cosine, or its WSD
    decay share and shape) with its warmup share (at least one step, fewer than ``steps``) and its held-out
    ``eval_tokens``; evaluated at the end only.

    Raises:
        ConfigError: the main run's WSD decay share would start inside the rung's warmup.
    """
    warmup = min(steps - 1, max(1, int(round(main.budget.warmup_steps * steps / main.budget.steps))))
    try:  # built, not copied, so that the budget's own checks run
        return RunBudget(**{**main.budget.model_dump(), "steps": steps, "batch_size": batch_size,
                            "warmup_steps": warmup, "eval_every": 0})
    except ValueError as err:
        raise ConfigError(f"ladder.steps: a rung of {steps} steps cannot take the main run's schedule: {err}") from None


def non_embedding_params(shape: ModelShape, vocab_size: int) -> int:
    """N of ``shape`` (see ``N_CONVENTION``; docs/methods.md §2 closed form)."""
    return int(param_count(shape.build(vocab_size)).blocks)


@dataclass(frozen=True)
class Rung:
    """One ladder point: its shape, budget and LR (``lr_from`` says where the LR came from)."""

    width: int
    shape: ModelShape
    budget: RunBudget
    peak_lr: float
    lr_from: dict[str, Any]


class RungTrainer:
    """Trains a rung (or reads it back from ``<runs>/cache/ladder/``) and returns its per-source rows."""

    def __init__(self, ctx: StageContext, corpus: TokenizedCorpus, weights: dict[str, float], general: list[str],
                 packing: PackingConfig, stability: StabilityConfig, min_lr_ratio: float = 0.1):
        self.ctx, self.corpus, self.weights, self.general = ctx, corpus, weights, list(general)
        self.packing, self.min_lr_ratio = packing, min_lr_ratio
        # No checkpoints in a rung: a rewind degrades to a skip; instruments would not change the loss.
        self.stability = stability.model_copy(update={"micro_batches": 1, "instrument_every": 0})
        self.folder = ctx.layout.root / "cache" / "ladder"
        self.code = code_version(*RUNG_CODE)
        self.trained = self.reused = 0

    def key(self, rung: Rung) -> str:
        config = {"weights": {s: round(w, 9) for s, w in sorted(self.weights.items())},
                  "model": rung.shape.model_dump(), "budget": rung.budget.model_dump(), "peak_lr": rung.peak_lr,
                  "packing": self.packing.model_dump(), "stability": self.stability.model_dump(),
                  "seed": self.ctx.seed, "eval_sources": sorted(self.general)}
        if self.min_lr_ratio != 0.1:  # the floor every run had before it was configurable stays out of the key
            config["min_lr_ratio"] = self.min_lr_ratio
        return artifact_key("ladder-rung", config, {"tokenizer": Path(self.ctx.inputs["tokenizer"]).name}, self.code)

    def scores(self, rung: Rung) -> tuple[pd.DataFrame, bool]:
        """Per-source held-out rows (source, loss_nats, bits_per_byte, heldout_tokens, tokens_seen, wall_s) and
        whether they came from the cache.

        Raises:
            DataError: the training diverged (a non-finite loss the stability settings could not skip past).
        """
        key = self.key(rung)
        path = self.folder / f"{key}.parquet"
        if self.ctx.reuses(key, path.is_file()):  # under --refresh ladder: trained again, the entry overwritten
            self.reused += 1
            return pd.read_parquet(path), True
        scored = self._train(rung)
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as f:  # whole or absent: a crash never leaves a half-written result
            scored.to_parquet(f, index=False)
        self.ctx.wrote(key)
        self.trained += 1
        return scored, False

    def _train(self, rung: Rung) -> pd.DataFrame:
        started = time.perf_counter()
        model_cfg = rung.shape.build(self.corpus.vocab_size)
        model = build_model(model_cfg, self.ctx.seed)
        sampler = make_sampler(self.corpus, self.weights, seq_len=model_cfg.seq_len,
                               batch_size=rung.budget.batch_size, seed=self.ctx.seed, packing=self.packing)
        result = run_training(model, sampler, peak_lr=rung.peak_lr, budget=rung.budget, seed=self.ctx.seed,
                              stability=self.stability, min_lr_ratio=self.min_lr_ratio)
        evals = evaluate_sources(model, self.corpus, self.general, seq_len=model_cfg.seq_len,
                                 eval_tokens=rung.budget.eval_tokens)
        if not evals:
            raise DataError(f"none of the general sources {self.general} has a held-out split to score the ladder on")
        wall_s = time.perf_counter() - started
        return pd.DataFrame([{"source": e.source, "loss_nats": e.loss.loss_nats, "bits_per_byte": e.bits_per_byte,
                              "heldout_tokens": int(e.loss.n_tokens), "tokens_seen": int(result.state.tokens_seen),
                              "wall_s": wall_s} for e in evals])
