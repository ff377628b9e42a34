"""Config of the corpus build (docs/methods.md §7): kept languages, rule thresholds, PII and deduplication switches.

Defaults are the published values: language-ID threshold 0.65 (FineWeb), Gopher quality and repetition rules
(Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from Training Gopher", App. A), MinHash
with 112 permutations as 14 bands × 8 rows over 5-gram shingles (FineWeb).
"""

import warnings
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from infra.errors import ConfigError, ConfigWarning
from infra.execution import ExecutionConfig
from infra.languages import LID176_LABELS
from infra.section import NOT_IN_KEY, Section
from tasks.corpus.quality_config import QualityModelConfig
from tasks.corpus.urls import UrlRules, compile_rules, files_digest, normal_domain, read_domain_file


def _check_share(name: str, v: float) -> float:
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"{name}={v} is a share of the document and must lie in [0, 1]")
    return v


class GopherConfig(Section):
    """Gopher quality and repetition thresholds (docs/methods.md §7; Rae et al. 2021, App. A, Table A1).

    A document is removed when any rule fires. Word counts are whitespace tokens; shares are fractions in [0, 1].
    ``max_dup_lines`` / ``max_dup_paragraphs``: max share of lines / paragraphs repeating an earlier one;
    ``max_dup_line_chars`` / ``max_dup_paragraph_chars``: max share of characters in those repeats;
    ``top_ngram_max_share`` maps n → max character share of the most frequent word n-gram;
    ``dup_ngram_max_share`` maps n → max character share covered by word n-grams that occur more than once.
    ``max_symbol_word_ratio`` bounds (# + ellipses) per word, a ratio of counts rather than a share.
    """

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    min_stop_words: int = 2
    stop_words: list[str] = ["the", "be", "to", "of", "and", "that", "have", "with"]
    max_dup_lines: float = 0.3
    max_dup_paragraphs: float = 0.3
    max_dup_line_chars: float = 0.2
    max_dup_paragraph_chars: float = 0.2
    top_ngram_max_share: dict[int, float] = {2: 0.20, 3: 0.18, 4: 0.16}
    dup_ngram_max_share: dict[int, float] = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}

    @field_validator("top_ngram_max_share", "dup_ngram_max_share", mode="before")
    @classmethod
    def _int_keys(cls, v: Any) -> Any:
        # TOML table keys are always strings: {2 = 0.2} arrives as {"2": 0.2}.
        if isinstance(v, dict):
            return {int(k) if isinstance(k, str) and k.isdigit() else k: share for k, share in v.items()}
        return v

    @model_validator(mode="after")
    def _check(self) -> "GopherConfig":
        if not 0 <= self.min_words <= self.max_words:
            raise ConfigError(f"gopher min_words={self.min_words} / max_words={self.max_words}: need 0 <= min <= max")
        if not 0 < self.min_mean_word_length <= self.max_mean_word_length:
            raise ConfigError("gopher min_mean_word_length must be > 0 and <= max_mean_word_length")
        if self.max_symbol_word_ratio < 0:
            raise ConfigError(f"gopher max_symbol_word_ratio={self.max_symbol_word_ratio} must be >= 0")
        for name in ("max_bullet_lines", "max_ellipsis_lines", "min_alpha_words", "max_dup_lines",
                     "max_dup_paragraphs", "max_dup_line_chars", "max_dup_paragraph_chars"):
            _check_share(f"gopher.{name}", getattr(self, name))
        for table in ("top_ngram_max_share", "dup_ngram_max_share"):
            for n, share in getattr(self, table).items():
                if n < 1:
                    raise ConfigError(f"gopher.{table} has n={n}; n-gram sizes must be >= 1")
                _check_share(f"gopher.{table}[{n}]", share)
        return self


