"""Config sections of the training stages: the proxy runs (mixture and LR sweep), the main run and CPT.

The model's vocabulary size is not configured here: it comes from the fitted tokenizer (padded to a
multiple of 64/128, docs/methods.md §8), so ``ModelShape.build(vocab_size)`` makes the full ``ModelConfig``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (Field, SerializerFunctionWrapHandler, ValidationInfo, field_validator, model_serializer,
                      model_validator)

from infra.errors import ConfigError
from infra.section import NOT_IN_KEY, Section
from models.config import ModelConfig
from models.context import PositionRecipe
from models.sampling import Sampling
from tasks.train.schedule import decay_start, decay_steps_of


class ModelShape(Section):
    """Decoder shape without the vocabulary (docs/methods.md §2).

    Checked when the config is loaded, so a shape no stage could build fails before anything runs. ``rope_theta``
    and ``rope_scaling_factor`` are as in ``models.config.ModelConfig`` (RoPE base; linear position interpolation).

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
    rope_theta: float = Field(default=10000.0, gt=0)
    rope_scaling_factor: float = Field(default=1.0, ge=1)

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

    @model_serializer(mode="wrap")
    def _default_rope_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        for name, default in (("rope_theta", 10000.0), ("rope_scaling_factor", 1.0)):
            if data.get(name) == default:  # RoPE as it always was: shapes and keys stay as they were
                data.pop(name, None)
        return data


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


WSD_FIELDS = ("schedule", "decay_fraction", "decay_shape")


def check_source_weights(weights: dict[str, float], name: str) -> None:
    """Per-source sampling weights must be ≥ 0 and sum to 1 (within 1e-6).

    Raises:
        ValueError: naming ``name``, the negative weights or the sum.
    """
    negative = {s: w for s, w in weights.items() if w < 0}
    if negative:
        raise ValueError(f"{name} {weights} must be ≥ 0 and sum to 1: {sorted(negative)} are negative")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{name} {weights} must be ≥ 0 and sum to 1 (they sum to {total:g})")


class AdamWConfig(Section):
    """``[<stage>.budget.adamw]``: AdamW's settings for one training run (Loshchilov & Hutter 2019; defaults as
    docs/methods.md §6).

    Fields:
        beta1, beta2: decay rates of Adam's first and second moment estimates, in [0, 1) (0.9, 0.95).
        eps: ε added to √v̂ in the update's denominator, > 0 (1e-8).
        weight_decay: λ of the decoupled decay θ ← θ − η·λ·θ, ≥ 0 (0.1); applied to 2-D weights only
            (``tasks.train.optim.param_groups``).

    Keys: a budget at all four defaults dumps without this table, so every earlier key stays as it was.

    Raises:
        ValueError (reported as ConfigError under ``<stage>.budget.adamw.<field>``): a value outside its range.
    """

    beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam first-moment decay rate")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="Adam second-moment decay rate")
    eps: float = Field(default=1e-8, gt=0, description="Adam ε in the update's denominator")
    weight_decay: float = Field(default=0.1, ge=0, description="decoupled weight decay λ on 2-D weights")


