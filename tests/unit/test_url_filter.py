"""URL rules of the corpus build: host normalisation and matching, blocklist files, the sources' ``url_field``, and
the ``url`` stage's ledger rows, funnel and manifest counts through the real build."""

import json
import math
import tomllib
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.config import parse_config
from flows.status import stage_statuses
from infra.errors import ConfigError, SourceError
from infra.runs import RunsLayout
from tasks.corpus.build import CURATION_STEPS, build_corpus, curate, read_slices, split_sources
from tasks.corpus.config import CorpusConfig, UrlConfig
from tasks.corpus.filters import DOC_STEPS
from tasks.corpus.stage import build_manifest, reconcile
from tasks.corpus.urls import url_host
from tasks.sources.config import SourceConfig
from tasks.sources.read import REJECT_SCHEMA, RowWriter, read_source
from tasks.readers import kept_files, removal_files

ROOT = Path(__file__).resolve().parents[2]
GARDEN = (
    "Gardeners who keep a small vegetable plot learn quickly that the soil matters more than any single seed. "
    "They add compost in the autumn, turn it over with a fork, and leave it to rest through the cold months. "
    "When spring arrives the beds are dark and crumbly, and the first rows of peas go in with very little effort."
)
RAIL = (
    "The old railway line that once carried coal from the valley has become a quiet path for walkers and cyclists. "
    "Along the way there are iron bridges, a tunnel lit by small lamps, and a station building that now serves tea. "
    "Local volunteers clear fallen branches after storms and repair the wooden benches with timber they have saved."
)
BREAD = (
    "Baking bread at home takes patience more than skill, because the dough needs time to rise in a warm place. "
    "Flour, water, salt and a little yeast are all that the recipe asks for, and the oven does the rest of the work. "
    "A loaf that cools on a wire rack keeps its crust, while one left in the tin turns soft and damp underneath it."
)
TIDE = (
    "The harbour empties twice a day when the tide goes out, leaving the small boats tilted on the wet sand. "
    "Children walk out to the rocks to look for crabs, and the gulls follow them in the hope of an easy meal. "
    "When the water returns it rises quickly, and the fishermen hurry to untie their ropes before the current turns."
)

LIBRARY = (
    "The village library opens on three afternoons a week, and the shelves by the window hold the newest novels. "
    "A retired teacher runs a reading group there, where neighbours argue politely about the endings of the books. "
    "In winter the radiator ticks under the tables, and the librarian stamps each card with a date written by hand."
)


def rules(**fields):
    return UrlConfig(**fields).rules()


def rule_of(found):
    return None if found is None else found[0]


# --- host normalisation and matching -------------------------------------------------------------------------


def test_a_domain_blocks_itself_and_its_subdomains_but_no_lookalike():
    blocked = rules(blocklist=["example.com"])
    for url in ["http://example.com/", "https://a.example.com/x", "https://a.b.example.com/x?y=1"]:
        assert blocked.check(url) == ("url.blocklist", f"blocked domain example.com (host {url_host(url)})"), url
    for url in ["http://badexample.com/", "http://example.com.evil.org/", "http://example.co/", "http://com/",
                "http://example.org/example.com"]:
        assert blocked.check(url) is None, url


def test_hosts_are_compared_without_case_trailing_dot_port_userinfo_and_www():
    blocked = rules(blocklist=["Example.COM."])
    for url in ["HTTP://A.EXAMPLE.COM/Path", "http://example.com./x", "http://example.com:8080/",
                "https://user:secret@example.com:443/login", "http://www.example.com/", "//example.com/x",
                "example.com/page"]:
        assert rule_of(blocked.check(url)) == "url.blocklist", url
    # The host after the userinfo is the one that counts.
    assert blocked.check("http://example.com@evil.org/") is None
    assert url_host("https://user:pw@WWW.Example.COM.:8443/p") == "example.com"
    assert url_host("http://www.com/") == "www.com"  # nothing but a TLD would be left
    # An entry with www. is the same site as without it.
    assert rule_of(rules(blocklist=["www.example.org"]).check("https://example.org/")) == "url.blocklist"
    assert rule_of(rules(blocklist=["*.example.org"]).check("https://a.example.org/")) == "url.blocklist"