class ChineseRulesConfig(Section):
    """Character-based rules for languages without spaces between words (docs/methods.md §7 "Chinese"): Chinese, and
    Japanese with its own stop words.

    ``min_chars`` / ``max_chars``: non-whitespace characters (the maximum mirrors Gopher's 100,000 words);
    ``min_cjk_share``: Han ideographs and kana / non-whitespace characters; ``max_repeated_ngram_share``: share of
    characters covered by character n-grams (n = ``repeated_ngram_size``) occurring more than once — the character
    analogue of Gopher's duplicated n-gram rule; ``min_stop_words``: occurrences of the language's stop words
    (function words such as 的, 是): ``stop_words_by_language[language]`` when listed, else ``stop_words``.
    """

    min_chars: int = 50
    max_chars: int = 200_000
    min_cjk_share: float = 0.3
    max_repeated_ngram_share: float = 0.3
    repeated_ngram_size: int = 10
    min_stop_words: int = 2
    stop_words: list[str] = ["的", "是", "了", "在", "不", "和", "有", "我", "他", "这"]
    stop_words_by_language: dict[str, list[str]] = {"ja": ["の", "は", "が", "を", "に", "で", "と", "も", "た", "て"]}

    @model_validator(mode="after")
    def _check(self) -> "ChineseRulesConfig":
        if self.min_chars < 0 or self.min_stop_words < 0:
            raise ConfigError("chinese min_chars and min_stop_words must be >= 0")
        if self.max_chars < self.min_chars:
            raise ConfigError(f"chinese max_chars={self.max_chars} is below min_chars={self.min_chars}")
        if self.repeated_ngram_size < 2:
            raise ConfigError(f"chinese repeated_ngram_size={self.repeated_ngram_size} must be >= 2 characters")
        for language, words in {"": self.stop_words, **self.stop_words_by_language}.items():
            if self.min_stop_words > 0 and not any(words):
                raise ConfigError(f"chinese stop words{f' for {language!r}' if language else ''} are empty "
                                  f"while min_stop_words={self.min_stop_words}; list some or set min_stop_words=0")
        _check_share("chinese.min_cjk_share", self.min_cjk_share)
        _check_share("chinese.max_repeated_ngram_share", self.max_repeated_ngram_share)
        return self

    def stop_words_for(self, language: str) -> list[str]:
        """Stop words counted for ``language`` (a lid.176 label)."""
        return self.stop_words_by_language.get(language, self.stop_words)


class C4Config(Section):
    """C4 line rules, opt-in (docs/methods.md §7 "C4"; Raffel et al. 2020, §2.2; defaults from TFDS ``c4_utils``).

    Lines are kept only if they end in one of ``end_marks`` and have at least ``min_words_per_line`` whitespace
    words and no word longer than ``max_word_length`` characters; lines containing one of ``line_substrings``
    (case-insensitive) are dropped; the page is removed if a kept line contains one of ``page_substrings``
    (case-insensitive), contains a ``blocklist`` word on its own (empty by default; C4 used the "List of Dirty,
    Naughty, Obscene or Otherwise Bad Words"), or fewer than ``min_sentences`` sentences remain. Citation markers
    ("[1]", "[edit]", "[citation needed]") are cut first when ``remove_citations``.
    """

    enabled: bool = False
    end_marks: list[str] = [".", "?", "!", '"']
    min_words_per_line: int = 5
    max_word_length: int = 1000
    min_sentences: int = 3
    page_substrings: list[str] = ["lorem ipsum", "{"]
    line_substrings: list[str] = ["javascript", "terms of use", "privacy policy", "cookie policy", "uses cookies",
                                  "use of cookies", "use cookies"]
    blocklist: list[str] = []
    remove_citations: bool = True

    @model_validator(mode="after")
    def _check(self) -> "C4Config":
        if not self.end_marks or not all(self.end_marks):
            raise ConfigError(f"c4 end_marks={self.end_marks!r} must be non-empty strings, e.g. ['.', '?', '!', '\"']")
        if min(self.min_words_per_line, self.min_sentences, self.max_word_length) < 0:
            raise ConfigError("c4 min_words_per_line, min_sentences and max_word_length must be >= 0 "
                              "(max_word_length 0 disables that test)")
        if not all(self.page_substrings) or not all(self.line_substrings) or not all(self.blocklist):
            raise ConfigError("c4 page_substrings, line_substrings and blocklist must not contain empty strings")
        return self