class RunBudget(Section):
    """Steps, batch and LR schedule of one training run; tokens per step = batch_size · seq_len.

    ``schedule``: ``cosine`` (warmup-cosine) or ``wsd`` (warmup-stable-decay: linear warmup, the peak held, then a
    decay over the last ``decay_fraction`` of the steps, K = max(1, ⌊f·steps + ½⌋), in ``decay_shape``;
    docs/methods.md §6; Hu et al. 2024; Hägele et al. 2024). ``1-sqrt`` is the default shape: Hägele et al. 2024
    found it below linear and cosine cooldowns at equal length.

    Keys: the three schedule fields change results only under ``wsd``, so a ``cosine`` budget dumps without them
    and every cosine run keeps the key (and proxy cache entry) it had before WSD existed. ``adamw``
    (``AdamWConfig``) enters the dump only when some setting differs from its default.

    Raises:
        ValueError (reported as ConfigError under the section): warmup_steps ≥ steps; under ``wsd`` a decay that
            would start inside the warmup (name: decay_fraction).
    """

    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    eval_every: int = Field(default=0, ge=0, description="steps between held-out evaluations; 0 = end only")
    eval_tokens: int = Field(default=16_384, gt=0, description="held-out tokens scored per source")
    schedule: Literal["cosine", "wsd"] = Field(default="cosine", description="LR schedule: warmup-cosine or "
                                               "warmup-stable-decay")
    decay_fraction: float = Field(default=0.2, gt=0, le=1, description="wsd: share of the steps spent decaying")
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = Field(default="1-sqrt", description="wsd: shape of the "
                                                                "decay from peak to the floor")
    adamw: AdamWConfig = Field(default=AdamWConfig(), description="AdamW β1, β2, ε and weight decay")

    @model_validator(mode="after")
    def _warmup_fits(self) -> "RunBudget":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < steps ({self.steps}); lower it")
        if self.schedule == "wsd":
            start = decay_start(self.steps, self.decay_fraction)
            if start < self.warmup_steps:
                raise ValueError(f"decay_fraction = {self.decay_fraction} decays over the last "
                                 f"{decay_steps_of(self.steps, self.decay_fraction)} of {self.steps} steps, starting "
                                 f"inside the warmup of {self.warmup_steps} steps; lower decay_fraction or "
                                 "warmup_steps")
        return self

    @model_serializer(mode="wrap")
    def _cosine_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.schedule == "cosine":  # the WSD fields do not act: leave them out of dumps and so out of keys
            for name in WSD_FIELDS:
                data.pop(name, None)
        if self.adamw == AdamWConfig():  # the AdamW every run used before it was configurable: keys as they were
            data.pop("adamw", None)
        return data

    @property
    def decay_steps(self) -> int:
        """WSD decay length K in steps (0 under ``cosine``, whose decay spans the whole run after warmup)."""
        return decay_steps_of(self.steps, self.decay_fraction) if self.schedule == "wsd" else 0

    @property
    def decay_start(self) -> int:
        """WSD: the last stable step D = steps − K (the state after D steps does not depend on ``steps``);
        cosine: ``warmup_steps``, where its decay begins."""
        return self.steps - self.decay_steps if self.schedule == "wsd" else self.warmup_steps


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


class BranchConfig(Section):
    """Decay branches of a WSD main run (docs/methods.md §6; Hägele et al. 2024): from the main run's stable phase at
    each of ``at_steps``, decay to the floor over ``decay_steps`` and score every source's held-out loss.

    Fields:
        at_steps: stable-phase steps s of the main run, each ≥ its warmup_steps and < its decay start.
        decay_steps: the branch length k: an integer number of steps (≥ 1), or a float in (0, 1], the fraction of
            the branch step (k = max(1, ⌊f·s + ½⌋)).
        weights: the branch's per-source mixture (an anneal on higher-quality or specialised sources; every
            source of the experiment may take part); empty = the main run's mixture. With weights, each step also
            gets a branch on the main mixture, the reference of the anneal's deltas.

    Not in the main run's key (it only says where the main run keeps stable checkpoints); the ``branches`` stage
    keys on it.
    """

    at_steps: list[int] = Field(min_length=1)
    decay_steps: int | float = 0.2
    weights: dict[str, float] = {}

    @model_validator(mode="after")
    def _ranges(self) -> "BranchConfig":
        if min(self.at_steps) < 1 or len(set(self.at_steps)) != len(self.at_steps):
            raise ValueError(f"at_steps {self.at_steps}: give distinct steps ≥ 1")
        if isinstance(self.decay_steps, float):
            if not 0.0 < self.decay_steps <= 1.0:
                raise ValueError(f"decay_steps = {self.decay_steps}: a fraction of the branch step must be in (0, 1]; "
                                 "give an integer for a number of steps")
        elif self.decay_steps < 1:
            raise ValueError(f"decay_steps = {self.decay_steps}: a branch needs at least 1 decay step")
        if self.weights:
            check_source_weights(self.weights, "weights")
        return self

    def length(self, at_step: int) -> int:
        """The branch's decay steps k for branch step s."""
        if isinstance(self.decay_steps, float):
            return max(1, int(self.decay_steps * at_step + 0.5))
        return self.decay_steps


