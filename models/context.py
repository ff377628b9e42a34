"""Position recipes for extending a trained decoder's context window (docs/methods.md §15).

A recipe says how RoPE treats the positions beyond the window the model was trained on:

- ``interpolation`` (position interpolation, Chen et al. 2023): every position m is rotated as m / s, so the
  target window maps onto the angles of the trained one. s = ``factor``; 0 means target / trained length.
- ``rope_base`` (a larger RoPE base frequency, Xiong et al. 2023): θ becomes ``rope_theta``, which slows every
  rotation, most of all the low-frequency pairs that carry long-range position.
- ``none``: positions beyond the trained window are rotated as they come (the control).

Applying a recipe changes the model config only (``seq_len``, ``rope_theta``, ``rope_scaling_factor``); the
weights are the base's unchanged, since RoPE has no parameters.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import model_validator

from infra.section import Section
from models.config import ModelConfig

POSITIONS: tuple[str, ...] = ("interpolation", "rope_base", "none")


class PositionRecipe(Section):
    """One position recipe of a context extension (docs/methods.md §15).

    Fields:
        name: the recipe's name in candidate names and tables (letters, digits, ``_ . -``).
        position: ``interpolation`` (Chen et al. 2023), ``rope_base`` (Xiong et al. 2023) or ``none``.
        factor: interpolation only: s ≥ 1 dividing every position; 0 = target_seq_len / the base's seq_len.
        rope_theta: rope_base only: the new RoPE base θ, larger than the base's.

    Raises:
        ValueError (as a config error): a field that the recipe's ``position`` does not use is set, or one it
            needs is missing.
    """

    name: str
    position: Literal["interpolation", "rope_base", "none"]
    factor: float = 0.0
    rope_theta: float = 0.0

    @model_validator(mode="after")
    def _fields_of_position(self) -> "PositionRecipe":
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"recipe name {self.name!r}: use letters, digits, '_', '.' or '-' (it names checkpoints)")
        if self.position == "interpolation":
            if self.rope_theta:
                raise ValueError(f"recipe {self.name}: rope_theta belongs to position = 'rope_base'")
            if self.factor and self.factor < 1.0:
                raise ValueError(f"recipe {self.name}: factor = {self.factor} must be >= 1 (0 = target / base length)")
        elif self.position == "rope_base":
            if self.factor:
                raise ValueError(f"recipe {self.name}: factor belongs to position = 'interpolation'")
            if not self.rope_theta > 0:
                raise ValueError(f"recipe {self.name}: position = 'rope_base' needs rope_theta > 0 (the new base)")
        elif self.factor or self.rope_theta:
            raise ValueError(f"recipe {self.name}: position = 'none' takes neither factor nor rope_theta")
        return self

    def describe(self, base: ModelConfig, target_seq_len: int) -> str:
        """One line: what the recipe does to ``base`` at ``target_seq_len``."""
        cfg = extended_config(base, target_seq_len, self)
        if self.position == "interpolation":
            return (f"position interpolation ×{cfg.rope_scaling_factor / base.rope_scaling_factor:g} "
                    f"(positions / {cfg.rope_scaling_factor:g}), θ {cfg.rope_theta:g}")
        if self.position == "rope_base":
            return f"RoPE base θ {base.rope_theta:g} → {cfg.rope_theta:g}"
        return f"no position change (θ {cfg.rope_theta:g}): positions past {base.seq_len} are new to the model"


def extended_config(base: ModelConfig, target_seq_len: int, recipe: PositionRecipe) -> ModelConfig:
    """``base`` with ``seq_len = target_seq_len`` and the recipe applied to its RoPE (docs/methods.md §15).

    Interpolation multiplies the base's own ``rope_scaling_factor`` by s (a base that was already interpolated
    keeps its mapping and adds this one); ``rope_base`` replaces θ.

    Raises:
        ValueError: ``target_seq_len`` below the base's ``seq_len``, or a ``rope_base`` θ not larger than the
            base's (a smaller base speeds rotations up, the opposite of an extension).
    """
    if target_seq_len < base.seq_len:
        raise ValueError(f"target_seq_len = {target_seq_len} is shorter than the base's seq_len = {base.seq_len}")
    changes: dict = {"seq_len": int(target_seq_len)}
    if recipe.position == "interpolation":
        factor = recipe.factor or target_seq_len / base.seq_len
        changes["rope_scaling_factor"] = base.rope_scaling_factor * factor
    elif recipe.position == "rope_base":
        if recipe.rope_theta <= base.rope_theta:
            raise ValueError(f"recipe {recipe.name}: rope_theta = {recipe.rope_theta:g} is not larger than the "
                             f"base's {base.rope_theta:g}")
        changes["rope_theta"] = float(recipe.rope_theta)
    return ModelConfig(**{**base.model_dump(), **changes})