def test_internationalised_hosts_match_in_their_punycode_form():
    unicode_entry, punycode_entry = rules(blocklist=["bücher.de"]), rules(blocklist=["xn--bcher-kva.de"])
    for url in ["http://xn--bcher-kva.de/", "http://BÜCHER.de/", "http://shop.bücher.de/", "http://XN--BCHER-KVA.DE"]:
        assert unicode_entry.check(url) == ("url.blocklist", f"blocked domain xn--bcher-kva.de (host {url_host(url)})")
        assert rule_of(punycode_entry.check(url)) == "url.blocklist"
    assert url_host("http://ＥＸＡＭＰＬＥ．com/") == "example.com"  # full-width letters and dot
    assert unicode_entry.check("http://bucher.de/") is None


def test_an_ip_address_matches_only_itself():
    blocked = rules(blocklist=["10.0.0.1", "2001:db8::1"])
    assert rule_of(blocked.check("http://10.0.0.1:8000/")) == "url.blocklist"
    assert rule_of(blocked.check("http://[2001:0db8:0:0::1]/")) == "url.blocklist"
    assert blocked.check("http://110.0.0.1/") is None
    assert blocked.check("http://1.10.0.0.1.example/") is None


def test_substrings_match_anywhere_in_the_url_ignoring_case():
    blocked = rules(substrings=["Casino", "/wp-login"])
    assert blocked.check("https://games.example/CASINO-royale") == ("url.blocklist",
                                                                    "blocked substring 'casino' in the URL")
    assert blocked.check("http://x.org/wp-login.php") == ("url.blocklist", "blocked substring '/wp-login' in the URL")
    assert blocked.check("https://example.org/cas-ino") is None


def test_the_allowlist_keeps_its_domains_and_subdomains_only_and_the_blocklist_wins():
    allowed = rules(allowlist=["docs.python.org", "wikipedia.org"], blocklist=["spam.wikipedia.org"])
    for url in ["https://docs.python.org/3/", "https://www.docs.python.org/", "https://en.wikipedia.org/wiki/X"]:
        assert allowed.check(url) is None, url
    assert allowed.check("https://python.org/") == ("url.not_allowed", "host python.org is not under an allowed domain")
    assert allowed.check("https://notwikipedia.org/") == ("url.not_allowed",
                                                          "host notwikipedia.org is not under an allowed domain")
    assert allowed.check("mailto:someone@wikipedia.org") == ("url.not_allowed", "the URL has no host")
    assert rule_of(allowed.check("https://spam.wikipedia.org/")) == "url.blocklist"


def test_a_record_without_a_url_is_never_removed():
    strict = rules(blocklist=["example.com"], substrings=["a"], allowlist=["nowhere.example"])
    for missing in [None, "", "   ", math.nan, 42]:
        assert strict.check(missing) is None


def test_no_rules_remove_nothing():
    assert not rules().active
    assert rules().check("http://example.com/") is None


# --- config: entries and blocklist files ---------------------------------------------------------------------


def test_blocklist_files_ignore_comments_and_blank_lines(tmp_path):
    path = tmp_path / "blocked.txt"
    path.write_text("# adult sites, from a list\n\nspam.example  # trailing comment\n  BÜCHER.de \n*.ads.example\n")
    blocked = rules(blocklist_files=[str(path)])
    assert blocked.blocked == frozenset({"spam.example", "xn--bcher-kva.de", "ads.example"})
    assert rule_of(blocked.check("http://a.spam.example/")) == "url.blocklist"
    assert blocked.check("http://comment.example/") is None