def lsh_candidate_probability(s: float, bands: int, rows: int) -> float:
    """P(a pair with Jaccard similarity ``s`` in [0, 1] agrees on at least one band) = 1 − (1 − s^rows)^bands
    (Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3, §3.4.2)."""
    return 1.0 - (1.0 - s**rows) ** bands


def lsh_threshold(bands: int, rows: int) -> float:
    """Similarity where the candidate S-curve rises steepest, ≈ (1/bands)^(1/rows) (Leskovec, Rajaraman & Ullman,
    "Mining of Massive Datasets", ch. 3, §3.4.2)."""
    return (1.0 / bands) ** (1.0 / rows)


# A pair at exactly the Jaccard threshold should more likely become a candidate than not; a split suggested as the
# fix should find 9 in 10 of them.
MIN_CANDIDATE_PROBABILITY = 0.5
SUGGESTED_CANDIDATE_PROBABILITY = 0.9


class MinHashConfig(Section):
    """MinHash LSH near-duplicate detection (docs/methods.md §7; FineWeb: 5-grams, 112 hashes as 14 bands × 8 rows).

    ``bands * rows`` hash functions are used out of ``num_perm``; candidates are kept when their exact Jaccard
    similarity on shingle sets is >= ``jaccard_threshold``. ``scope``: "source" compares documents of the same
    source only (FineWeb found per-snapshot dedup better than global), "global" compares all documents.
    ``max_removal_share``: a source losing a larger share of its documents to near dedup gets a warning.

    Loading warns (``ConfigWarning``) when near dedup is enabled and ``bands * rows < num_perm`` (the other
    signature values are computed and never read), or when a pair at exactly ``jaccard_threshold`` becomes a
    candidate with probability below ``MIN_CANDIDATE_PROBABILITY`` (the threshold lies below the S-curve's
    (1/bands)^(1/rows)), so most pairs the threshold means to remove are never compared. ``lsh_figures`` gives
    the numbers; the corpus manifest records them.

    ``family``: how the ``num_perm`` signature values are drawn from a document's 64-bit shingle hashes.

    * "oph" (default): one-permutation hashing with optimal densification (Li, Owen & Zhang, "One Permutation
      Hashing", NIPS 2012; Shrivastava, "Optimal Densification for Fast and Accurate Minwise Hashing", ICML 2017).
      Each shingle is hashed once and falls into one of ``num_perm`` bins; a bin's value is the minimum there, and
      an empty bin copies the value of the first non-empty bin along a fixed pseudo-random probe sequence.
      P(values agree) = Jaccard, as with ``num_perm`` permutations, at the cost of one hash per shingle.
    * "universal": docs/methods.md §7's ``num_perm`` permutations h_i(x) = (a_i·x + b_i) mod (2^31 − 1), the minimum of each;
      ``num_perm`` hashes per shingle.

    The two families give different signatures: band keys stored by a build are comparable only within a family.
    """

    enabled: bool = True
    family: Literal["oph", "universal"] = "oph"
    num_perm: int = 112
    bands: int = 14
    rows: int = 8
    shingle_size: int = 5
    jaccard_threshold: float = 0.8
    seed: int = Field(default=0, ge=0)
    scope: Literal["source", "global"] = "source"
    max_removal_share: float = 0.5

    @model_validator(mode="after")
    def _check(self) -> "MinHashConfig":
        if min(self.num_perm, self.bands, self.rows, self.shingle_size) < 1:
            raise ConfigError("near_dedup num_perm, bands, rows and shingle_size must all be >= 1")
        if self.bands * self.rows > self.num_perm:
            raise ConfigError(
                f"near_dedup bands*rows = {self.bands}*{self.rows} = {self.bands * self.rows} exceeds "
                f"num_perm={self.num_perm}; raise num_perm or lower bands/rows"
            )
        if not 0.0 < self.jaccard_threshold <= 1.0:
            raise ConfigError(f"near_dedup jaccard_threshold={self.jaccard_threshold} must lie in (0, 1]")
        if not 0.0 <= self.max_removal_share <= 1.0:
            raise ConfigError(f"near_dedup max_removal_share={self.max_removal_share} is a share of a source's "
                              "documents and must lie in [0, 1]")
        for message in self.lsh_warnings():
            warnings.warn(f"corpus.near_dedup: {message}", ConfigWarning)
        return self

    def lsh_figures(self) -> dict[str, float | int]:
        """The banding's figures: ``unused_permutations`` (``num_perm − bands·rows``, signature values never
        read), ``implied_threshold`` ((1/bands)^(1/rows), see ``lsh_threshold``) and
        ``candidate_probability_at_threshold`` (1 − (1 − t^rows)^bands at t = ``jaccard_threshold``)."""
        return {"unused_permutations": self.num_perm - self.bands * self.rows,
                "implied_threshold": lsh_threshold(self.bands, self.rows),
                "candidate_probability_at_threshold": lsh_candidate_probability(self.jaccard_threshold, self.bands,
                                                                                self.rows)}

    def lsh_warnings(self) -> list[str]:
        """Why this banding wastes work or misses pairs at its own threshold, with the figures and a fix; empty
        when it does neither or near dedup is disabled."""
        if not self.enabled:
            return []
        figures, out = self.lsh_figures(), []
        used = self.bands * self.rows
        if figures["unused_permutations"]:
            out.append(f"bands×rows = {self.bands}×{self.rows} = {used} of num_perm={self.num_perm}: "
                       f"{figures['unused_permutations']} signature values per document are computed and never "
                       f"used; set num_perm={used} or raise bands/rows to use them")
        p = figures["candidate_probability_at_threshold"]
        if p < MIN_CANDIDATE_PROBABILITY:
            t = self.jaccard_threshold
            bands, rows = _banding_for(t, self.num_perm)
            out.append(
                f"jaccard_threshold={t:g} is below the LSH S-curve threshold (1/bands)^(1/rows) = "
                f"(1/{self.bands})^(1/{self.rows}) = {figures['implied_threshold']:.3f}: a pair at Jaccard {t:g} "
                f"becomes a candidate with probability 1-(1-{t:g}^{self.rows})^{self.bands} = {p:.3f}, so most "
                f"such pairs are never compared (Leskovec, Rajaraman & Ullman, Mining of Massive Datasets, ch. 3); "
                f"use fewer rows per band, e.g. bands={bands}, rows={rows} "
                f"(P = {lsh_candidate_probability(t, bands, rows):.3f}), or raise jaccard_threshold")
        return out


