"""``[stability]``: the settings of ``pretrain stability``, readable without the training stack
(``tasks.stability.experiment`` runs the grid)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from infra.errors import ConfigError
from infra.section import Section
from tasks.train.sections import ModelShape

INTERVENTIONS = ("bare", "warmup", "clipping", "z_loss", "qk_norm")
class StabilityExperimentConfig(Section):
    """``[stability]``: the grid of ``pretrain stability`` (defaults: docs/methods.md §6 (learning-rate stability grid)).

    Fields:
        lrs: peak learning rates swept.
        interventions: applied cumulatively, in this order; must start with ``bare``.
        steps, batch_size, seq_len: each cell's budget.
        warmup_steps: used once ``warmup`` is on; grad_clip once ``clipping`` is; z_loss once ``z_loss`` is.
        model: n_layers, d_model, n_heads, n_kv_heads, d_ff of the model (vocab from the tokenizer).
        probe_every: steps between max |attention logit| probes.
    """

    lrs: list[float] = Field(default=[0.003, 0.03, 0.1], min_length=1)
    interventions: list[Literal["bare", "warmup", "clipping", "z_loss", "qk_norm"]] = list(INTERVENTIONS)
    steps: int = Field(default=150, gt=10)
    batch_size: int = Field(default=16, gt=0)
    seq_len: int = Field(default=128, gt=1)
    warmup_steps: int = Field(default=15, ge=1)
    grad_clip: float = Field(default=1.0, gt=0)
    z_loss: float = Field(default=1e-4, gt=0)
    model: dict[str, int] = {"n_layers": 4, "d_model": 128, "n_heads": 4, "n_kv_heads": 4, "d_ff": 352}
    probe_every: int = Field(default=5, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "StabilityExperimentConfig":
        if self.interventions[:1] != ["bare"]:
            raise ValueError(f"interventions = {self.interventions} must start with 'bare' (the reference cell)")
        if any(lr <= 0 for lr in self.lrs):
            raise ValueError(f"lrs = {self.lrs}: every learning rate must be > 0")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps = {self.warmup_steps} must be < steps = {self.steps}; lower it")
        shape = dict(self.model)
        shape.setdefault("seq_len", self.seq_len)
        try:  # the grid's model must be one the decoder can build: checked here, not after the first cells
            ModelShape.validate_strict(shape, "stability.model")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self