class MainConfig(Section):
    """The main pretraining run (docs/methods.md §2, §6). ``peak_lr`` comes from the sweep unless set here.

    ``min_lr_ratio``: the schedule's floor as a fraction of peak (WSD usually decays to about 0); in the key only
    when it differs from 0.1, the floor every main run used before it was configurable. ``branches``: decay branches
    of a WSD run (``BranchConfig``), computed by the ``branches`` stage.

    Kept weights (``tasks.train.milestones``, ``tasks.train.averaging``): ``milestone_every`` (every that many steps)
    and ``milestones`` (given steps) keep those steps' weights in the artifact (``milestones/step_XXXXXXXX/``);
    ``ema_decay`` β > 0 also keeps and scores the EMA of the weights (``ema/``, in-process runs only);
    ``average_last`` K > 0 the uniform mean of the last K milestone weights, the final weights counting as one
    (``average/``). All off by default; each enters the dump (and key) only when set, so earlier keys stay as they
    were.

    ``checkpoint_every``: steps between resumable scratch checkpoints (0 = end only), or ``"young"`` with
    ``mtbf_hours`` (the declared mean time between failures M, required with it and refused without it): after a
    probe save the interval is Young's τ = √(2·δ·M) from the measured save time δ and step time
    (``tasks.train.intervals``; Young 1974). Neither is in the key: when a checkpoint is written changes no result.
    """

    model: ModelShape
    budget: RunBudget
    peak_lr: float | None = Field(default=None, gt=0, description="override the swept LR (not recommended)")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="LR floor at the end of the decay, as a "
                                "fraction of peak_lr")
    branches: BranchConfig | None = Field(default=None, json_schema_extra=NOT_IN_KEY)
    log_every: int = Field(default=10, gt=0, json_schema_extra=NOT_IN_KEY)
    checkpoint_every: Annotated[int, Field(ge=0)] | Literal["young"] = Field(
        default=0, description="steps between resumable checkpoints; 0 = end only; \"young\": Young's interval from "
        "the measured save and step times and mtbf_hours (tasks.train.intervals)", json_schema_extra=NOT_IN_KEY)
    mtbf_hours: float | None = Field(default=None, gt=0, description="checkpoint_every = \"young\": the declared mean "
                                     "time between failures, in hours", json_schema_extra=NOT_IN_KEY)
    keep_checkpoints: int = Field(default=3, gt=0, description="newest complete scratch checkpoints kept",
                                  json_schema_extra=NOT_IN_KEY)
    async_checkpoints: bool = Field(default=False, description="snapshot to CPU and write in a background thread",
                                    json_schema_extra=NOT_IN_KEY)
    milestone_every: int = Field(default=0, ge=0, description="steps between milestone weights kept in the "
                                 "artifact; 0 = none")
    milestones: list[int] = Field(default=[], description="further steps whose weights the artifact keeps")
    ema_decay: float = Field(default=0.0, ge=0, lt=1, description="β of the EMA of the weights kept and scored "
                             "beside the final ones; 0 = off")
    average_last: int = Field(default=0, ge=0, description="K: also keep and score the mean of the last K "
                              "milestone weights (the final weights count as one); 0 = off")
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
        if self.branches is not None:
            if self.budget.schedule != "wsd":
                raise ValueError("branches need budget.schedule = \"wsd\" (a decay branch starts from the stable "
                                 "phase, which warmup-cosine does not have)")
            low, high = self.budget.warmup_steps, self.budget.decay_start
            outside = [s for s in self.branches.at_steps if not low <= s < high]
            if outside:
                raise ValueError(f"branches.at_steps {outside} lie outside the stable phase [{low}, {high}) of the "
                                 f"main run (warmup_steps = {low}; the decay follows step {high} of "
                                 f"{self.budget.steps})")
        return self

    @model_validator(mode="after")
    def _kept_weights_fit(self) -> "MainConfig":
        steps = self.budget.steps
        outside = [s for s in self.milestones if not 1 <= s <= steps]
        if outside or len(set(self.milestones)) != len(self.milestones):
            raise ValueError(f"milestones {self.milestones}: give distinct steps in [1, budget.steps = {steps}]")
        if self.average_last:
            points = self.averaged_steps_pool
            if not 2 <= self.average_last <= len(points):
                have = (f"K ≤ {len(points)}, the milestone steps plus the final step {points}" if len(points) >= 2
                        else f"kept weights to average, and without milestones there is only the final step {points}")
                raise ValueError(f"average_last = {self.average_last} needs 2 ≤ {have}; declare more milestones "
                                 "(milestone_every or milestones) or lower average_last")
        if self.ema_decay and self.distributed.launch == "accelerate":
            raise ValueError("ema_decay is kept by in-process runs only (the average lives beside the unsharded "
                             "weights); use [main.distributed] launch = \"inprocess\" or ema_decay = 0")
        return self

    @property
    def milestone_steps(self) -> list[int]:
        """The steps whose weights the artifact keeps: multiples of ``milestone_every`` up to ``budget.steps`` and
        the ``milestones``, increasing."""
        every = self.milestone_every
        regular = range(every, self.budget.steps + 1, every) if every else ()
        return sorted({*regular, *self.milestones})

    @property
    def averaged_steps_pool(self) -> list[int]:
        """The steps ``average_last`` picks its last K from: the milestone steps and the final step."""
        return sorted({*self.milestone_steps, self.budget.steps})

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _steps_or_young(cls, value):
        if value == "young" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise ValueError(f"checkpoint_every = {value!r}: give a number of steps ≥ 0 (0 = end only) or \"young\" "
                         "(with mtbf_hours, the mean time between failures)")

    @model_validator(mode="after")
    def _young_needs_mtbf(self) -> "MainConfig":
        if self.checkpoint_every == "young" and self.mtbf_hours is None:
            raise ValueError("checkpoint_every = \"young\" needs mtbf_hours, the mean time between failures in hours "
                             "(Young's interval is √(2·δ·M)), e.g. mtbf_hours = 24")
        if self.checkpoint_every != "young" and self.mtbf_hours is not None:
            raise ValueError(f"mtbf_hours = {self.mtbf_hours} applies to checkpoint_every = \"young\" only (got "
                             f"checkpoint_every = {self.checkpoint_every!r}); remove it or set checkpoint_every = "
                             "\"young\"")
        return self

    @model_serializer(mode="wrap")
    def _default_floor_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.min_lr_ratio == 0.1:  # the fixed floor of earlier main runs: their keys stay as they were
            data.pop("min_lr_ratio", None)
        for name, default in (("milestone_every", 0), ("milestones", []), ("ema_decay", 0.0), ("average_last", 0)):
            if data.get(name, default) == default:  # kept weights off: the dump (and key) of earlier runs
                data.pop(name, None)
        if self.mtbf_hours is None:  # fixed checkpoint intervals: configs dump as before Young's interval existed
            data.pop("mtbf_hours", None)
        return data


