"""Pick a mixture from proxy runs compared on per-source held-out loss (docs/methods.md §8: proxy ablations).

Scores are in bits per byte, the only loss unit comparable across tokenizers (docs/methods.md, units and conventions). A candidate is
ineligible when any source is worse than under the natural mixture by more than δ = ``max_regression_bpb``, so a
better average never hides a source the main run would quietly get worse at.
"""

import math
from dataclasses import dataclass

import pandas as pd

from infra.errors import DataError
from tasks.mixture.config import MixtureConfig

TRIAL_COLUMNS = ("candidate", "source", "loss_nats", "bits_per_byte", "heldout_tokens")

_RULE_TEXT = {
    "min_token_weighted_bpb": "lowest held-out-token-weighted mean bits/byte over sources",
    "min_mean_bpb": "lowest plain mean bits/byte over sources",
}


@dataclass(frozen=True)
class MixtureChoice:
    """The chosen mixture and how it beat the rest.

    ``score`` and ``runner_up_score`` are in bits/byte; ``margin`` = runner_up_score − score (bits/byte, ≥ 0);
    the runner-up fields are None when only one candidate is eligible. ``scores`` has one row per configured
    candidate: candidate, score, eligible, worst_regression_bpb (max over sources of bpb − natural bpb), reason.
    """

    name: str
    score: float
    runner_up: str | None
    runner_up_score: float | None
    margin: float | None
    rule_text: str
    scores: pd.DataFrame


def select_mixture(trials: pd.DataFrame, cfg: MixtureConfig, *, natural: str,
                   names: list[str] | None = None) -> MixtureChoice:
    """Choose the eligible candidate with the lowest score under ``cfg.rule``.

    Args:
        trials: one row per (candidate, source) with columns candidate, source, loss_nats, bits_per_byte,
            heldout_tokens. A candidate of ``cfg`` with no rows is reported ineligible ("no results").
        cfg: the mixture section (rule and δ).
        natural: name of the natural (reference) candidate; always eligible.
        names: every candidate competing (default: ``cfg.candidates``; the stage adds generated and proposed ones).

    Ties go to the natural mixture, then to the alphabetically first name.

    Raises:
        DataError: missing columns, duplicate (candidate, source) rows, a candidate not in ``cfg``, a candidate
            without every source the natural one has, non-positive held-out tokens, or no usable natural results.
    """
    names = [c.name for c in cfg.candidates] if names is None else list(names)
    _check_trials(trials, names, natural)
    bpb = trials.pivot(index="candidate", columns="source", values="bits_per_byte")
    tokens = trials.pivot(index="candidate", columns="source", values="heldout_tokens")
    rows = [_score_row(name, bpb, tokens, cfg, natural) for name in names]
    scores = pd.DataFrame(rows, columns=["candidate", "score", "eligible", "worst_regression_bpb", "reason"])
    ranked = scores[scores["eligible"]].assign(_not_natural=lambda d: d["candidate"] != natural)
    ranked = ranked.sort_values(["score", "_not_natural", "candidate"])
    best = ranked.iloc[0]
    second = ranked.iloc[1] if len(ranked) > 1 else None
    scores = scores.sort_values(["eligible", "score"], ascending=[False, True], ignore_index=True)
    return MixtureChoice(
        name=best["candidate"],
        score=float(best["score"]),
        runner_up=None if second is None else second["candidate"],
        runner_up_score=None if second is None else float(second["score"]),
        margin=None if second is None else float(second["score"] - best["score"]),
        rule_text=(
            f"{_RULE_TEXT[cfg.rule]}, among candidates no source of which is more than "
            f"δ = {cfg.max_regression_bpb:g} bits/byte worse than under the natural mixture {natural!r}"
        ),
        scores=scores,
    )


def _check_trials(trials: pd.DataFrame, names: list[str], natural: str) -> None:
    missing = [c for c in TRIAL_COLUMNS if c not in trials.columns]
    if missing:
        raise DataError(f"mixture trials lack column(s) {missing}: expected {list(TRIAL_COLUMNS)}")
    duplicated = trials[trials.duplicated(["candidate", "source"], keep=False)]
    if not duplicated.empty:
        pairs = sorted(set(zip(duplicated["candidate"], duplicated["source"])))
        raise DataError(f"mixture trials have duplicate (candidate, source) rows {pairs}: keep one row per pair")
    known = set(names)
    unknown = sorted(set(trials["candidate"]) - known)
    if unknown:
        raise DataError(f"mixture trials name candidate(s) {unknown} not in the config: known are {sorted(known)}")
    if natural not in known:
        raise DataError(f"natural = {natural!r} is not a configured candidate: pick one of {sorted(known)}")
    natural_rows = trials[trials["candidate"] == natural]
    if natural_rows.empty or not natural_rows["bits_per_byte"].map(math.isfinite).all():
        raise DataError(f"the natural candidate {natural!r} has no finite results: rerun its proxy")
    if (trials["heldout_tokens"] <= 0).any():
        raise DataError("mixture trials have rows with heldout_tokens ≤ 0: every evaluated source needs tokens")
    sources = set(natural_rows["source"])
    for name, group in trials.groupby("candidate"):
        if set(group["source"]) != sources:
            raise DataError(
                f"candidate {name!r} was evaluated on sources {sorted(group['source'])}, the natural one on "
                f"{sorted(sources)}: evaluate every candidate on the same sources"
            )


def _score_row(name: str, bpb: pd.DataFrame, tokens: pd.DataFrame, cfg: MixtureConfig, natural: str) -> dict:
    if name not in bpb.index:
        return _row(name, math.nan, False, math.nan, "no results")
    values = bpb.loc[name]
    if cfg.rule == "min_token_weighted_bpb":
        score = float((values * tokens.loc[name]).sum() / tokens.loc[name].sum())
    else:
        score = float(values.mean())
    regression = values - bpb.loc[natural]
    worst = float(regression.max())
    if name == natural:
        return _row(name, score, True, worst, "natural mixture (reference)")
    if not values.map(math.isfinite).all():
        bad = sorted(values.index[~values.map(math.isfinite)])
        return _row(name, score, False, worst, f"non-finite bits/byte on {bad}")
    if worst > cfg.max_regression_bpb:
        source = regression.idxmax()
        return _row(name, score, False, worst, f"{source!r} is {worst:.4f} bits/byte worse than natural (> δ)")
    return _row(name, score, True, worst, f"worst regression {worst:+.4f} bits/byte ≤ δ")


def _row(name: str, score: float, eligible: bool, worst: float, reason: str) -> dict:
    return {"candidate": name, "score": score, "eligible": eligible, "worst_regression_bpb": worst, "reason": reason}