def test_a_missing_blocklist_file_is_refused_at_load_naming_it(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ConfigError, match="nope.txt"):
        UrlConfig(blocklist_files=[missing])
    with pytest.raises(ConfigError, match=r"urls\.blocklist_files: blocklist file '.*nope\.txt' cannot be read"):
        CorpusConfig.validate_strict({"urls": {"blocklist_files": [missing]}}, "x.toml")


def test_bad_entries_are_refused_at_load(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("ok.example\nhttp://a.example/page\n")
    with pytest.raises(ConfigError, match=r"bad\.txt' line 2: 'http://a\.example/page' is not a domain name"):
        UrlConfig(blocklist_files=[str(path)])
    for entry in ["two words.example", "a..b", "", "user@example.com"]:
        with pytest.raises(ConfigError, match="is not a domain name"):
            UrlConfig(blocklist=[entry])
    with pytest.raises(ConfigError, match="must not contain empty or blank strings"):
        UrlConfig(substrings=[" "])
    with pytest.raises(ConfigError, match=r"url_field='url' is read from jsonl and parquet files only"):
        SourceConfig(name="s", kind="local", include=["x"], format="html", url_field="url")


def test_the_blocklist_files_content_is_in_the_corpus_key(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "blocked.txt"

    def corpus_key(text):
        path.write_text(text)
        raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
        raw["corpus"]["urls"] = {"blocklist_files": [str(path)]}
        return {s.stage: s.key for s in stage_statuses(parse_config(raw), RunsLayout(tmp_path / "runs"))}["corpus"]

    base = corpus_key("spam.example\n")
    assert corpus_key("# the same domain\nspam.example\n\n") == base
    assert corpus_key("spam.example\nmore.example\n") != base


# --- reading: url_field in the sources stage -----------------------------------------------------------------


def _read(tmp_path, cfg):
    with RowWriter(tmp_path / "rejects.parquet", REJECT_SCHEMA) as rejects:
        read = read_source(cfg, tmp_path / "cache", tmp_path / f"{cfg.name}.parquet", rejects)
    return read, tmp_path / "rejects.parquet"


def test_a_parquet_source_reads_its_url_column(tmp_path):
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"body": [GARDEN, RAIL, BREAD], "link": ["https://a.example/", None, "  "]}), data)
    cfg = SourceConfig(name="pq", kind="local", include=[str(data)], text_field="body", url_field="link")
    read, _ = _read(tmp_path, cfg)
    assert pq.read_table(read.docs_path).column("url").to_pylist() == ["https://a.example/", None, "  "]
    with pytest.raises(SourceError, match="no column url_field='url'"):
        _read(tmp_path, cfg.model_copy(update={"url_field": "url"}))


