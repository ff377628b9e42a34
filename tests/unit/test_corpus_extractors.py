"""The HTML extractor choice (``[corpus] extractor``): resiliparse keeps a page's main content and drops its
navigation, the choice reaches the corpus build and its cache key, and the audit compares both extractors."""

import tomllib
from pathlib import Path

import pandas as pd
import pytest

from flows.config import parse_config
from flows.status import stage_statuses
from infra.errors import ConfigError
from infra.runs import RunsLayout
from tasks.audit.extractors import COMPARISON_COLUMNS, EXAMPLE_COLUMNS, compare_extractors, page_lines, sample_pages
from tasks.corpus.config import CorpusConfig
from tasks.corpus.extract import EXTRACTORS, extract_html, extract_many, tidy
from tasks.corpus.filters import Ledger, filter_documents

ROOT = Path(__file__).resolve().parents[2]
SMOKE_HTML = ROOT / "tests" / "fixtures" / "smoke" / "handbook_en"
ARTICLE = ("Gardeners who keep a small vegetable plot learn quickly that the soil matters more than any single seed. "
           "They add compost in the autumn, turn it over with a fork, and leave it to rest through the cold months.")
SECOND = ("When spring arrives the beds are dark and crumbly, and the first rows of peas go in with very little "
          "effort. Watering early in the morning keeps the leaves dry, which helps to prevent mould.")
