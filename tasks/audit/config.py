"""Settings of the filter audit (docs/methods.md §7 (TinyStories filter audit)): how many originals, how much junk, what to measure.

Defaults are the TinyStories filter audit's mix: the first 5,000 documents + 150 navigation pages, 150 spam pages, 150 repeated-line pages,
150 short fragments, 200 exact copies and 600 near copies (100 at each word edit rate
q ∈ {.01, .03, .05, .08, .12, .20}). The mock benchmark of the detector comparison (50 planted documents per form,
items of 100 words, paraphrase-like edit rates q ∈ {.01, .05, .1, .2, .3}) is a project default.
"""

from typing import Any

from pydantic import field_validator, model_validator

from infra.errors import ConfigError
from infra.section import Section
from tasks.corpus.lsh_design import LshConstraints, design_layouts, parse_layout

EDIT_RATES = [0.01, 0.03, 0.05, 0.08, 0.12, 0.20]
BENCHMARK_EDIT_RATES = [0.01, 0.05, 0.1, 0.2, 0.3]
MIN_BENCHMARK_WORDS = 20


class AuditConfig(Section):
    """One audit of one source.

    Fields:
        num_originals: take the first N clean documents of the source (fewer if it has fewer).
        num_navigation, num_spam, num_repeated, num_short: synthetic junk pages of each kind.
        num_exact_copies: verbatim copies of randomly chosen originals.
        num_near_per_rate: near copies per edit rate; each unit (word, or character for languages written
            without spaces) is substituted or deleted with probability q.
        edit_rates: the rates q, each in (0, 1).
        max_copies_per_original: cap on exact + near copies of one original. An original with many copies makes
            its own lines look like cross-document boilerplate (docs/methods.md §7), and the boilerplate rule would then
            remove the original too; 4 keeps original + copies below the build's default of 10 documents. When
            N originals cannot take every copy, the copy counts are scaled down alike (the filter audit: 800 copies of
            5,000 originals, so never).
        thresholds: Jaccard thresholds at which near-dedup precision and recall are reported.
        bin_edges: Jaccard bin edges for the LSH detection rate (S-curve) plot, increasing in [0, 1].
        review_per_rule: K, removed documents listed per rule for review (audit originals and the real corpus).
        extractor_pages: HTML pages of the source, drawn with ``seed``, on which both HTML extractors are compared
            (``tasks.audit.extractors``); 0 skips the comparison.
        extractor_examples: lines kept by only one extractor listed per extractor.
        benchmark_items: planted documents per form of the mock benchmark on which the near-dedup and n-gram
            contamination detectors are compared (``tasks.audit.benchmark``): verbatim, wrapped, one per
            ``benchmark_edit_rates`` rate, and unrelated control passages; 0 skips the comparison.
        benchmark_words: units (words; characters for languages written without spaces) per benchmark item.
        benchmark_edit_rates: paraphrase-like edit rates q, each in (0, 1): each unit is substituted, deleted or
            swapped with the next one with probability q.
        benchmark_wrap_passages: unrelated passages of ``benchmark_words`` units put before and after a wrapped
            item (1: the item is a third of its page).
        lsh_layouts: LSH layouts "<bands>x<rows>" whose S-curves are drawn beside the configured
            ``[corpus.near_dedup]`` layout (lsh_layouts.png); each is checked against ``lsh_design`` when given.
        lsh_design: detection and admission constraints, "s1=0.8,p1=0.95,s2=0.5,p2=0.05" (optionally
            ",max_hashes=1024"), or a table of those keys; the layouts meeting them with the fewest hashes are
            listed and drawn with the constraint box (``tasks.corpus.lsh_design``). None: no search.
        seed: seed of every random choice; the same seed gives the same mixed set.
    """

    num_originals: int = 5000
    num_navigation: int = 150
    num_spam: int = 150
    num_repeated: int = 150
    num_short: int = 150
    num_exact_copies: int = 200
    num_near_per_rate: int = 100
    edit_rates: list[float] = EDIT_RATES
    max_copies_per_original: int = 4
    thresholds: list[float] = [0.7, 0.8, 0.9]
    bin_edges: list[float] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    review_per_rule: int = 5
    extractor_pages: int = 200
    extractor_examples: int = 5
    benchmark_items: int = 50
    benchmark_words: int = 100
    benchmark_edit_rates: list[float] = BENCHMARK_EDIT_RATES
    benchmark_wrap_passages: int = 1
    lsh_layouts: list[str] = []
    lsh_design: LshConstraints | None = None
    seed: int = 0

    @field_validator("lsh_design", mode="before")
    @classmethod
    def _parse_design(cls, v: Any) -> Any:
        return LshConstraints.parse(v) if isinstance(v, str) else v

    @field_validator("lsh_layouts")
    @classmethod
    def _check_layouts(cls, v: list[str]) -> list[str]:
        for layout in v:
            parse_layout(layout)
        return v

    @model_validator(mode="after")
    def _check(self) -> "AuditConfig":
        counts = ("num_originals", "num_navigation", "num_spam", "num_repeated", "num_short", "num_exact_copies",
                  "num_near_per_rate", "review_per_rule", "max_copies_per_original", "extractor_pages",
                  "extractor_examples", "benchmark_items", "benchmark_wrap_passages")
        for name in counts:
            if getattr(self, name) < 0:
                raise ConfigError(f"audit.{name}={getattr(self, name)} must be >= 0")
        if self.num_originals < 1:
            raise ConfigError(f"audit.num_originals={self.num_originals} must be >= 1 (the audit needs originals)")
        if any(not 0.0 < q < 1.0 for q in self.edit_rates):
            raise ConfigError(f"audit.edit_rates={self.edit_rates}: each rate q must lie in (0, 1)")
        rates = self.benchmark_edit_rates
        if any(not 0.0 < q < 1.0 for q in rates) or len(set(rates)) != len(rates):
            raise ConfigError(f"audit.benchmark_edit_rates={rates}: each rate q must lie in (0, 1), each once")
        if self.benchmark_words < MIN_BENCHMARK_WORDS:
            raise ConfigError(f"audit.benchmark_words={self.benchmark_words} must be >= {MIN_BENCHMARK_WORDS} "
                              "(a 13-gram detector needs items longer than its n-grams)")
        if self.lsh_design is not None:
            design_layouts(self.lsh_design, limit=1)  # NoLayoutError now, before any build runs
        if any(not 0.0 < t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"audit.thresholds={self.thresholds}: each threshold must lie in (0, 1]")
        edges = self.bin_edges
        if len(edges) < 2 or edges != sorted(set(edges)) or edges[0] < 0.0 or edges[-1] > 1.0:
            raise ConfigError(f"audit.bin_edges={edges} must be >= 2 increasing values in [0, 1]")
        return self
