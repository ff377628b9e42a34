"""Config section for the mixture ablation: the candidate mixtures and the rule that picks one.

A candidate is either explicit per-source weights or a temperature α (docs/methods.md §8: p_s ∝ q_s^α, α = 1 natural,
α = 0 uniform), applied over sources or, with ``alpha_over = "language"``, over the sources' languages (p_ℓ ∝ q_ℓ^α,
sources at their natural shares within a language; Conneau et al. 2020). Exactly one natural candidate is the
reference every other candidate is compared against.
"""

import math
from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from infra.errors import ConfigError
from infra.section import NOT_IN_KEY, Section
from tasks.train.sections import ModelShape

NATURAL_NAME = "natural"
PROPOSED_NAME = "proposed"
WEIGHT_SUM_TOLERANCE = 1e-6


class MixtureCandidate(Section):
    """One mixture to train a proxy on.

    Give exactly one of ``weights`` (source → sampling weight, each ≥ 0, summing to 1 within 1e-6) or ``alpha``
    (temperature in [0, 1], resolved against source sizes by ``tasks.mixture.candidates.temperature_weights``).
    ``alpha_over`` says what the temperature is applied over: ``"source"`` (p_s ∝ q_s^α, the default) or
    ``"language"`` (p_ℓ ∝ q_ℓ^α over the languages of ``sources.<name>.language``, each source keeping its natural
    share within its language: ``tasks.mixture.candidates.language_temperature_weights``; only with ``alpha``).

    Raises:
        ConfigError: naming ``name``, ``weights``, ``alpha`` or ``alpha_over`` and the fix.
    """

    name: str
    weights: dict[str, float] | None = None
    alpha: float | None = None
    alpha_over: Literal["source", "language"] = "source"

    @model_validator(mode="after")
    def _check(self) -> "MixtureCandidate":
        where = f"mixture.candidates[{self.name!r}]"
        if not self.name.strip():
            raise ConfigError("mixture.candidates[].name is empty: give every candidate a name")
        if (self.weights is None) == (self.alpha is None):
            raise ConfigError(f"{where}: give exactly one of `weights` or `alpha`, not both and not neither")
        if self.alpha is not None:
            check_alpha(self.alpha, f"{where}.alpha")
        else:
            _check_weights(self.weights, f"{where}.weights")
        if self.alpha_over == "language" and self.alpha is None:
            raise ConfigError(f"{where}.alpha_over = 'language' applies a temperature: give `alpha` instead of "
                              "`weights`, or drop alpha_over")
        return self

    @model_serializer(mode="wrap")
    def _default_alpha_over_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if data.get("alpha_over") == "source":  # temperature over sources, as always: dumps and keys unchanged
            data.pop("alpha_over", None)
        return data

    @property
    def is_natural(self) -> bool:
        """True for the natural mixture: named ``"natural"`` or with α = 1 (docs/methods.md §8)."""
        return self.name == NATURAL_NAME or self.alpha == 1.0