PAGE = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>The vegetable plot</title>
<script>window.analytics = {{"id": 42}};</script><style>body {{ font-family: serif; }}</style></head>
<body>
<header><nav class="navigation"><ul><li><a href="/">Home</a></li><li><a href="/shop">Shop the catalogue</a></li>
<li><a href="/about">About our gardening club</a></li></ul></nav></header>
<main><article><h1>The vegetable plot</h1><p>{ARTICLE}</p><p>{SECOND}</p></article></main>
<footer><p>Copyright 2024 Garden Club. All rights reserved.</p><p>Privacy policy | Terms of use</p></footer>
</body></html>"""


def test_resiliparse_keeps_the_main_content_and_drops_navigation():
    text = extract_html(PAGE, "resiliparse")
    assert ARTICLE in text and SECOND in text and "The vegetable plot" in text
    for chrome in ("Shop the catalogue", "About our gardening club", "Copyright 2024", "Privacy policy",
                   "analytics", "font-family"):
        assert chrome not in text
    # Paragraphs stay on their own lines, as with trafilatura.
    assert text.index(ARTICLE) + len(ARTICLE) < text.index(SECOND)
    assert "\n" in text[text.index(ARTICLE):text.index(SECOND)]


def test_resiliparse_on_a_real_handbook_page_keeps_its_body_not_its_menu():
    html = (SMOKE_HTML / "sect.apt-file.html").read_text(encoding="utf-8")
    text = extract_html(html, "resiliparse")
    assert "apt-file" in text and len(text) > 500
    # The page's navigation bar ("Prev", "Next", "Home") is left out; the body text is shared with trafilatura.
    assert not {"Prev", "Next", "Home"} & set(text.split("\n"))
    trafilatura_lines = page_lines(extract_html(html, "trafilatura"))
    assert len(page_lines(text) & trafilatura_lines) >= 0.5 * len(trafilatura_lines)


def test_a_page_without_main_content_is_none_with_either_extractor():
    scripts = (ROOT / "tests" / "fixtures" / "bad_input" / "only_scripts.html").read_text()
    for name in EXTRACTORS:
        assert extract_html(scripts, name) is None
        assert extract_html("", name) is None
    assert extract_many([PAGE, scripts], extractor="resiliparse")[1] is None
    with pytest.raises(KeyError):
        extract_html(PAGE, "readability")


def test_the_corpus_build_uses_the_configured_extractor_and_names_it_in_the_reason():
    scripts = (ROOT / "tests" / "fixtures" / "bad_input" / "only_scripts.html").read_text()
    docs = pd.DataFrame([dict(doc_id="w/0", source="w", language_hint="en", content=PAGE, content_type="html"),
                         dict(doc_id="w/1", source="w", language_hint="en", content=scripts, content_type="html")])
    cfg = CorpusConfig(extractor="resiliparse", gopher={"min_words": 5})
    ledger = Ledger()
    kept = filter_documents(docs, cfg, ledger)
    removals, _ = ledger.frames()
    assert kept.doc_id.tolist() == ["w/0"] and ARTICLE in kept.text.iloc[0]
    assert removals[["doc_id", "rule", "detail"]].values.tolist() == [
        ["w/1", "extract.no_main_text", "resiliparse found no main text in the HTML"]]


def test_an_unknown_extractor_is_a_config_error_naming_the_field():
    raw = tomllib.loads((ROOT / "configs" / "smoke.toml").read_text())
    raw["corpus"]["extractor"] = "readability"
    with pytest.raises(ConfigError, match="corpus.extractor"):
        parse_config(raw)


def test_the_extractor_changes_the_corpus_key_and_everything_after(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the smoke sources are globs relative to the repository

    def keys(extractor: str | None) -> dict[str, str]:
        raw = tomllib.loads((ROOT / "configs" / "smoke.toml").read_text())
        if extractor is not None:
            raw["corpus"]["extractor"] = extractor
        return {s.stage: s.key for s in stage_statuses(parse_config(raw), RunsLayout(tmp_path / "runs"))}

    base, resiliparse = keys(None), keys("resiliparse")
    assert keys("trafilatura") == base  # the default, written out, is the same config
    assert [s for s in base if base[s] != resiliparse[s]] == ["quality_model", "corpus", "tokenizer", "mixture",
                                                             "quality_ablation", "sweep", "ladder", "main", "branches",
                                                             "cpt", "gate", "export"]


@pytest.fixture(scope="module")
def handbook_pages() -> pd.DataFrame:
    paths = sorted(SMOKE_HTML.glob("*.html"))
    docs = pd.DataFrame({"doc_id": [f"handbook_en/{p.name}" for p in paths],
                         "content": [p.read_text(encoding="utf-8") for p in paths], "content_type": "html"})
    return sample_pages(docs, 4, seed=0)


def test_pages_are_sampled_with_the_seed_and_html_only(handbook_pages):
    paths = sorted(SMOKE_HTML.glob("*.html"))
    docs = pd.DataFrame({"doc_id": [p.name for p in paths], "content": "<p>x</p>", "content_type": "html"})
    docs.loc[0, "content_type"] = "text"
    first, again = sample_pages(docs, 5, seed=1), sample_pages(docs, 5, seed=1)
    assert first.equals(again) and len(first) == 5 and paths[0].name not in set(first.doc_id)
    assert first.doc_id.tolist() == sorted(first.doc_id)  # input order
    assert not sample_pages(docs, 5, seed=2).equals(first)
    assert len(sample_pages(docs, 100, seed=0)) == len(docs) - 1
    assert len(handbook_pages) == 4


def test_the_comparison_table_has_its_columns_and_sane_figures(handbook_pages):
    comparison = compare_extractors(handbook_pages, "handbook_en", examples=3, seed=0)
    table = comparison.table.set_index("extractor")
    assert list(comparison.table.columns) == COMPARISON_COLUMNS
    assert set(table.index) == set(EXTRACTORS) and (table["source"] == "handbook_en").all()
    assert dict(zip(table.index, table["other"])) == {"trafilatura": "resiliparse", "resiliparse": "trafilatura"}
    mb = sum(len(c.encode()) for c in handbook_pages.content) / 1e6
    assert (table["pages"] == 4).all() and table["input_mb"].tolist() == pytest.approx([mb, mb])
    assert (table["pages_without_text"] == 0).all()
    for name in EXTRACTORS:
        texts = [extract_html(c, name) for c in handbook_pages.content]
        row = table.loc[name]
        # What the comparison counts is what the corpus build's extract stage would hand on.
        assert row["lines_kept"] == sum(len(page_lines(t)) for t in texts)
        assert 0 < row["chars_kept"] <= sum(len(t) for t in texts)
        assert 0.0 < row["line_overlap"] <= 1.0 and row["seconds"] > 0
        assert row["seconds_per_mb"] == pytest.approx(row["seconds"] / mb)
    # Both ways count the same shared lines, over each one's own total.
    assert table.loc["trafilatura", "lines_in_other"] == table.loc["resiliparse", "lines_in_other"]
    examples = comparison.examples
    assert list(examples.columns) == EXAMPLE_COLUMNS and len(examples) <= 6
    for row in examples.itertuples():
        other = "trafilatura" if row.extractor == "resiliparse" else "resiliparse"
        page = handbook_pages.set_index("doc_id").loc[row.doc_id, "content"]
        (full,) = [line for line in page_lines(extract_html(page, row.extractor)) if line.startswith(row.line)][:1]
        assert full not in page_lines(extract_html(page, other))


def test_a_source_without_html_gives_an_empty_comparison():
    comparison = compare_extractors(pd.DataFrame(columns=["doc_id", "content"]), "fortunes")
    assert comparison.table.empty and list(comparison.table.columns) == COMPARISON_COLUMNS
    assert comparison.examples.empty


def test_line_sets_ignore_list_markers_and_spacing():
    assert page_lines("- one  item\n\n• one item\n  two\n") == {"one item", "two"}
    assert page_lines(None) == set() and page_lines("") == set()


def test_the_audit_of_a_source_compares_its_extractors_and_writes_the_table(tmp_path, monkeypatch):
    from flows.audit import headline_metrics
    from flows.config import load_config
    from tasks.audit.config import AuditConfig
    from tasks.audit.run import load_originals, load_pages, run_audit, write_audit

    monkeypatch.chdir(ROOT)
    cfg = load_config(ROOT / "configs" / "smoke.toml")
    # The rules alone: the smoke config's quality classifier needs its trained artifact (tested end to end).
    corpus = cfg.corpus.model_copy(update={"extractor": "resiliparse", "quality_model": type(
        cfg.corpus.quality_model)()})
    source = cfg.sources["handbook_en"]
    audit_cfg = AuditConfig(num_originals=6, num_navigation=2, num_spam=2, num_repeated=2, num_short=2,
                            num_exact_copies=2, num_near_per_rate=1, extractor_pages=3, extractor_examples=2)
    originals, _ = load_originals(source, tmp_path / "cache", audit_cfg.num_originals, corpus.extractor)
    html = (SMOKE_HTML / sorted(p.name for p in SMOKE_HTML.glob("*.html"))[0]).read_text(encoding="utf-8")
    assert originals.text.iloc[0] == tidy(extract_html(html, "resiliparse"))  # the configured extractor's text
    pages = load_pages(source, tmp_path / "cache", audit_cfg.extractor_pages, audit_cfg.seed)
    assert len(pages) == 3 and load_pages(source, tmp_path / "cache", 0, 0).empty
    result = run_audit(originals, source, corpus, audit_cfg, pages=pages)
    summary = result.report["extractors"]
    assert summary["configured"] == "resiliparse" and [r["extractor"] for r in summary["rows"]] == list(EXTRACTORS)
    assert result.extractors.table["pages"].tolist() == [3, 3] and len(summary["only_in_one"]) <= 4
    files = {p.name for p in write_audit(result, tmp_path / "audit", "smoke · handbook_en")}
    assert {"extractors.parquet", "extractor_lines.csv", "report.json"} <= files
    assert pd.read_parquet(tmp_path / "audit" / "extractors.parquet").equals(result.extractors.table)
    metrics = headline_metrics(result.report)
    assert metrics["extractor_resiliparse_seconds_per_mb"] > 0 and metrics["extractor_trafilatura_chars_kept"] > 0