def _banding_for(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) using at most ``num_perm`` values with the most rows per band (fewest needless candidates)
    whose candidate probability at ``threshold`` reaches ``SUGGESTED_CANDIDATE_PROBABILITY``."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if lsh_candidate_probability(threshold, bands, rows) >= SUGGESTED_CANDIDATE_PROBABILITY:
            return bands, rows
    return num_perm, 1


class BoilerplateConfig(Section):
    """Cross-document boilerplate removal (docs/methods.md §7 "also line/paragraph boilerplate across documents").

    A line (or a multi-line paragraph) whose normal form (lower-cased, whitespace collapsed) has at least
    ``min_chars`` characters and occurs in at least ``min_docs`` documents of the corpus is cut from every document
    it occurs in (navigation bars, licence paragraphs, footers). A document left empty is removed with the rule
    ``dedup.boilerplate``. Counts are over documents that survived the quality rules, across all shards.
    """

    enabled: bool = True
    min_docs: int = Field(default=10, ge=2)
    min_chars: int = Field(default=30, ge=1)


class DecontaminationConfig(Section):
    """Removal of training documents that overlap an evaluation set (docs/methods.md §7 "Decontamination").

    Texts are compared as word ``ngram``-grams after lower-casing and collapsing whitespace (so line wraps do not
    hide a match). Evaluation sets: the gate's cloze items (context + correct option) and every file in
    ``eval_files`` (JSONL with a ``text`` field, or plain text with one item per paragraph). An evaluation n-gram found
    in ``common_min_docs`` or more training documents is treated as common phrasing (licence text, idioms) and ignored.
    """

    enabled: bool = True
    ngram: int = Field(default=13, ge=3)
    common_min_docs: int = Field(default=50, ge=2)
    eval_files: list[str] = []


