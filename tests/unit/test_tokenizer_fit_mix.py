"""The tokenizer's default fit sample is the training mixture it serves (tasks.tokenizer.composition): the general
sources at their natural shares, [cpt] domain sources only as declared; explicit fit_weights as before."""

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from flows.config import load_config
from flows.registry import get_stage
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.section import key_dump
from infra.stage import StageContext
from tasks.tokenizer.composition import default_fit_weights
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.stage import fit_weights, run
from tasks.tokenizer.views import composition_title, fit_composition

ROOT = Path(__file__).resolve().parents[2]
MAX_CHARS = 6000


def test_default_weights_are_the_general_sources_natural_shares():
    chars = {"a": 300, "b": 100, "d": 500}
    assert default_fit_weights(chars, ["a", "b"], ["d"]) == pytest.approx({"a": 0.75, "b": 0.25})
    assert default_fit_weights(chars, None) == pytest.approx({"a": 3 / 9, "b": 1 / 9, "d": 5 / 9})  # all general


def test_domain_share_is_split_equally_among_the_cpt_domain_sources():
    # (1 − 0.2) · 3/4 = 0.6, (1 − 0.2) · 1/4 = 0.2, and 0.2 / 2 = 0.1 for each domain source.
    weights = default_fit_weights({"a": 300, "b": 100, "d": 50, "e": 10}, ["a", "b"], ["d", "e"], 0.2)
    assert weights == pytest.approx({"a": 0.6, "b": 0.2, "d": 0.1, "e": 0.1})


def test_default_weights_refuse_what_cannot_be_drawn():
    with pytest.raises(ConfigError, match="needs \\[cpt\\] domain_sources"):
        default_fit_weights({"a": 1}, ["a"], [], 0.1)
    with pytest.raises(ConfigError, match=r"\['d'\] have no training"):
        default_fit_weights({"a": 1}, ["a"], ["d"], 0.1)
    with pytest.raises(ConfigError, match="none of the general sources"):
        default_fit_weights({"d": 5}, ["a"], ["d"])


def test_declared_fit_weights_are_used_unchanged():
    cfg = TokenizerConfig(fit_weights={"a": 1.0, "d": 3.0})
    assert fit_weights(cfg, {"a": 10, "b": 10, "d": 10}, general=["a", "b"], domain=["d"]) == {"a": 0.25, "d": 0.75}
    with pytest.raises(Exception, match="fit_domain_share"):
        TokenizerConfig(fit_weights={"a": 1.0}, fit_domain_share=0.1)


def test_domain_share_leaves_dumps_unchanged_at_its_default():
    assert "fit_domain_share" not in key_dump(TokenizerConfig())
    assert key_dump(TokenizerConfig(fit_domain_share=0.1))["fit_domain_share"] == 0.1


def test_tokenizer_key_names_the_sampled_sources_and_not_the_budgets():
    stage = get_stage("tokenizer")
    demo = load_config(ROOT / "configs/demo.toml")
    key = stage.key_config(demo)
    assert key["fit_sources"] == {"general": ["fortunes_en", "fortunes_zh", "handbook_en", "handbook_zh"]}
    longer = load_config(ROOT / "configs/demo.toml", {"main.budget.steps": 600, "cpt.replay_fractions": [0.5]})
    assert stage.key_config(longer) == key  # main/CPT budgets never refit the tokenizer
    with_domain = stage.key_config(load_config(ROOT / "configs/demo.toml", {"tokenizer.fit_domain_share": 0.1}))
    assert with_domain["fit_sources"]["domain"] == ["python_doc"]
    declared = load_config(ROOT / "configs/demo.toml", {"tokenizer.fit_weights": {"handbook_en": 1.0}})
    assert "fit_sources" not in stage.key_config(declared)


# --- the stage on a small corpus: two general sources and a larger domain source ---------------------------------


def _corpus(folder: Path) -> Path:
    rng = random.Random(0)
    words = {"en": "the cat sat on a mat and ran far away home".split(), "zh": list("我们的软件包虚拟机世界你好")}
    rows = []
    for source, language, n_docs in (("web_en", "en", 60), ("wiki_zh", "zh", 40), ("pydoc", "en", 200)):
        for i in range(n_docs):
            text = " ".join(rng.choice(words[language]) for _ in range(40))
            rows.append(dict(doc_id=f"{source}/{i}", source=source, family_id=f"{source}/{i}", text=text,
                             language=language, n_chars=len(text), n_bytes=len(text.encode())))
    folder.mkdir(parents=True)
    (folder / "kept").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(folder / "kept" / "part-00000.parquet", index=False)
    (folder / "manifest.json").write_text(json.dumps({"manifest_hash": "0" * 64}))
    return folder


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    out = root / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    ctx = StageContext(out=out, inputs={"corpus": _corpus(root / "corpus")}, layout=RunsLayout(root), key="k",
                       experiment="t")
    run(ctx, TokenizerConfig(vocab_size=300, sample_max_chars=MAX_CHARS, decontam_ngram=0),
        general=["web_en", "wiki_zh"], domain=["pydoc"])
    return out


def test_the_fit_sample_draws_the_general_sources_at_their_natural_shares(artifact):
    meta = json.loads((artifact / "tokenizer.meta.json").read_text())
    sources = pd.read_parquet(artifact / "sources.parquet").set_index("source")
    train_chars = meta["fit_train_chars"]
    # Before, the natural share of every source: the domain source holds most of the training text.
    assert train_chars["pydoc"] / sum(train_chars.values()) > 0.5
    general = train_chars["web_en"] + train_chars["wiki_zh"]
    for source in ("web_en", "wiki_zh"):
        share = train_chars[source] / general
        assert meta["fit_weights"][source] == pytest.approx(share)
        assert sources.loc[source, "fit_chars"] == int(MAX_CHARS * share)  # each source is larger than its budget
    assert "pydoc" not in meta["fit_weights"] and sources.loc["pydoc", "fit_chars"] == 0
    assert sources.loc["pydoc", "role"] == "domain" and meta["fit_rule"] == "general_natural"
    assert sources["fit_share"].sum() == pytest.approx(1.0)
    assert sources.loc["web_en", "fit_share"] == pytest.approx(int(MAX_CHARS * train_chars["web_en"] / general)
                                                               / sum(meta["fit_sample_chars"].values()))


def test_the_composition_is_shown_beside_the_mixture_weights(artifact, tmp_path):
    (tmp_path / "choice.json").write_text(json.dumps({"name": "temp0.3", "weights": {"web_en": 0.7, "wiki_zh": 0.3}}))
    table = fit_composition(artifact, tmp_path).set_index("source")
    assert table.loc["wiki_zh", "mixture_weight (temp0.3)"] == 0.3 and table.loc["pydoc", "mixture_weight (temp0.3)"] == 0.0
    sources = pd.read_parquet(artifact / "sources.parquet").set_index("source")
    general_tokens = sources.loc[["web_en", "wiki_zh"], "train_tokens"].sum()
    assert table.loc["web_en", "natural_token_share"] == pytest.approx(sources.loc["web_en", "train_tokens"]
                                                                       / general_tokens)
    assert table.loc["pydoc", "natural_token_share"] == "–"
    assert "mixture_weight" not in "".join(fit_composition(artifact).columns)  # no mixture artifact yet
    title = composition_title(json.loads((artifact / "tokenizer.meta.json").read_text()))
    assert "general sources at their natural shares" in title