def test_a_jsonl_source_with_url_field_end_to_end_through_the_corpus_build(tmp_path):
    """The sources stage's reader writes the documents file; the corpus stage's planner, build and manifest read it."""
    data = tmp_path / "crawl.jsonl"
    records = [
        {"text": GARDEN, "url": "https://blog.example.com/garden"},
        {"text": RAIL, "url": "https://WWW.Spam.Example:443/rail"},  # blocked domain
        {"text": BREAD, "url": 42},  # not a string: no URL
        {"text": TIDE},  # no URL at all
        {"text": LIBRARY, "url": "  "},  # blank: no URL
        {"text": GARDEN.replace("peas", "beans"), "url": "http://ok.example/online-CASINO"},  # blocked substring
        {"text": "not json"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in records[:-1]) + "\n{broken\n")
    source = SourceConfig(name="crawl", kind="local", include=[str(data)], format="jsonl", url_field="url",
                          language="en")
    read, rejects = _read(tmp_path, source)
    docs = pd.read_parquet(read.docs_path)
    assert pq.read_table(read.docs_path).column("url").to_pylist() == [
        "https://blog.example.com/garden", "https://WWW.Spam.Example:443/rail", None, None, "  ",
        "http://ok.example/online-CASINO"]
    assert pd.read_parquet(rejects).rule.tolist() == ["read.bad_json"]  # a URL that is not a string is no error

    cfg = CorpusConfig(urls={"blocklist": ["spam.example"], "substrings": ["casino"]}, gopher={"min_words": 20},
                       execution={"shard_docs": 2})
    work, out = tmp_path / "work", tmp_path / "out"
    split_sources([read.docs_path], work, cfg.execution.shard_docs)
    result = curate(work, out, cfg)
    url_rows = result.removals[result.removals.stage == "url"]
    assert url_rows[["doc_id", "rule", "detail"]].values.tolist() == [
        ["crawl/crawl.jsonl#1", "url.blocklist", "blocked domain spam.example (host spam.example)"],
        ["crawl/crawl.jsonl#5", "url.blocklist", "blocked substring 'casino' in the URL"]]
    assert sorted(result.kept.doc_id) == [f"crawl/crawl.jsonl#{i}" for i in (0, 2, 3, 4)]
    reconcile([read.docs_path], [rejects], kept_files(out), removal_files(out))

    described = {"crawl": {"role": "general", "snapshot": read.snapshot, "licence": read.licence}}
    manifest = build_manifest(described, [read.docs_path], [rejects], kept_files(out),
                              removal_files(out), result, cfg, [])
    info = manifest["sources"]["crawl"]
    assert list(info["stages"]) == CURATION_STEPS
    assert info["stages"]["url"] == {"docs_in": 6, "docs_out": 4, "no_url": 3, "url_invalid": 0,
                                     "chars_in": sum(map(len, docs.content)),
                                     "chars_out": len(GARDEN) + len(BREAD) + len(TIDE) + len(LIBRARY)}
    assert info["stages"]["sanitise"]["docs_in"] == 4
    assert info["removed_by_rule"] == {"url.blocklist": 2}
    assert info["filters"]["urls"]["blocklist"] == ["spam.example"]


def test_read_slices_gives_null_urls_for_files_without_the_column(tmp_path):
    base = dict(source="s", language_hint="en", content_type="text")
    with_urls = pd.DataFrame([dict(doc_id="a", content=GARDEN, url="http://a.example/", **base)])
    without = pd.DataFrame([dict(doc_id="b", content=RAIL, **base)])
    with_urls.to_parquet(tmp_path / "a.parquet", index=False)
    without.to_parquet(tmp_path / "b.parquet", index=False)
    got = read_slices([[str(tmp_path / "a.parquet"), 0, 1], [str(tmp_path / "b.parquet"), 0, 1]])
    assert got.doc_id.tolist() == ["a", "b"] and got.url.tolist() == ["http://a.example/", None]
    assert "url" in read_slices([]).columns


# --- the build on a frame ------------------------------------------------------------------------------------


def _frame(rows):
    # Object columns: a string column of Arrow type could not hold a lone surrogate.
    return pd.DataFrame([dict(doc_id=f"{src}/{i}", source=src, language_hint="en", content=content,
                              content_type=kind, url=url) for i, (src, content, kind, url) in enumerate(rows)],
                        dtype=object)


