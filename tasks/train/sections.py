"""Config sections of the training stages: the proxy runs (mixture and LR sweep), the main run and CPT.

The model's vocabulary size is not configured here: it comes from the fitted tokenizer (padded to a
multiple of 64/128, docs/methods.md §8), so ``ModelShape.build(vocab_size)`` makes the full ``ModelConfig``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.section import NOT_IN_KEY, Section
from models.config import ModelConfig


class ModelShape(Section):
    """Decoder shape without the vocabulary (docs/methods.md §2).

    Checked when the config is loaded, so a shape no stage could build fails before anything runs.

    Raises:
        ValueError (reported by ``load_config`` as ConfigError under ``<section>.model.<field>``): d_model not
            divisible by n_heads, an odd head_dim (RoPE rotates pairs), or n_kv_heads not dividing n_heads.
    """

    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    seq_len: int = Field(gt=1)
    tied_embeddings: bool = True
    qk_norm: bool = False

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, n_heads: int, info: ValidationInfo) -> int:
        d_model = info.data.get("d_model")
        if d_model is None:  # d_model itself failed; its own error is reported
            return n_heads
        if d_model % n_heads:
            raise ValueError(f"{n_heads} does not divide d_model = {d_model}; use one of {_divisors(d_model)}")
        if (d_model // n_heads) % 2:
            even = [h for h in _divisors(d_model) if (d_model // h) % 2 == 0]
            fix = f"use one of {even}" if even else "make d_model even"
            raise ValueError(f"head_dim = d_model / n_heads = {d_model // n_heads} is odd and RoPE needs it "
                             f"even; {fix}")
        return n_heads

    @field_validator("n_kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, n_kv_heads: int, info: ValidationInfo) -> int:
        n_heads = info.data.get("n_heads")
        if n_heads is not None and n_heads % n_kv_heads:
            raise ValueError(f"{n_kv_heads} does not divide n_heads = {n_heads} (each KV head serves a whole group "
                             f"of query heads); use one of {_divisors(n_heads)}")
        return n_kv_heads

    def build(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **self.model_dump())


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


class RunBudget(Section):
    """Steps and batch of one training run; tokens per step = batch_size · seq_len."""

    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    eval_every: int = Field(default=0, ge=0, description="steps between held-out evaluations; 0 = end only")
    eval_tokens: int = Field(default=16_384, gt=0, description="held-out tokens scored per source")

    @model_validator(mode="after")
    def _warmup_fits(self) -> "RunBudget":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < steps ({self.steps}); lower it")
        return self


class ProxyConfig(Section):
    """Small proxy models used by the mixture ablation and the LR sweep (docs/methods.md §8)."""

    model: ModelShape
    budget: RunBudget
    peak_lr: float = Field(default=3e-3, gt=0, description="LR of the mixture proxies (the sweep searches its own)")


class StabilityConfig(Section):
    """Loss terms, gradient accumulation, instruments and the loss-spike policy of the main run (docs/methods.md §6).

    Fields:
        z_loss: coefficient of mean((log Z)²) added to the loss (docs/methods.md §6: 1e-4; 0 = off).
        micro_batches: gradient-accumulation slices per step; batch_size must divide evenly.
        spike_window, spike_factor, spike_min_history: a loss above factor × the median of the previous window
            losses (once min_history exist) is a spike (docs/methods.md §6: 2.0 × median of 50); a non-finite loss always is.
        spike_policy: warn (record, apply), skip (drop the update) or rewind (reload the last checkpoint, skip the
            data in between, scale the LR by rewind_lr_factor).
        max_consecutive_spikes: that many events in a row stop the run.
        instrument_every: steps between update/weight ratio and max |attention logit| measurements (0 = never).
    """

    z_loss: float = Field(default=0.0, ge=0)
    micro_batches: int = Field(default=1, gt=0)
    spike_window: int = Field(default=50, gt=0)
    spike_factor: float = Field(default=2.0, gt=1)
    spike_min_history: int = Field(default=10, ge=1)
    spike_policy: Literal["warn", "skip", "rewind"] = "rewind"
    rewind_lr_factor: float = Field(default=1.0, gt=0, le=1)
    max_consecutive_spikes: int = Field(default=5, gt=0)
    instrument_every: int = Field(default=10, ge=0, json_schema_extra=NOT_IN_KEY)

    @model_validator(mode="after")
    def _history_fits_window(self) -> "StabilityConfig":
        if self.spike_min_history > self.spike_window:
            raise ValueError(f"spike_min_history ({self.spike_min_history}) > spike_window ({self.spike_window}): "
                             "no loss could ever count as a spike; lower it or widen the window")
        return self


class DistributedConfig(Section):
    """How the main run is launched and parallelised (``tasks/train/parallel.py``).

    Fields:
        launch: ``inprocess`` trains inside the pipeline's process (one process, this machine); ``accelerate``
            starts ``processes`` workers with ``accelerate launch`` (the same command a Prefect worker runs on an
            H100 node) and streams their metrics into the stage's MLflow run.
        processes: processes on this machine (GPUs on a GPU node). Multi-node layouts come from the accelerate
            config (see infra/accelerate/h100_multinode.yaml).
        accelerate_config: accelerate launch config; a relative path is looked up from the working directory,
            then from the installed project (infra/accelerate/).
        strategy: ``fsdp`` (FSDP2 full shard, ZeRO-3), ``hybrid`` (shard within ``shard_size`` ranks, replicate
            across) or ``ddp`` (replicated).
        activation_checkpointing: recompute each block's activations in backward (docs/methods.md §3).

    Not in the stage key: a layout changes results only by float reduction order (tests/unit/test_train_distributed).
    """

    launch: Literal["inprocess", "accelerate"] = "inprocess"
    processes: int = Field(default=1, gt=0)
    accelerate_config: str = "infra/accelerate/local_processes.yaml"
    strategy: Literal["ddp", "fsdp", "hybrid"] = "fsdp"
    shard_size: int = Field(default=0, ge=0, description="hybrid: ranks per shard group; 0 = one node's processes")
    activation_checkpointing: bool = False

    @model_validator(mode="after")
    def _one_process_in_process(self) -> "DistributedConfig":
        if self.launch == "inprocess" and self.processes != 1:
            raise ValueError(f"processes = {self.processes} needs launch = \"accelerate\" (an in-process run is one "
                             "process)")
        return self


class MainConfig(Section):
    """The main pretraining run (docs/methods.md §2, §6). ``peak_lr`` comes from the sweep unless set here."""

    model: ModelShape
    budget: RunBudget
    peak_lr: float | None = Field(default=None, gt=0, description="override the swept LR (not recommended)")
    log_every: int = Field(default=10, gt=0, json_schema_extra=NOT_IN_KEY)
    checkpoint_every: int = Field(default=0, ge=0, description="steps between resumable checkpoints; 0 = end only",
                                  json_schema_extra=NOT_IN_KEY)
    keep_checkpoints: int = Field(default=3, gt=0, description="newest complete scratch checkpoints kept",
                                  json_schema_extra=NOT_IN_KEY)
    async_checkpoints: bool = Field(default=False, description="snapshot to CPU and write in a background thread",
                                    json_schema_extra=NOT_IN_KEY)
    stability: StabilityConfig = StabilityConfig()
    # The launch layout changes results only by the order of float sums.
    distributed: DistributedConfig = Field(default=DistributedConfig(), json_schema_extra=NOT_IN_KEY)

    @model_validator(mode="after")
    def _micro_batches_divide(self) -> "MainConfig":
        split = self.stability.micro_batches * self.distributed.processes
        if self.budget.batch_size % split:
            raise ValueError(f"budget.batch_size = {self.budget.batch_size} does not split over "
                             f"distributed.processes = {self.distributed.processes} × stability.micro_batches = "
                             f"{self.stability.micro_batches}; use a multiple of {split}")
        if self.async_checkpoints and self.distributed.launch == "accelerate":
            raise ValueError("async_checkpoints applies to in-process runs; a launched run writes sharded "
                             "checkpoints collectively: set async_checkpoints = false")
        return self


class CptConfig(Section):
    """Continued pretraining on the domain source(s) with replay of the base mixture (docs/methods.md §11).

    Fields:
        replay_fractions × peak_lrs × seeds: the candidate grid (seeds are offsets to the experiment seed).
        replay_sampling: ``exact`` (every batch holds the replay share, up to carried rounding) or ``bernoulli``
            (each sequence is replay with probability f); the realised share is logged either way.
        replay_weights: the replay stream's source weights; empty = the base run's mixture (same sources, weights).
        base_checkpoint: an external base (a checkpoint directory: model.safetensors + state.json with its model
            config and tokenizer hash) instead of the main run's; its tokenizer must be this experiment's. Or a
            Hugging Face model folder (config.json + safetensors; Llama, Mistral, Qwen3: ``models.hf``), whose
            tokenizer ``[tokenizer] pretrained`` must name (``tasks.cpt.hf_base``). Either way the CPT model's
            shape, context length included, is the base's, not ``[main] model``'s.
        decontaminate: drop held-out windows and cloze items sharing a 13-gram with the CPT training stream
            before any scoring (the hits are listed in ``decontamination.parquet``).
    """

    domain_sources: list[str] = Field(min_length=1)
    replay_fractions: list[float] = Field(min_length=1)
    peak_lrs: list[float] = Field(min_length=1)
    budget: RunBudget
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    seeds: list[int] = Field(default=[0], min_length=1)
    replay_sampling: Literal["exact", "bernoulli"] = "exact"
    replay_weights: dict[str, float] = {}
    base_checkpoint: str = ""
    decontaminate: bool = True

    @model_validator(mode="after")
    def _ranges(self) -> "CptConfig":
        for fraction in self.replay_fractions:
            if not 0.0 <= fraction < 1.0:
                raise ValueError(f"replay fraction {fraction} must be in [0, 1); it is the share of general text")
        if any(lr <= 0 for lr in self.peak_lrs):
            raise ValueError("every CPT peak_lr must be > 0")
        for name, values in (("replay_fractions", self.replay_fractions), ("peak_lrs", self.peak_lrs)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} {values} repeats a value: two candidates would share a name")
        if len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds {self.seeds}: give distinct offsets ≥ 0")
        if self.replay_weights:
            total = sum(self.replay_weights.values())
            if min(self.replay_weights.values()) < 0 or abs(total - 1.0) > 1e-6:
                raise ValueError(f"replay_weights {self.replay_weights} must be ≥ 0 and sum to 1 (they sum to {total:g})")
        return self