class SubstringDedupConfig(Section):
    """Exact-substring dedup, opt-in (docs/methods.md §7 "Exact-substring dedup"; Lee et al. 2022, §4.1 ExactSubstr;
    ``tasks.corpus.substring``). The last global step: it sees the documents every other step kept.

    Within a partition every window of ``min_repeat_bytes`` UTF-8 bytes that occurred earlier in corpus order is
    cut (narrowed to whole characters), so the first copy of a repeated span stays. A document with a cut whose
    text, without surrounding whitespace, is left with fewer than ``min_doc_bytes`` bytes is removed
    (``dedup.substring``). ``min_repeat_bytes`` default 200: Lee et al. used 50 tokens, and a BPE token is about 4
    bytes of English text (3.95 characters per token for the reference tokenizer of docs/methods.md §8).
    ``min_doc_bytes`` default 200 (*project default*): what is left is shorter than one repeat window.

    Partitions bound the memory of the suffix array (13 bytes per partition byte at the peak, measured by
    ``benchmarks/substring_dedup.py``; the default 64 MiB needs about 0.9 GB): ``scope`` "source" takes
    each source's documents separately, "global" all documents; either is cut, in corpus order, into partitions
    of the documents whose bytes before them (in the scope) fall in the same ``partition_bytes`` block, so a
    partition holds less than ``partition_bytes`` plus one document. A span repeated only across partitions (or
    sources, with scope "source") is not found. When every field is at its default the section is left out of
    the config's dump, so existing cache keys do not change.
    """

    enabled: bool = False
    min_repeat_bytes: int = Field(default=200, ge=1)
    min_doc_bytes: int = Field(default=200, ge=0)
    scope: Literal["source", "global"] = "source"
    partition_bytes: int = Field(default=64 * 2**20, ge=1, le=2**30)


class UrlConfig(Section):
    """URL rules, the first per-document stage (docs/methods.md §7 "URL filtering"; ``tasks.corpus.urls``).

    A document is removed (``url.blocklist``) when its host is one of ``blocklist`` or of the domains in
    ``blocklist_files``, or a subdomain of one (``example.com`` matches ``a.example.com``, not ``badexample.com``),
    or when its URL contains one of ``substrings`` (case-insensitive). When ``allowlist`` is non-empty, a document
    whose host is neither an allowed domain nor under one is removed (``url.not_allowed``); the blocklist is
    checked first. Hosts are compared lower-cased, without userinfo, port, trailing dot or one leading ``www.``,
    internationalised names in their punycode form. A document without a URL is never removed (the manifest
    counts it as ``no_url`` under the ``url`` stage). A source's ``url_field`` value that is not a URL with a host
    (``"n/a"``, a number, ``mailto:...``) is read as no URL by the sources stage, so no rule takes it for one: it is
    among the ``no_url`` documents and is counted per source as ``url_invalid`` in the sources artifact's
    ``sources.json`` (with examples in the log). With no rules, nothing is removed.

    ``blocklist_files``: UTF-8 files of domains, one per line; ``#`` starts a comment, blank lines are ignored;
    relative paths are read from the working directory. A missing file, or a line that is not a domain, is refused
    when the config is loaded. What the files hold (their distinct domains) is part of the corpus cache key.
    """

    enabled: bool = True
    blocklist: list[str] = []
    blocklist_files: list[str] = []
    substrings: list[str] = []
    allowlist: list[str] = []

    @field_validator("blocklist", "allowlist")
    @classmethod
    def _check_domains(cls, v: list[str]) -> list[str]:
        for entry in v:
            try:
                normal_domain(entry)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        return v

    @field_validator("blocklist_files")
    @classmethod
    def _check_files(cls, v: list[str]) -> list[str]:
        for path in v:
            read_domain_file(path)
        return v

    @field_validator("substrings")
    @classmethod
    def _check_substrings(cls, v: list[str]) -> list[str]:
        if not all(s.strip() for s in v):
            raise ConfigError(f"substrings={v!r} must not contain empty or blank strings (they match every URL)")
        return v

    def rules(self) -> UrlRules:
        """The compiled rules (``tasks.corpus.urls.compile_rules``). Raises ConfigError as ``read_domain_file``."""
        return compile_rules(self.blocklist, self.blocklist_files, self.substrings, self.allowlist)

    def files_digest(self) -> str:
        """sha256[:16] of the blocklist files' distinct domains (``tasks.corpus.urls.files_digest``)."""
        return files_digest(self.blocklist_files)