def test_build_corpus_removes_by_url_first_with_ledger_rows_and_funnel_counts():
    docs = _frame([
        ("web", GARDEN, "text", "https://good.example/garden"),
        ("web", "<html><body></body></html>", "html", "https://news.blocked.example/"),  # no text either: url first
        ("web", RAIL, "text", None),
        ("web", BREAD, "text", "https://elsewhere.example/bread"),  # not on the allowlist
        ("forum", TIDE, "text", "http://good.example/casino/tide"),
        ("forum", GARDEN.replace("peas", "beans"), "text", "https://forum.good.example/garden"),
    ])
    cfg = CorpusConfig(urls={"blocklist": ["blocked.example"], "substrings": ["casino"],
                             "allowlist": ["good.example", "blocked.example"]},
                       gopher={"min_words": 20}, execution={"shard_docs": 2}, near_dedup={"enabled": False})
    res = build_corpus(docs, cfg)
    url_rows = res.removals[res.removals.stage == "url"]
    assert url_rows[["doc_id", "rule", "detail"]].values.tolist() == [
        ["web/1", "url.blocklist", "blocked domain blocked.example (host news.blocked.example)"],
        ["web/3", "url.not_allowed", "host elsewhere.example is not under an allowed domain"],
        ["forum/4", "url.blocklist", "blocked substring 'casino' in the URL"]]
    assert url_rows.value.isna().all() and url_rows.threshold.isna().all()
    assert sorted(res.kept.doc_id) == ["forum/5", "web/0", "web/2"]  # web/2 has no URL and is kept
    funnel = res.funnel.set_index(["source", "stage"])
    assert funnel.loc[("web", "url"), ["docs_in", "docs_out"]].tolist() == [4, 2]
    assert funnel.loc[("forum", "url"), ["docs_in", "docs_out"]].tolist() == [2, 1]
    assert funnel.loc[("web", "url"), "chars_out"] == len(GARDEN) + len(RAIL)
    for source, rows in res.funnel.groupby("source"):
        assert rows.stage.tolist() == CURATION_STEPS and CURATION_STEPS[0] == DOC_STEPS[0] == "url"
        assert (rows.docs_in.to_numpy()[1:] == rows.docs_out.to_numpy()[:-1]).all()


def test_a_frame_without_urls_and_switched_off_rules_remove_nothing_at_the_url_stage():
    docs = _frame([("web", GARDEN, "text", "https://blocked.example/"), ("web", RAIL, "text", None)])
    on = {"blocklist": ["blocked.example"]}
    for frame, urls in [(docs.drop(columns="url"), on), (docs, {**on, "enabled": False}), (docs, {})]:
        res = build_corpus(frame, CorpusConfig(urls=urls, gopher={"min_words": 20}))
        row = res.funnel.set_index(["source", "stage"]).loc[("web", "url")]
        assert (row.docs_in, row.docs_out) == (2, 2)
        assert not (res.removals.stage == "url").any()


def test_a_url_with_a_lone_surrogate_is_written_with_a_replacement_character(tmp_path):
    data = tmp_path / "odd.jsonl"
    data.write_text(json.dumps({"text": GARDEN, "link": "https://blocked.example/\ud800"}) + "\n")
    read, _ = _read(tmp_path, SourceConfig(name="odd", kind="local", include=[str(data)], url_field="link"))
    assert pq.read_table(read.docs_path).column("url").to_pylist() == ["https://blocked.example/\ufffd"]
    docs = _frame([("web", GARDEN, "text", "https://blocked.example/\ud800")])
    res = build_corpus(docs, CorpusConfig(urls={"blocklist": ["blocked.example"]}))
    assert res.removals[["doc_id", "rule"]].values.tolist() == [["web/0", "url.blocklist"]]


# --- url_field: a field no record has, values that are not URLs ---------------------------------------------


def test_a_url_field_that_no_record_has_is_an_error_naming_the_source_the_field_and_the_keys(tmp_path):
    data = tmp_path / "crawl.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [{"text": GARDEN, "url": "https://a.example/", "lang": "en"},
                                                       {"text": RAIL, "url": "https://b.example/"}]) + "\n")
    cfg = SourceConfig(name="crawl", kind="local", include=[str(data)], url_field="link")
    with pytest.raises(SourceError, match=r"source 'crawl': url_field='link' is in none of its 2 records read; they "
                                          r"have the fields \['lang', 'text', 'url'\]"):
        _read(tmp_path, cfg)
    # One record with the key (null included) is enough: the others simply have no URL.
    data.write_text(data.read_text() + json.dumps({"text": BREAD, "link": None}) + "\n")
    read, _ = _read(tmp_path, cfg)
    assert read.num_docs == 3 and pq.read_table(read.docs_path).column("url").to_pylist() == [None] * 3
    assert read.url_invalid == 0
    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [GARDEN], "url": ["https://a.example/"]}), rows)
    with pytest.raises(SourceError, match=r"source 'pq': .*rows\.parquet: no column url_field='link'; it has "
                                          r"\['text', 'url'\]"):
        _read(tmp_path, SourceConfig(name="pq", kind="local", include=[str(rows)], url_field="link"))


