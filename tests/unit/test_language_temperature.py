"""Temperature sampling over languages (Conneau et al. 2020; docs/methods.md §8): p_ℓ ∝ q_ℓ^α over the languages'
natural token shares, each source at its natural share within its language, against hand computations."""

import math

import pytest

from infra.errors import ConfigError
from infra.section import key_dump
from tasks.mixture.candidates import language_temperature_weights, resolve_candidates, temperature_weights
from tasks.mixture.config import MixtureCandidate, MixtureConfig

# Two languages, three sources: en = a + b = 800 tokens, zh = c = 200 tokens (q_en = 0.8, q_zh = 0.2).
SIZES = {"a": 600, "b": 200, "c": 200}
LANGUAGES = {"a": "en", "b": "en", "c": "zh"}


def test_alpha_half_over_languages_matches_hand_computation():
    # √0.8 = 0.894427, √0.2 = 0.447214, sum 1.341641 → p_en = 2/3, p_zh = 1/3 (√0.8 = 2·√0.2).
    # Within en: a has 600/800, b 200/800 of the tokens → a = 2/3 · 3/4 = 1/2, b = 2/3 · 1/4 = 1/6; c = 1/3.
    weights = language_temperature_weights(SIZES, LANGUAGES, 0.5)
    assert weights == pytest.approx({"a": 1 / 2, "b": 1 / 6, "c": 1 / 3}, abs=1e-12)


def test_alpha_zero_gives_each_language_the_same_weight():
    # p_en = p_zh = 1/2; a = 1/2 · 3/4, b = 1/2 · 1/4, c = 1/2.
    weights = language_temperature_weights(SIZES, LANGUAGES, 0.0)
    assert weights == pytest.approx({"a": 0.375, "b": 0.125, "c": 0.5}, abs=1e-12)


def test_alpha_one_is_the_natural_mixture():
    assert language_temperature_weights(SIZES, LANGUAGES, 1.0) == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})


def test_over_languages_differs_from_over_sources():
    # Over sources: q = 0.6, 0.2, 0.2; √ → 0.774597, 0.447214, 0.447214; sum 1.669024 → a = 0.464102.
    by_source = temperature_weights(SIZES, 0.5)
    assert by_source["a"] == pytest.approx(math.sqrt(0.6) / (math.sqrt(0.6) + 2 * math.sqrt(0.2)))
    assert by_source["a"] == pytest.approx(0.464102, abs=1e-6)
    assert language_temperature_weights(SIZES, LANGUAGES, 0.5)["a"] == pytest.approx(0.5)


def test_one_source_per_language_is_temperature_over_sources():
    sizes = {"x": 900, "y": 100}
    assert language_temperature_weights(sizes, {"x": "en", "y": "zh"}, 0.3) == pytest.approx(
        temperature_weights(sizes, 0.3))


def test_empty_source_gets_zero_and_a_missing_language_is_named():
    weights = language_temperature_weights({**SIZES, "empty": 0}, LANGUAGES, 0.5)  # "empty" needs no language
    assert weights["empty"] == 0.0 and sum(weights.values()) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match=r"\['c'\].*sources\.<name>\.language"):
        language_temperature_weights(SIZES, {"a": "en", "b": "en"}, 0.5)


def _cfg() -> MixtureConfig:
    return MixtureConfig(candidates=[MixtureCandidate(name="natural", alpha=1.0),
                                     MixtureCandidate(name="lang05", alpha=0.5, alpha_over="language"),
                                     MixtureCandidate(name="src05", alpha=0.5)])


def test_resolve_candidates_applies_each_candidates_form():
    resolved = {c.name: c for c in resolve_candidates(_cfg(), SIZES, languages={**LANGUAGES, "unused": None})}
    assert resolved["lang05"].weights == pytest.approx({"a": 1 / 2, "b": 1 / 6, "c": 1 / 3})
    assert resolved["lang05"].alpha_over == "language" and resolved["src05"].alpha_over == "source"
    assert resolved["src05"].weights == pytest.approx(temperature_weights(SIZES, 0.5))
    with pytest.raises(ConfigError, match=r"candidates\['lang05'\]\.alpha_over"):
        resolve_candidates(_cfg(), SIZES)  # no languages given


def test_alpha_over_default_leaves_dumps_unchanged_and_needs_alpha():
    assert "alpha_over" not in key_dump(MixtureCandidate(name="t", alpha=0.3))
    assert key_dump(MixtureCandidate(name="t", alpha=0.3, alpha_over="language"))["alpha_over"] == "language"
    by_source = MixtureConfig(candidates=[MixtureCandidate(name="natural", alpha=1.0),
                                          MixtureCandidate(name="t", alpha=0.3)])
    assert [set(c) for c in key_dump(by_source)["candidates"]] == [{"name", "weights", "alpha"}] * 2
    with pytest.raises(ConfigError, match="alpha_over = 'language'.*give `alpha`"):
        MixtureCandidate(name="w", weights={"a": 1.0}, alpha_over="language")


def test_the_mixture_stage_reads_source_languages_and_keys_them_only_when_used():
    from pathlib import Path

    from flows.config import load_config
    from flows.registry import get_stage
    from tasks.mixture.definition import source_languages

    root = Path(__file__).resolve().parents[2]
    stage = get_stage("mixture")
    by_source = load_config(root / "configs" / "smoke.toml")
    over = [{"name": "natural", "alpha": 1.0}, {"name": "lang0", "alpha": 0.0, "alpha_over": "language"}]
    by_language = load_config(root / "configs" / "smoke.toml", {"mixture.candidates": over})
    assert source_languages(by_language) == {s: by_language.sources[s].language for s in by_language.general_sources}
    assert set(source_languages(by_language).values()) == {"en", "zh"}
    assert "source_languages" not in stage.key_config(by_source)
    assert stage.key_config(by_language)["source_languages"] == source_languages(by_language)
    # Same candidates, a source's declared language changed: the key moves (its weights would).
    first = by_language.general_sources[0]
    moved = load_config(root / "configs" / "smoke.toml", {"mixture.candidates": over,
                                                          f"sources.{first}.language": "fr"})
    assert stage.key_config(moved) != stage.key_config(by_language)


def test_a_general_source_without_a_language_is_refused_at_config_load():
    from pathlib import Path

    from flows.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "smoke.toml")
    first = cfg.general_sources[0]
    over = [{"name": "natural", "alpha": 1.0}, {"name": "lang0", "alpha": 0.0, "alpha_over": "language"}]
    with pytest.raises(ConfigError, match=rf"\['lang0'\].*\['{first}'\] have no language: set sources"):
        load_config(root / "configs" / "smoke.toml", {"mixture.candidates": over, f"sources.{first}.language": None})
    # Over sources the languages are not needed.
    load_config(root / "configs" / "smoke.toml", {f"sources.{first}.language": None})
