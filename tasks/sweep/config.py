"""Config section for the peak-learning-rate sweep on a proxy model (log-uniform LR, median pruning)."""

import math
from typing import Literal

from pydantic import model_validator

from evals.stats import MIN_UNITS
from infra.errors import ConfigError
from infra.section import Section


class SweepConfig(Section):
    """A peak-LR sweep.

    Fields:
        n_trials: trials in the study (finished ones of an earlier, interrupted sweep count), ≥ 1.
        lr_min, lr_max: peak-LR search range, 0 < lr_min < lr_max; searched on a log scale.
        sampler: ``tpe`` (Bayesian, log-uniform) or ``grid`` (n_trials log-spaced LRs).
        pruner_startup_trials: trials that finish before the median pruner may stop any trial.
        pruner_warmup_steps: steps within a trial before it may be pruned.
        report_every: steps between intermediate held-out evaluations reported to the pruner, ≥ 1.
        seed: base seed; the sampler and every trial's seed derive from it.
        widths: further proxy widths (d_model) to sweep with the same settings, for the width-transfer check;
            d_ff scales with the width, heads stay. The LR that feeds the main run is the one at ``[proxy]``'s width.
        spread_tolerance: completed trials within this relative distance of the best held-out loss count as "near
            the optimum"; their LR range is reported as the spread of the choice.
        forecast_windows: shares of the best trial's tokens on which L(D) = L∞ + a·D^−γ is fitted to forecast its
            final held-out loss (docs/methods.md §10); at least 3 held-out reports must fall in a window.
        lr_decided_factor: the peak LR is decided when the confidence set of the fitted cubic's minimum (in
            ln(peak LR), Fieller 1954) is bounded and spans at most this factor (high/low), > 1 (docs/methods.md §14).
        confidence: of that set (and of the width exponent's bootstrap interval), in (0, 1).
        min_fit_trials: COMPLETE trials the cubic LR fit needs before it may decide, ≥ 10 (``MIN_UNITS["trials"]``:
            the fewest from which the set's simulated coverage stayed within [0.93, 0.99], docs/methods.md §16);
            with fewer the main run takes the best trial's LR. Pruned trials do not count: give ``n_trials`` and
            ``pruner_startup_trials`` room for that many to complete.

    Raises:
        ConfigError: naming the field and the fix.
    """

    n_trials: int = 4
    lr_min: float
    lr_max: float
    sampler: Literal["tpe", "grid"] = "tpe"
    pruner_startup_trials: int = 2
    pruner_warmup_steps: int = 0
    report_every: int
    seed: int = 0
    widths: list[int] = []
    spread_tolerance: float = 0.02
    forecast_windows: list[float] = [0.5, 0.75]
    lr_decided_factor: float = 3.0
    confidence: float = 0.95
    min_fit_trials: int = MIN_UNITS["trials"]

    @model_validator(mode="after")
    def _check(self) -> "SweepConfig":
        if self.n_trials < 1:
            raise ConfigError(f"sweep.n_trials = {self.n_trials}: must be ≥ 1")
        if not (math.isfinite(self.lr_min) and math.isfinite(self.lr_max) and 0.0 < self.lr_min < self.lr_max):
            raise ConfigError(
                f"sweep.lr_min = {self.lr_min}, sweep.lr_max = {self.lr_max}: need 0 < lr_min < lr_max"
            )
        if self.pruner_startup_trials < 0:
            raise ConfigError(f"sweep.pruner_startup_trials = {self.pruner_startup_trials}: must be ≥ 0")
        if self.pruner_warmup_steps < 0:
            raise ConfigError(f"sweep.pruner_warmup_steps = {self.pruner_warmup_steps}: must be ≥ 0")
        if self.report_every < 1:
            raise ConfigError(f"sweep.report_every = {self.report_every}: must be ≥ 1 step")
        if self.seed < 0:
            raise ConfigError(f"sweep.seed = {self.seed}: must be ≥ 0")
        if any(w <= 0 for w in self.widths) or len(set(self.widths)) != len(self.widths):
            raise ConfigError(f"sweep.widths = {self.widths}: give distinct positive d_model values")
        if not 0.0 <= self.spread_tolerance < 1.0:
            raise ConfigError(f"sweep.spread_tolerance = {self.spread_tolerance}: must lie in [0, 1)")
        if not self.forecast_windows or any(not 0.0 < w < 1.0 for w in self.forecast_windows):
            raise ConfigError(f"sweep.forecast_windows = {self.forecast_windows}: give at least one share in (0, 1) "
                              "(a window of 1 would fit the very point it forecasts)")
        if not (math.isfinite(self.lr_decided_factor) and self.lr_decided_factor > 1.0):
            raise ConfigError(f"sweep.lr_decided_factor = {self.lr_decided_factor}: must be > 1 (a high/low ratio)")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"sweep.confidence = {self.confidence}: must lie in (0, 1), e.g. 0.95")
        if self.min_fit_trials < MIN_UNITS["trials"]:
            raise ConfigError(f"sweep.min_fit_trials = {self.min_fit_trials}: must be ≥ {MIN_UNITS['trials']}, the "
                              "fewest COMPLETE trials from which the simulated coverage of the LR optimum's interval "
                              "stayed within [0.93, 0.99] (docs/methods.md §16)")
        return self
