"""``[corpus.quality_model]``: the quality classifier's settings and file conventions, readable without numpy
or the classifiers (``tasks.corpus.quality_model`` trains, loads and scores; it re-exports every name here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from infra.errors import ConfigError
from infra.section import NOT_IN_KEY, Section

POSITIVE = "__label__hq"
NEGATIVE = "__label__lq"
# A label of a model trained elsewhere is taken as the positive (reference-quality) class when its name is one of
# these (DCLM's classifiers use __label__hq against __label__cc).
POSITIVE_LABEL_NAMES = ("hq", "1", "positive", "__label__hq", "__label__1")
MODEL_STEM = "quality_model"
META_NAME = f"{MODEL_STEM}.json"
NB_SUFFIX = ".skops"
FASTTEXT_SUFFIXES = (".bin", ".ftz")
CALIBRATION_BINS = 10


def _share(name: str, v: float) -> float:
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"quality_model.{name}={v} is a share of documents and must lie in [0, 1]")
    return v


class ExamplesConfig(Section):
    """Where the examples of one class (positive: reference quality; negative: ordinary text) come from.

    ``sources``: names of sources of the experiment whose documents are examples of this class.
    ``files``: paths or glob patterns (``**`` reaches into sub-folders), read by ``load_example_files``: a
    ``.jsonl`` file holds one document per line in a ``text`` key, any other file is one UTF-8 document.
    ``corpus_sample``: negatives only; a random sample of the corpus being built is taken as negatives.
    ``junk``: negatives only; this many synthetic pages (navigation, spam, repeated lines: ``tasks.corpus.junk``)
    generated from a seeded sample of the corpus's own text, per kept language.
    Sampling the examples (at most ``max_examples`` of a class are used) is the caller's and ``train``'s.
    """

    sources: list[str] = []
    files: list[str] = []
    corpus_sample: bool = False
    junk: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ExamplesConfig":
        for name in ("sources", "files"):
            values = getattr(self, name)
            if not all(v.strip() for v in values):
                raise ConfigError(f"quality_model examples {name}={values!r} contains an empty name; remove it")
            if len(set(values)) != len(values):
                raise ConfigError(f"quality_model examples {name}={values!r} lists a name twice; list each once")
        return self

    def declared(self) -> bool:
        """True when any source, file pattern or the corpus sample is named."""
        return bool(self.sources or self.files or self.corpus_sample or self.junk)


class QualityModelConfig(Section):
    """The quality classifier and what is done with its scores (docs/methods.md §7; Brown et al. 2020, App. A).

    ``enabled``: run the classifier after the heuristic rules (off by default).
    ``kind``: "naive_bayes" (hashed word n-grams + multinomial naive Bayes, scikit-learn), "fasttext" (a supervised
    fastText classifier trained here) or "pretrained" (loaded from ``path``).
    ``path``: kind = "pretrained" only, and required then: a fastText ``.bin`` / ``.ftz``, or the ``.skops`` /
    ``.bin`` file ``TrainedModel.save`` wrote.
    ``positive_label``: the label of the reference-quality class of a loaded model; empty works only for a
    two-label model with exactly one label among ``POSITIVE_LABEL_NAMES`` ("hq", "1", "positive"); any other model
    (more labels, neither or both named) is refused until it is set.
    ``positive`` / ``negative``: where the examples of each class come from (``ExamplesConfig``); positives are
    sources or files, negatives may also be a sample of the corpus itself. For "pretrained" both are optional and
    only feed the held-out evaluation.
    ``max_examples``: at most this many examples per class, training and held-out together (>= 10), a seeded
    choice. ``holdout_fraction``: share of each class held out for the metrics, in (0, 0.5]. ``seed``: seeds the
    choice, the split, fastText's training and the ``sample`` action (>= 0).
    Class balance: ``class_balance`` = "balanced" (default) gives both classes the same total weight in training,
    whatever their example counts: naive Bayes weighs each example by n / (2 · n_class) (scikit-learn
    ``compute_sample_weight("balanced")``), fastText, which takes no weights, reads the smaller class's examples
    repeated (seeded) until both classes have as many lines. Unbalanced, the smoothing of the smaller class's few
    counts can rank its own held-out examples last (docs/methods.md §7). "none" trains on the counts as they are.
    A "pretrained" model is not trained here, so neither applies to it.
    Held-out check (the stage fails rather than remove documents; ``check_heldout``): ``min_auc``, in [0.5, 1], is
    the floor on the held-out ROC AUC (the probability that a held-out positive scores above a held-out negative;
    0.5 is chance, below it the classifier is inverted); default 0.7, the lower end of "acceptable discrimination"
    (Hosmer & Lemeshow 2000, Applied Logistic Regression, §5.2.4). ``min_score_spread``, in [0, 0.5], is the
    floor on the standard deviation of the held-out scores (probability units); default 0.01, one percentage
    point: scores that all lie closer together than that (a fastText model trained on a hundred examples puts
    every score within 1e-4 of 0.5) make a threshold or a Pareto draw remove documents by differences that
    carry no information, while a classifier that separates the classes spreads its scores by tenths (0.2–0.4
    on the smoke and demo examples). A "pretrained" model without held-out examples of both classes has no AUC
    and is not checked.
    ``action``: "threshold" keeps a document whose score is >= ``threshold`` (in [0, 1]); "sample" keeps it by
    GPT-3's Pareto rule with shape ``pareto_alpha`` (> 0), with probability (2 − score)^(−pareto_alpha)
    (``keep_decisions``).
    Naive Bayes: ``nb_alpha`` additive (Laplace/Lidstone) smoothing (> 0); word n-grams of 1..``ngram_max``
    (>= 1) hashed into ``max_features`` columns (>= 2).
    fastText: ``ft_epoch`` passes (>= 1), learning rate ``ft_lr`` (> 0), word n-grams up to ``ft_word_ngrams``
    (>= 1), embedding size ``ft_dim`` (>= 1), words seen fewer than ``ft_min_count`` times dropped (>= 1),
    ``ft_bucket`` hash buckets for the word n-grams (>= 1; fastText's own default of 2,000,000 makes a 512 MB model
    at dim 64, 2^18 makes 64 MB). fastText trains with one thread, so the same seed gives the same model.
    Blind-spot budget: ``max_removed_share`` is the largest share of the documents (in [0, 1]) the classifier may
    remove; ``max_removed_share_by`` gives a source name, a language code or "all" (the whole corpus) its own
    budget (each in [0, 1]); ``accept_narrowing`` lists sources, languages or "all" whose excess over their budget
    is accepted. The experiment config refuses names that are none of these.
    ``ablate``: run the ``quality_ablation`` stage, which trains the proxy twice, on the corpus with and without the
    classifier's removals, and compares their held-out bits per byte per source (docs/methods.md §7). It does not
    change the corpus, so it is not in the corpus key. ``ablate_seeds`` (>= 1): training seeds per arm; the interval
    resamples them with the held-out documents, and a single seed cannot tell the classifier from training noise,
    so it decides nothing.
    """

    enabled: bool = False
    kind: Literal["naive_bayes", "fasttext", "pretrained"] = "naive_bayes"
    path: str = ""
    positive_label: str = ""
    positive: ExamplesConfig = ExamplesConfig()
    negative: ExamplesConfig = ExamplesConfig()
    max_examples: int = 2000
    holdout_fraction: float = 0.2
    seed: int = 0
    class_balance: Literal["balanced", "none"] = "balanced"
    min_auc: float = 0.7
    min_score_spread: float = 0.01
    action: Literal["threshold", "sample"] = "threshold"
    threshold: float = 0.5
    pareto_alpha: float = 9.0
    nb_alpha: float = 1.0
    ngram_max: int = 2
    max_features: int = 2**18
    ft_epoch: int = 5
    ft_lr: float = 0.1
    ft_word_ngrams: int = 2
    ft_dim: int = 64
    ft_min_count: int = 1
    ft_bucket: int = 2**18
    max_removed_share: float = 0.5
    max_removed_share_by: dict[str, float] = {}
    accept_narrowing: list[str] = []
    ablate: bool = Field(default=False, json_schema_extra=NOT_IN_KEY)
    ablate_seeds: int = Field(default=3, ge=1, json_schema_extra=NOT_IN_KEY)

    @model_validator(mode="after")
    def _check(self) -> "QualityModelConfig":
        if self.ablate and not self.enabled:
            raise ConfigError("quality_model.ablate = true needs a classifier to ablate: set enabled = true, or "
                              "remove ablate")
        if self.kind == "pretrained" and not self.path.strip():
            raise ConfigError("quality_model.path is empty while kind = 'pretrained'; give the model file "
                              "(a fastText .bin/.ftz or a saved .skops) or choose kind = 'naive_bayes' / 'fasttext'")
        if self.kind != "pretrained" and self.path:
            raise ConfigError(f"quality_model.path={self.path!r} is only read when kind = 'pretrained' (kind is "
                              f"{self.kind!r}); remove path or set kind = 'pretrained'")
        if self.path and not self.path.endswith((NB_SUFFIX, *FASTTEXT_SUFFIXES)):
            raise ConfigError(f"quality_model.path={self.path!r} must name a fastText .bin/.ftz or a saved "
                              f"{NB_SUFFIX} file")
        if self.enabled and self.kind == "pretrained" and not Path(self.path).is_file():
            raise ConfigError(f"quality_model.path={self.path!r} is not a file (relative paths are read from the "
                              "working directory); give the classifier file to load")
        if self.positive.corpus_sample:
            raise ConfigError("quality_model.positive.corpus_sample = true: a sample of the corpus is not "
                              "reference-quality text; use it for negative.corpus_sample only")
        if self.positive.junk:
            raise ConfigError(f"quality_model.positive.junk = {self.positive.junk}: generated junk is a negative "
                              "example; use negative.junk")
        if self.enabled and self.kind != "pretrained":
            if not (self.positive.sources or self.positive.files):
                raise ConfigError(f"quality_model.positive declares no examples while kind = {self.kind!r}; set "
                                  "positive.sources or positive.files to reference-quality text")
            if not self.negative.declared():
                raise ConfigError(f"quality_model.negative declares no examples while kind = {self.kind!r}; set "
                                  "negative.sources, negative.files or negative.corpus_sample = true")
        both = sorted(set(self.positive.sources) & set(self.negative.sources))
        if both:
            raise ConfigError(f"quality_model: source(s) {both} are listed as both positive and negative examples; "
                              "keep each source in one class")
        if self.max_examples < 10:
            raise ConfigError(f"quality_model.max_examples={self.max_examples} must be >= 10 per class")
        if not 0.0 < self.holdout_fraction <= 0.5:
            raise ConfigError(f"quality_model.holdout_fraction={self.holdout_fraction} must lie in (0, 0.5]")
        if self.seed < 0:
            raise ConfigError(f"quality_model.seed={self.seed} must be >= 0")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"quality_model.threshold={self.threshold} is a score threshold (the classifier's "
                              "probability of reference quality) and must lie in [0, 1]")
        for name in ("pareto_alpha", "nb_alpha", "ft_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"quality_model.{name}={getattr(self, name)} must be > 0")
        for name in ("ngram_max", "ft_epoch", "ft_word_ngrams", "ft_dim", "ft_min_count", "ft_bucket"):
            if getattr(self, name) < 1:
                raise ConfigError(f"quality_model.{name}={getattr(self, name)} must be >= 1")
        if self.max_features < 2:
            raise ConfigError(f"quality_model.max_features={self.max_features} must be >= 2 hashed columns")
        if not 0.5 <= self.min_auc <= 1.0:
            raise ConfigError(f"quality_model.min_auc={self.min_auc} is a floor on the held-out ROC AUC and must lie "
                              "in [0.5, 1]: below 0.5 it would accept a classifier that ranks the classes inverted")
        if not 0.0 <= self.min_score_spread <= 0.5:
            raise ConfigError(f"quality_model.min_score_spread={self.min_score_spread} is a floor on the standard "
                              "deviation of held-out scores in [0, 1] and must lie in [0, 0.5]")
        _share("max_removed_share", self.max_removed_share)
        for key, share in self.max_removed_share_by.items():
            if not key.strip():
                raise ConfigError("quality_model.max_removed_share_by has an empty key; use a source name or a "
                                  "language code")
            _share(f"max_removed_share_by[{key!r}]", share)
        if not all(v.strip() for v in self.accept_narrowing):
            raise ConfigError(f"quality_model.accept_narrowing={self.accept_narrowing!r} contains an empty name")
        return self


# ---------------------------------------------------------------------------------------------------- examples