class CorpusExecutionConfig(ExecutionConfig):
    """How the corpus build is executed (``engine``, ``workers``, ``address``, ``recycle_after``: see
    ``infra.execution``); never part of the cache key (results do not depend on it). ``shard_docs``: documents per
    shard (a worker's memory is bounded by it, not by the corpus size). ``partitions``: hash partitions of the
    global passes run as tasks (boilerplate unit counts, exact-duplicate groups, LSH candidate pairs: each task
    reads its partition of every shard's output, so a task's memory is bounded by the corpus's units, documents or
    band keys ÷ ``partitions``). ``memory_limit``: what each DuckDB connection of the main process (the doc_id
    check, the sort of the boilerplate table, the decisions over removed documents and verified pairs) may hold in
    memory before it spills to the scratch folder, in DuckDB's notation ("256MB", "1GB"). Small by default: the
    main process coordinates, and its memory should not grow with the corpus."""

    shard_docs: int = Field(default=2000, ge=1)
    partitions: int = Field(default=16, ge=1)
    memory_limit: str = Field(default="256MB", pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")


class CorpusConfig(Section):
    """Corpus build settings (docs/methods.md §7).

    ``source_overrides`` maps a source name to partial rule thresholds, either nested
    (``{"fortunes": {"gopher": {"min_words": 5}}}``) or flat (``{"fortunes": {"min_words": 5}}``: a flat key is
    applied to every rule set that has it). Overrides are validated by building the merged rule sets.

    Other fields: ``languages`` kept (lid.176 labels); ``extractor``, the HTML main-text extractor for every source
    (``tasks.corpus.extract``); ``langid_threshold`` (FineWeb 0.65) and per-language
    ``langid_thresholds``; ``langid_min_chars``, below which the source's hint is used or the language is
    ``unknown`` (``unknown_language``: remove or keep); ``unicode_repair`` (ftfy), ``pii``, ``exact_dedup`` switches;
    ``c4``, ``near_dedup``, ``boilerplate``, ``decontamination``, ``substring_dedup`` sections; ``execution``
    (shards, engine), which is never part of the cache key.
    """

    languages: list[str] = ["en", "zh"]
    extractor: Literal["trafilatura", "resiliparse"] = "trafilatura"
    langid_threshold: float = 0.65
    langid_thresholds: dict[str, float] = {}
    langid_min_chars: int = 20
    unknown_language: Literal["remove", "keep"] = "remove"
    gopher: GopherConfig = GopherConfig()
    chinese: ChineseRulesConfig = ChineseRulesConfig()
    c4: C4Config = C4Config()
    source_overrides: dict[str, dict[str, Any]] = {}
    unicode_repair: bool = True
    pii: bool = True
    exact_dedup: bool = True
    near_dedup: MinHashConfig = MinHashConfig()
    boilerplate: BoilerplateConfig = BoilerplateConfig()
    decontamination: DecontaminationConfig = DecontaminationConfig()
    substring_dedup: SubstringDedupConfig = SubstringDedupConfig()
    urls: UrlConfig = UrlConfig()
    quality_model: QualityModelConfig = QualityModelConfig()
    # Results do not depend on shard size, engine or workers.
    execution: CorpusExecutionConfig = Field(default=CorpusExecutionConfig(), json_schema_extra=NOT_IN_KEY)

    @field_validator("languages")
    @classmethod
    def _check_languages(cls, v: list[str]) -> list[str]:
        unknown = [code for code in v if code not in LID176_LABELS]
        if unknown or not v:
            raise ConfigError(f"languages={v!r}: {unknown or 'empty'} not lid.176 labels; use codes like 'en', 'zh'")
        return v

    @field_validator("langid_threshold")
    @classmethod
    def _check_threshold(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ConfigError(f"langid_threshold={v} must lie in [0, 1) (FineWeb uses 0.65)")
        return v

    @field_validator("langid_thresholds")
    @classmethod
    def _check_thresholds(cls, v: dict[str, float]) -> dict[str, float]:
        for code, threshold in v.items():
            if code not in LID176_LABELS:
                raise ConfigError(f"langid_thresholds[{code!r}]: not a lid.176 label; use codes like 'en', 'zh'")
            if not 0.0 <= threshold < 1.0:
                raise ConfigError(f"langid_thresholds[{code!r}]={threshold} must lie in [0, 1)")
        return v

    @model_serializer(mode="wrap")
    def _default_substring_dumps_as_before(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if self.substring_dedup == SubstringDedupConfig():  # off as it always was: dumps and keys stay as they were
            data.pop("substring_dedup", None)
        return data

    def langid_threshold_for(self, language: str) -> float:
        """The minimum lid.176 score for ``language``: its own threshold if configured, else ``langid_threshold``."""
        return self.langid_thresholds.get(language, self.langid_threshold)

    @field_validator("langid_min_chars")
    @classmethod
    def _check_min_chars(cls, v: int) -> int:
        if v < 0:
            raise ConfigError(f"langid_min_chars={v} must be >= 0")
        return v

    @model_validator(mode="after")
    def _check_overrides(self) -> "CorpusConfig":
        for source in self.source_overrides:
            self.rules_for(source)
        return self

    def rules_for(self, source: str) -> tuple[GopherConfig, ChineseRulesConfig]:
        """The Gopher and Chinese rule sets for ``source`` after its overrides.

        Raises:
            ConfigError: an override key belongs to neither rule set, or a merged value is out of range.
        """
        override = dict(self.source_overrides.get(source, {}))
        gopher_part, chinese_part = dict(override.pop("gopher", {})), dict(override.pop("chinese", {}))
        for key, value in override.items():
            homes = [part for part, model in ((gopher_part, GopherConfig), (chinese_part, ChineseRulesConfig))
                     if key in model.model_fields]
            if not homes:
                raise ConfigError(f"source_overrides[{source!r}] key {key!r} is not a gopher or chinese threshold")
            for part in homes:
                part.setdefault(key, value)
        return _merged(self.gopher, gopher_part, source), _merged(self.chinese, chinese_part, source)


def _merged(base: Section, part: dict[str, Any], source: str) -> Any:
    unknown = set(part) - set(type(base).model_fields)
    if unknown:
        raise ConfigError(f"source_overrides[{source!r}]: unknown {type(base).__name__} keys {sorted(unknown)}")
    # Strict like the rest of the file: an override of "3" for min_words is refused, not read as 3.
    return type(base).validate_strict({**base.model_dump(), **part}, f"corpus.source_overrides[{source!r}]")
