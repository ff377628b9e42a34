"""Decoding settings (``Sampling``), readable without torch: configs validate them before anything is imported;
``models.generate`` decodes with them."""

from __future__ import annotations

from pydantic import model_validator

from infra.errors import ConfigError
from infra.section import Section


class Sampling(Section):
    """Decoding settings of one generation.

    Fields:
        max_new_tokens: most tokens generated after the prompt (≥ 1).
        temperature: τ ≥ 0; 0 is greedy (argmax, top_k and top_p unused).
        top_k: keep the k most probable tokens before sampling (Fan et al. 2018); 0 = all.
        top_p: keep the smallest most-probable-first set of mass ≥ top_p (nucleus, Holtzman et al. 2020), in
            (0, 1]; 1 = all.
        seed: seed of the sampling generator (``torch.Generator``, never the global RNG).

    Raises:
        ConfigError: a value out of its range (the message names the field).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "Sampling":
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens = {self.max_new_tokens}: must be ≥ 1")
        if not self.temperature >= 0:
            raise ConfigError(f"temperature = {self.temperature}: must be ≥ 0 (0 = greedy)")
        if self.top_k < 0:
            raise ConfigError(f"top_k = {self.top_k}: must be ≥ 0 (0 = no top-k cut)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p = {self.top_p}: must be in (0, 1] (1 = no nucleus cut)")
        if self.seed < 0:
            raise ConfigError(f"seed = {self.seed}: must be ≥ 0")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        """Short label, e.g. ``greedy`` or ``τ=0.8 top_k=40 top_p=0.9 seed=0``."""
        if self.greedy:
            return "greedy"
        parts = [f"τ={self.temperature:g}"]
        parts += [f"top_k={self.top_k}"] if self.top_k else []
        parts += [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
        return " ".join(parts + [f"seed={self.seed}"])