def check_alpha(alpha: float, where: str) -> None:
    """Raise ConfigError naming ``where`` unless the temperature α lies in [0, 1] (docs/methods.md §8)."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ConfigError(f"{where} = {alpha}: must lie in [0, 1] (1 = natural shares, 0 = uniform; docs/methods.md §8)")


def _check_weights(weights: dict[str, float], where: str) -> None:
    if not weights:
        raise ConfigError(f"{where} is empty: give a weight for every source")
    bad = {s: w for s, w in weights.items() if not (math.isfinite(w) and w >= 0.0)}
    if bad:
        raise ConfigError(f"{where} has negative or non-finite weights {bad}: every weight must be ≥ 0")
    total = sum(weights.values())
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise ConfigError(f"{where} sums to {total:.9f}: weights must sum to 1 (within {WEIGHT_SUM_TOLERANCE:g})")


class MixtureGenerate(Section):
    """Candidates generated from a budget of proxy runs (``tasks/mixture/design.py``), added to the listed ones.

    Fields:
        kind: ``grid`` (simplex lattice in multiples of ``step``, thinned evenly to ``count``) or ``simplex``
            (``count`` Dirichlet(``concentration``) draws, seeded by ``seed``).
        count: the budget: at most this many generated candidates (each one a proxy run per proxy size).
    """

    kind: Literal["grid", "simplex"]
    count: int = Field(gt=0, le=200)
    step: float = Field(default=0.25, gt=0, le=0.5)
    concentration: float = Field(default=1.0, gt=0)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _step_divides_one(self) -> "MixtureGenerate":
        if self.kind == "grid" and abs(round(1 / self.step) * self.step - 1.0) > 1e-9:
            raise ConfigError(f"mixture.generate.step = {self.step}: 1/step must be an integer (e.g. 0.5, 0.25, 0.2)")
        return self


class MixtureConfig(Section):
    """The mixture ablation: ≥ 2 candidates (unique names, one natural) and the selection rule.

    Fields:
        rule: ``min_token_weighted_bpb`` (held-out-token-weighted mean bits/byte over sources) or ``min_mean_bpb``.
        max_regression_bpb: δ in bits/byte; a candidate is ineligible when any source is worse than under the
            natural mixture by more than δ.
        max_epochs: epochs per source in the main run (w·D/U, D from ``[main]``'s budget) above which the main
            stage warns (~4, docs/methods.md §8). It only sets a warning threshold, so it is left out of every stage key.
        generate: candidates generated from a budget (grid or simplex sample), in addition to ``candidates``.
        transfer_model: a second proxy shape; every candidate is also trained at it and the stage reports Kendall's
            τ between the two sizes' scores, and whether the winner flips. The choice uses ``[proxy]``'s size.
        propose: fit a per-source regression on the trials, propose the mixture it predicts best, verify it with
            one more proxy run and let it compete under the same rule.
        seeds: training seeds per leading candidate (≥ 1): every candidate trains at the experiment seed, then the
            ``top_k`` leading eligible ones train at ``seeds − 1`` derived seeds more, until the top ``top_k`` by
            mean all have them (docs/methods.md §14).
        top_k: how many leading candidates of that first single-seed round get the extra seeds (≥ 2).
        confidence: level of the intervals (the leader's margin over the runner-up, each candidate's seed interval).
        on_undetermined: what is chosen when the margin's interval does not lie above 0: ``natural`` keeps the
            natural mixture; ``least_repeated`` takes, among the leader and the candidates not separable from it,
            the one whose most-repeated source has the smallest w_s/U_s (fewest main-run epochs, docs/methods.md §8).

    Raises:
        ConfigError: naming the field and the fix.
    """

    candidates: list[MixtureCandidate]
    rule: Literal["min_mean_bpb", "min_token_weighted_bpb"] = "min_token_weighted_bpb"
    max_regression_bpb: float = 0.05
    max_epochs: float = Field(default=4.0, json_schema_extra=NOT_IN_KEY)  # shapes warnings only
    generate: MixtureGenerate | None = None
    transfer_model: ModelShape | None = None
    propose: bool = False
    seeds: int = 3
    top_k: int = 2
    confidence: float = 0.95
    on_undetermined: Literal["natural", "least_repeated"] = "natural"

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data):
        if isinstance(data, dict) and "main_tokens" in data:
            raise ConfigError("mixture.main_tokens is no longer read: the main run's tokens D come from [main] "
                              "(steps · batch_size · seq_len); delete the line")
        return data

    @model_validator(mode="after")
    def _check(self) -> "MixtureConfig":
        names = [c.name for c in self.candidates]
        generated = self.generate.count if self.generate else 0
        if len(names) + generated < 2:
            raise ConfigError(f"mixture.candidates has {len(names)} entries and nothing is generated or proposed: "
                              "give at least 2 (the natural one + one), or a [mixture.generate] budget (a proposal needs them too)")
        reserved = sorted(n for n in names if n == PROPOSED_NAME or n.startswith(("grid-", "simplex-")))
        if reserved:
            raise ConfigError(f"mixture.candidates names {reserved} are reserved for generated/proposed candidates: "
                              "rename them")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"mixture.candidates has duplicate names {duplicates}: names must be unique")
        odd = [c.name for c in self.candidates if c.name == NATURAL_NAME and c.alpha not in (None, 1.0)]
        if odd or any(c.name == NATURAL_NAME and c.weights is not None for c in self.candidates):
            raise ConfigError("mixture.candidates: the candidate named 'natural' is the reference and must have "
                              "alpha = 1; rename the other one")
        if not any(c.is_natural for c in self.candidates):
            raise ConfigError(
                "mixture.candidates has no natural mixture: add one with alpha = 1 or named 'natural' (docs/methods.md §8)"
            )
        if not (math.isfinite(self.max_regression_bpb) and self.max_regression_bpb >= 0.0):
            raise ConfigError(f"mixture.max_regression_bpb = {self.max_regression_bpb}: must be ≥ 0 bits/byte")
        if not (math.isfinite(self.max_epochs) and self.max_epochs > 0.0):
            raise ConfigError(f"mixture.max_epochs = {self.max_epochs}: must be > 0 (docs/methods.md §8 suggests ~4)")
        if self.seeds < 1:
            raise ConfigError(f"mixture.seeds = {self.seeds}: must be ≥ 1 (1 = the experiment seed only; 3 measures "
                              "seed noise)")
        if self.top_k < 2:
            raise ConfigError(f"mixture.top_k = {self.top_k}: must be ≥ 2 (the leader and its runner-up get the "
                              "extra seeds)")
        if not (math.isfinite(self.confidence) and 0.0 < self.confidence < 1.0):
            raise ConfigError(f"mixture.confidence = {self.confidence}: must lie in (0, 1), e.g. 0.95")
        return self

    def natural_name(self) -> str:
        """Name of the reference candidate: the one named ``"natural"`` if present, else the first with α = 1."""
        for candidate in self.candidates:
            if candidate.name == NATURAL_NAME:
                return candidate.name
        return next(c.name for c in self.candidates if c.is_natural)