def test_url_field_values_that_are_not_urls_are_read_as_no_url_counted_and_logged(tmp_path, caplog):

    from infra.stage import StageContext
    from tasks.sources.stage import run as run_sources

    data = tmp_path / "crawl.jsonl"
    records = [
        {"text": GARDEN, "link": "https://good.example/garden"},
        {"text": RAIL, "link": "n/a"},  # not a URL: without it the allowlist would remove the page as host 'n'
        {"text": BREAD, "link": "example.com/bread"},  # host first: a URL
        {"text": TIDE, "link": 42},  # a number
        {"text": LIBRARY, "link": "mailto:editor@good.example"},  # no host
        {"text": GARDEN.replace("peas", "beans"), "link": None},  # null: no URL, not counted
        {"text": RAIL.replace("coal", "iron"), "link": " "},  # blank: no URL, kept as it is
    ]
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    source = SourceConfig(name="crawl", kind="local", include=[str(data)], url_field="link", language="en")
    with caplog.at_level("WARNING", logger="tasks.sources.read"):
        read, rejects = _read(tmp_path, source)
    assert pq.read_table(read.docs_path).column("url").to_pylist() == [
        "https://good.example/garden", None, "example.com/bread", None, None, None, " "]
    assert (read.url_invalid, read.url_invalid_examples) == (3, ["'n/a'", "42", "'mailto:editor@good.example'"])
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "tasks.sources.read"]
    assert warning == ("source 'crawl': 3 url_field 'link' value(s) are not URLs (e.g. 'n/a', 42, "
                       "'mailto:editor@good.example'); those documents are read without a URL (url_invalid in "
                       "sources.json)")

    # The sources stage records the count; the corpus build treats those documents as having no URL.
    out = tmp_path / "artifact"
    out.mkdir()
    ctx = StageContext(out=out, inputs={}, layout=RunsLayout(tmp_path / "runs"), key="k", experiment="t")
    run_sources(ctx, {"crawl": source})
    described = json.loads((out / "sources.json").read_text())
    assert described["crawl"]["url_invalid"] == 3 and described["crawl"]["docs_read"] == 7
    cfg = CorpusConfig(urls={"allowlist": ["good.example", "example.com"]}, gopher={"min_words": 20})
    work, built = tmp_path / "work", tmp_path / "built"
    docs_path = out / "docs" / "crawl.parquet"
    split_sources([docs_path], work, cfg.execution.shard_docs)
    result = curate(work, built, cfg)
    assert not (result.removals.stage == "url").any()
    manifest = build_manifest(described, [docs_path], [out / "rejects.parquet"], kept_files(built),
                              removal_files(built), result, cfg, [])
    assert manifest["sources"]["crawl"]["stages"]["url"]["no_url"] == 5
    assert manifest["sources"]["crawl"]["stages"]["url"]["url_invalid"] == 3  # of the 5


def test_is_url_reads_urls_with_a_host_only():
    from tasks.sources.read import is_url

    for text in ["https://a.example/", "HTTP://WWW.Example.COM:8080/x?y#z", "example.com/page", "www.example.com",
                 "http://localhost:8080/", "http://[::1]:80/", "1.2.3.4/x", "http://bücher.de/", "ftp://f.example",
                 " https://padded.example "]:
        assert is_url(text), text
    for text in ["n/a", "none", "3.14", "42", "mailto:a@b.example", "javascript:void(0)", "http:///path",
                 "/relative/path", "http://two words.example/", "http://[::1/", "http://a..b/", "file:///etc/x"]:
        assert not is_url(text), text
