"""Config section of the scaling ladder: the proxy grid (widths × budgets) whose losses fit L(N, D) and forecast the
main run's final held-out loss (docs/methods.md §5)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import model_validator

from infra.errors import ConfigError
from infra.section import Section


class LadderConfig(Section):
    """A scaling ladder: one proxy run per (width, budget), a fit of L(N, D) = E + A/N^α + B/D^β, and a forecast.

    Fields:
        enabled: run the ladder (off: the stage writes an empty artifact and no forecast is recorded).
        widths: d_model values, ≥ 2 distinct; each shape is the main model at that width (d_ff in proportion,
            heads kept, seq_len kept so the losses compare with the main run's). Each must be a multiple of
            2 × ``[main] model.n_heads`` (an even head dimension for RoPE).
        scale_layers: also scale n_layers with the width, n_layers = max(1, round(L_main · width / d_main)); off:
            every rung has the main model's n_layers.
        steps: token budgets as optimiser steps, ≥ 2 distinct, each ≥ 2; warmup is the main run's share of its
            steps (at least 1 step), and each rung runs the main run's schedule (warmup-cosine, or WSD with its
            decay fraction) over its own budget.
        batch: ``main`` (the ``[main]`` batch size) or ``proxy`` (the ``[proxy]`` one).
        holdout: ``[width, steps]`` points left out of the fit to measure how well it predicts; unset: the
            largest-width × largest-budget point when the grid has ≥ 5 points, else none; ``[]``: none.
        bootstrap: resamples of the ladder points (with replacement) for the percentile intervals, ≥ 10.
        confidence: level of those intervals, in (0, 1).
        forecast_tolerance: the largest |relative error| on the held-out points and on the backtest (the largest
            fitted rung forecast from the others) at which the forecast is ``decided``; else it is recorded but
            ``undetermined``.
        max_extrapolation: the largest main-run compute C = 6·N·D, as a multiple of the largest rung's (fitted or
            held out), at which the forecast is ``decided`` (> 1). 10: the coverage study (docs/methods.md §5)
            verifies the interval up to 10×, the demo's main run is 8.9× its largest rung; laws checked farther rest
            on far more runs (20× in Brandfonbrener et al. 2024, 300× from a 104-model testbed in Gadre et al. 2024).
        max_interval_ratio: the largest high/low of the bootstrap intervals of A and B at which the forecast is
            ``decided`` (> 1). 100: two orders of magnitude; the demo's degenerate fit had A in [4e-195, 5.4e17].
        max_exponent_width: the widest bootstrap interval of α and β (high − low) at which the forecast is
            ``decided`` (> 0). 0.5: wider than the spread of published exponents (α 0.076 in Kaplan et al. 2020
            to 0.34 in Hoffmann et al. 2022), so a wider interval says nothing about the exponent.
        bound_tolerance: an exponent within this distance of its bounds [0, 4] (``fit.EXPONENT_BOUNDS``) counts as
            on the bound, a fit the data did not determine (≥ 0, below 1). 0.02: an exponent below it makes its
            term a near-constant (N^0.02 changes by 6% over a 20× span of N), indistinguishable from E.

    Raises:
        ConfigError: naming the field and the fix.
    """

    enabled: bool = False
    widths: list[int] = []
    scale_layers: bool = False
    steps: list[int] = []
    batch: Literal["main", "proxy"] = "main"
    holdout: list[list[int]] | None = None
    bootstrap: int = 1000
    confidence: float = 0.95
    forecast_tolerance: float = 0.05
    max_extrapolation: float = 10.0
    max_interval_ratio: float = 100.0
    max_exponent_width: float = 0.5
    bound_tolerance: float = 0.02

    @model_validator(mode="after")
    def _check(self) -> "LadderConfig":
        if any(w <= 0 for w in self.widths) or len(set(self.widths)) != len(self.widths):
            raise ConfigError(f"ladder.widths = {self.widths}: give distinct positive d_model values")
        if any(s < 2 for s in self.steps) or len(set(self.steps)) != len(self.steps):
            raise ConfigError(f"ladder.steps = {self.steps}: give distinct budgets of at least 2 optimiser steps")
        if self.enabled and (len(self.widths) < 2 or len(self.steps) < 2):
            raise ConfigError(f"ladder.widths = {self.widths}, ladder.steps = {self.steps}: an enabled ladder needs "
                              "at least 2 widths and 2 budgets (N and D must both vary to fit L(N, D))")
        for point in self.holdout or []:
            if len(point) != 2 or point[0] not in self.widths or point[1] not in self.steps:
                raise ConfigError(f"ladder.holdout: {point} is not a [width, steps] pair of the grid "
                                  f"(widths {self.widths}, steps {self.steps})")
        if self.holdout is not None and self.enabled and \
                len(self.widths) * len(self.steps) - len({tuple(p) for p in self.holdout}) < 3:
            raise ConfigError(f"ladder.holdout = {self.holdout} leaves fewer than 3 points to fit: hold out fewer "
                              "points or add widths/budgets")
        if self.bootstrap < 10:
            raise ConfigError(f"ladder.bootstrap = {self.bootstrap}: use at least 10 resamples (1000 is usual)")
        if not (math.isfinite(self.confidence) and 0.0 < self.confidence < 1.0):
            raise ConfigError(f"ladder.confidence = {self.confidence}: must lie in (0, 1), e.g. 0.95")
        if not 0.0 < self.forecast_tolerance < 1.0:
            raise ConfigError(f"ladder.forecast_tolerance = {self.forecast_tolerance}: must lie in (0, 1), e.g. 0.05")
        if not self.max_extrapolation > 1.0:
            raise ConfigError(f"ladder.max_extrapolation = {self.max_extrapolation}: must be > 1 (a multiple of the "
                              "largest fitted rung's compute), e.g. 10")
        if not self.max_interval_ratio > 1.0:
            raise ConfigError(f"ladder.max_interval_ratio = {self.max_interval_ratio}: must be > 1 (high/low of a "
                              "bootstrap interval), e.g. 100")
        if not self.max_exponent_width > 0.0:
            raise ConfigError(f"ladder.max_exponent_width = {self.max_exponent_width}: must be > 0 (the width of "
                              "α's and β's bootstrap intervals), e.g. 0.5")
        if not 0.0 <= self.bound_tolerance < 1.0:
            raise ConfigError(f"ladder.bound_tolerance = {self.bound_tolerance}: must lie in [0, 1) (a distance "
                              "to the exponent bounds 0 and 4), e.g. 0.02")
        return self

    def grid(self) -> list[tuple[int, int]]:
        """Every (width, steps) point, widths outer, both ascending."""
        return [(w, s) for w in sorted(self.widths) for s in sorted(self.steps)]

    def held_out(self) -> tuple[list[tuple[int, int]], str]:
        """The held-out (width, steps) points and why those: configured, or the default rule."""
        if self.holdout is not None:
            points = sorted({(int(w), int(s)) for w, s in self.holdout})
            return points, f"configured ({len(points)} point{'s' if len(points) != 1 else ''})"
        grid = self.grid()
        if len(grid) >= 5:
            return [(max(self.widths), max(self.steps))], "default: the largest width at the largest budget"
        return [], (f"none: the grid has {len(grid)} points, fewer than 5, so every point goes into the fit and the "
                    "fit's predictions are not checked on an unseen point")