class ContextExtensionConfig(Section):
    """``[cpt.context]``: extend the base's context window (``[cpt] kind = "context_extension"``, docs/methods.md §15).

    The grid is recipes × ``[cpt] replay_fractions`` × ``peak_lrs`` × ``seeds``; every candidate trains at
    ``target_seq_len`` on rows of the long-document sources (documents kept whole up to the target length) plus the
    replay share of the base mixture, and is cached on its own.

    Fields:
        target_seq_len: the extended window T' in tokens (larger than the base's seq_len).
        recipes: position recipes (``models.context.PositionRecipe``): ``interpolation`` (Chen et al. 2023),
            ``rope_base`` (Xiong et al. 2023), ``none`` (the control); names unique.
        long_sources: the sources whose long documents train and evaluate the extension.
        construction: ``natural`` (only the sources' own documents) or ``concatenate``: documents of one source are
            joined in shard order into long documents of at least target_seq_len + 1 tokens. Declared, logged
            (``long_documents.parquet``) and labelled ``concatenated`` in every table: joined unrelated documents
            are not one coherent long document.
        min_long_token_share: the least share of the long stream's training tokens that must lie in documents
            longer than the base window; a config whose sources supply less is refused with the figures.
        eval_windows: held-out long windows per long source (at most), each one document of target_seq_len + 1
            tokens, for the loss by position bucket.
        retrieval_lengths: passkey prompt lengths in tokens; empty = the base window and doublings up to
            target_seq_len.
        retrieval_depths: where the passkey sits, as a fraction of the filler (0 = start, 1 = end).
        retrieval_items: passkey prompts per (length, depth) cell.
        retrieval_choices: the key and its distractors: a prompt is correct when the true key has the highest
            log-likelihood (chance 1 / retrieval_choices).
    """

    target_seq_len: int = Field(ge=2)
    recipes: list[PositionRecipe] = Field(min_length=1)
    long_sources: list[str] = Field(min_length=1)
    construction: Literal["natural", "concatenate"] = "natural"
    min_long_token_share: float = Field(default=0.5, ge=0, le=1)
    eval_windows: int = Field(default=32, ge=2)
    retrieval_lengths: list[int] = []
    retrieval_depths: list[float] = [0.1, 0.5, 0.9]
    retrieval_items: int = Field(default=16, ge=1)
    retrieval_choices: int = Field(default=4, ge=2, le=10)

    @model_validator(mode="after")
    def _consistent(self) -> "ContextExtensionConfig":
        names = [r.name for r in self.recipes]
        if len(set(names)) != len(names):
            raise ValueError(f"context.recipes names {names} repeat: each names its candidates")
        if len(set(self.long_sources)) != len(self.long_sources):
            raise ValueError(f"context.long_sources {self.long_sources} repeats a source")
        if any(not 0.0 <= d <= 1.0 for d in self.retrieval_depths) or not self.retrieval_depths:
            raise ValueError(f"context.retrieval_depths {self.retrieval_depths}: give fractions in [0, 1]")
        bad = [n for n in self.retrieval_lengths if not 16 <= n <= self.target_seq_len]
        if bad:
            raise ValueError(f"context.retrieval_lengths {bad}: each must lie in [16, target_seq_len = "
                             f"{self.target_seq_len}] (a prompt holds filler, the key and the question)")
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
        kind: ``domain_adaptation`` (train on ``domain_sources``) or ``context_extension`` (extend the window:
            ``[cpt.context]``, docs/methods.md §15; ``domain_sources`` then may stay empty).
        context: the context extension (required by, and only with, ``kind = "context_extension"``).
        recovery_steps: a grid axis of domain adaptation: after the adapted candidate's ``budget.steps``, k more
            optimiser steps on general text only (the replay weights, no domain source), continuing its weights,
            AdamW moments and loader position at a constant LR (docs/methods.md §11, recovery phase). 0 = the
            adapted candidate itself; [0] (the default) = no recovery. Each k > 0 adds a candidate ``<name>_rec<k>``
            branched from the adapted one, which is trained once.
        recovery_lr_ratio: the recovery LR as a fraction of the candidate's peak LR, in (0, 1]; unset = the adapt
            schedule's floor ``min_lr_ratio``, where its LR ended (no re-warming: Ibrahim et al. 2024).

    Keys: at ``recovery_steps = [0]`` neither recovery field is in the dump, so configs and keys stay as they were.

    Raises:
        ValueError (reported as ConfigError under ``cpt``): repeated or negative recovery steps; recovery under
            ``kind = "context_extension"``; a recovery LR of 0 (``min_lr_ratio = 0`` and no ``recovery_lr_ratio``).
    """

    domain_sources: list[str] = []
    replay_fractions: list[float] = Field(min_length=1)
    peak_lrs: list[float] = Field(min_length=1)
    budget: RunBudget
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    seeds: list[int] = Field(default=[0], min_length=1)
    replay_sampling: Literal["exact", "bernoulli"] = "exact"
    replay_weights: dict[str, float] = {}
    base_checkpoint: str = ""
    decontaminate: bool = True
    kind: Literal["domain_adaptation", "context_extension"] = "domain_adaptation"
    context: ContextExtensionConfig | None = None
    recovery_steps: list[int] = Field(default=[0], min_length=1)
    recovery_lr_ratio: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _ranges(self) -> "CptConfig":
        if self.kind == "context_extension" and self.context is None:
            raise ValueError("kind = 'context_extension' needs a [cpt.context] table (target_seq_len, recipes, "
                             "long_sources)")
        if self.kind == "domain_adaptation":
            if self.context is not None:
                raise ValueError("[cpt.context] applies to kind = 'context_extension' only")
            if not self.domain_sources:
                raise ValueError("domain_sources: name at least one domain source (domain adaptation trains on it)")
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
            check_source_weights(self.replay_weights, "replay_weights")
        self._check_recovery()
        return self

    def _check_recovery(self) -> None:
        steps = self.recovery_steps
        if len(set(steps)) != len(steps) or min(steps) < 0:
            raise ValueError(f"recovery_steps {steps}: give distinct step counts ≥ 0 (0 = the adapted candidate "
                             "without recovery)")
        if not self.recovers:
            return
        if self.kind == "context_extension":
            raise ValueError(f"recovery_steps {steps} applies to kind = 'domain_adaptation' only: a context "
                             "extension already replays short-context text in every batch; use recovery_steps = [0]")
        if self.recovery_lr(1.0) == 0.0:
            raise ValueError("recovery_steps: the recovery LR defaults to the adapt floor min_lr_ratio = 0, which "
                             "would not move the weights; set recovery_lr_ratio (e.g. 0.1)")

    @property
    def recovers(self) -> bool:
        """True when some candidate gets a recovery phase (a ``recovery_steps`` entry > 0)."""
        return max(self.recovery_steps) > 0

    def recovery_lr(self, peak_lr: float) -> float:
        """The constant LR of the recovery phase of a candidate with peak LR ``peak_lr``: ``recovery_lr_ratio`` (or
        ``min_lr_ratio``, the LR the adapt schedule ended at) × ``peak_lr``."""
        ratio = self.min_lr_ratio if self.recovery_lr_ratio is None else self.recovery_lr_ratio
        return ratio * peak_lr

    @model_serializer(mode="wrap")
    def _domain_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.kind == "domain_adaptation":  # configs and keys of domain adaptation stay as they were
            data.pop("kind", None)
            data.pop("context", None)
        if data.get("recovery_steps") == [0]:  # no recovery: the recovery fields do not act, nor enter keys
            data.pop("recovery_steps", None)
            data.pop("recovery_lr_ratio", None)
        elif data.get("recovery_lr_ratio", 0.0) is None:  # unset: the floor, already in the dump as min_lr_ratio
            data.pop("recovery_lr_ratio", None)
        return data


class SampleConfig(Sampling):
    """Text samples logged at each evaluation point of the main run and of every CPT candidate (``tasks/train/samples.py``).

    ``prompts`` empty (the default) turns sampling off. Decoding as in ``models.generate.Sampling``: greedy unless
    ``temperature`` > 0, then top-k and nucleus (top-p, Holtzman et al. 2020) with a generator seeded by ``seed``.
    Keep it cheap: each prompt costs ``max_new_tokens`` forward passes of one token per evaluation point.

    Not part of any cache key: samples read the weights and never change them (their own generator, the training
    RNG untouched), so an edit here reuses every cached stage; ``pretrain run CONFIG --refresh main`` samples anew.
    The artifact records the prompts it was sampled with.

    Raises:
        ConfigError: an empty prompt, or a decoding value out of range (the message names the field).
    """

    prompts: list[str] = Field(default=[], description="prompts continued at each evaluation point; empty = off")
    max_new_tokens: int = Field(default=24, description="tokens generated per prompt")

    @model_validator(mode="after")
    def _prompts_not_blank(self) -> "SampleConfig":
        blank = [i for i, p in enumerate(self.prompts) if not p.strip()]
        if blank:
            raise ConfigError(f"samples.prompts: prompt(s) {blank} are empty; give text to continue")
        return self

    @property
    def sampling(self) -> Sampling:
        """The decoding settings alone."""
        return Sampling(**{name: getattr(self, name) for name in Sampling.model_fields})


class PackingConfig(Section):
    """How token shards become training rows (docs/methods.md §8); read by every training stage's loader.

    Fields:
        policy: ``best_fit`` (Ding et al. 2024: documents cut only when longer than a row; rows padded) or
            ``concat`` (concatenate and split: no padding, documents cut at every window edge).
        document_mask: block-diagonal causal attention, so no token attends across a document boundary.
    """

    policy: Literal["best_fit", "concat"] = "best_fit"
    document_mask: bool = False
