"""Bad input through the readers, the corpus build and the tokenizer: every input ends kept, removed with a reason,
or rejected with a reason, never a crash; per source, documents read + rejects (+ counted skips) = inputs, and kept +
removed = documents read. The kept documents are then fitted on, encoded and packed: each decodes back to its text
exactly (byte-level BPE, no normalisation), EOS ends every document, and the packed rows hold every token once.

Each build also curates one ordinary English document (source ``anchor``) so that a case is judged next to a
document that survives, as in a real shard.
"""

import io
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.errors import SourceError
from tasks.corpus.build import build_corpus
from tasks.corpus.config import CorpusConfig
from tasks.sources.config import SourceConfig
from tasks.sources.read import SourceDocs, read_small_source
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import eos_id, fit_tokenizer
from tasks.train.packing import POLICIES, plan_rows
from tasks.train.shards import encode_documents

FIX = Path(__file__).parents[1] / "fixtures" / "bad_input"
GARDEN = (
    "Gardeners who keep a small vegetable plot learn quickly that the soil matters more than any single seed. "
    "They add compost in the autumn, turn it over with a fork, and leave it to rest through the cold months. "
    "When spring arrives the beds are dark and crumbly, and the first rows of peas go in with very little effort. "
    "Watering early in the morning keeps the leaves dry, which helps to prevent mould, and a thin layer of straw "
    "between the rows holds moisture in the ground during the hot weeks of summer that follow."
)
RAIL = (
    "The old railway line that once carried coal from the valley has become a quiet path for walkers and cyclists. "
    "Along the way there are iron bridges, a tunnel lit by small lamps, and a station building that now serves tea. "
    "Local volunteers clear fallen branches after storms and repair the wooden benches with timber they have saved. "
    "On weekends families come with bicycles and picnic baskets, and the children count the mileposts as they ride "
    "toward the river where the line used to end at a loading dock."
)
PII = (
    "The support team keeps a short log of every incident that reaches the help desk. Last night the monitoring "
    "system reported that the server at 192.168.0.1 stopped answering requests for about ten minutes. The engineer "
    "on duty confirmed that the machine was still running version 1.10.0.0 of the agent, and that the measured error "
    "ratio was 0.250750683890174 when the alarm fired. Customers who want to follow up can write to the address in "
    'the footer of this page: "contact: a.b@example.org", and they will receive an answer within two working days.'
)


@dataclass
class Curated:
    kept: pd.DataFrame
    removals: pd.DataFrame

    def removal(self, doc_id: str) -> pd.Series:
        rows = self.removals[self.removals.doc_id == doc_id]
        assert len(rows) == 1, f"{doc_id} has {len(rows)} removal rows; kept ids: {self.kept.doc_id.tolist()}"
        return rows.iloc[0]

    def text(self, doc_id: str) -> str:
        rows = self.kept[self.kept.doc_id == doc_id]
        assert len(rows) == 1, f"{doc_id} not kept: {self.removals[['doc_id', 'rule', 'detail']].values.tolist()}"
        return rows.text.iloc[0]


def read(tmp_path: Path, name: str, files: dict[str, str | bytes], n_in: int | None = None, **cfg) -> SourceDocs:
    """Write ``files`` under ``tmp_path/name`` and read them as source ``name``; checks docs + rejects + skips
    = ``n_in`` (default: one input per file)."""
    root = tmp_path / name
    root.mkdir()
    for rel, content in files.items():
        (root / rel).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return read_paths(name, [str(root / "*")], len(files) if n_in is None else n_in, **cfg)


def read_paths(name: str, include: list[str], n_in: int, **cfg) -> SourceDocs:
    out = read_small_source(SourceConfig(name=name, kind="local", include=include, **cfg), Path("."))
    assert len(out.docs) + len(out.rejects) + sum(out.skipped.values()) == n_in
    assert (out.rejects.rule.str.startswith("read.") & (out.rejects.detail.str.len() > 0)).all()
    return out


def curate(tmp_path: Path, *sources: SourceDocs, cfg: CorpusConfig | None = None) -> Curated:
    """Build the corpus from the sources' documents plus the anchor, as the stages do (documents pass through
    Parquet); checks kept + removed = read for every source, one removal row each, with a rule and a detail."""
    anchor = read(tmp_path, "anchor", {"garden.txt": GARDEN})
    docs = pd.concat([s.docs for s in (anchor, *sources)], ignore_index=True)
    path = tmp_path / "docs.parquet"
    docs.to_parquet(path, index=False)
    result = build_corpus(pd.read_parquet(path), cfg or CorpusConfig(), out=tmp_path / "corpus")
    out = Curated(result.kept, result.removals)
    assert not out.removals.doc_id.duplicated().any() and set(out.kept.doc_id).isdisjoint(out.removals.doc_id)
    assert sorted([*out.kept.doc_id, *out.removals.doc_id]) == sorted(docs.doc_id)
    assert ((out.removals.rule.str.len() > 0) & (out.removals.detail.str.len() > 0)).all()
    out.text("anchor/garden.txt")
    tokenize(out.kept.text.tolist())
    return out


def tokenize(texts: list[str], tok=None):
    """Fit a small BPE on ``texts`` (unless ``tok`` is given), encode and pack them; checks that every document
    decodes back to its text, EOS ends each one, and both packing policies place every token exactly once."""
    tok = tok or fit_tokenizer(texts, TokenizerConfig(vocab_size=512))
    tokens, offsets = encode_documents(tok, texts)
    eos, ends = eos_id(tok), np.append(offsets[1:], len(tokens)).astype(np.int64)
    assert len(offsets) == len(texts) and int((tokens == eos).sum()) == len(texts) and (tokens[ends - 1] == eos).all()
    for text, start, end in zip(texts, offsets, ends):
        assert tok.decode(tokens[start:end - 1].tolist()) == text
    seq_len = 32
    for policy in POLICIES:
        plan = plan_rows(offsets, len(tokens), seq_len, policy)
        rows = [plan.row(tokens, offsets, r)[0] for r in range(plan.n_rows)]
        assert all(len(row) <= plan.row_tokens == seq_len + 1 for row in rows)
        if policy == "concat":  # windows of T + 1 every T tokens (targets overlap inputs by one); the tail drops
            for r, row in enumerate(rows):
                np.testing.assert_array_equal(row, tokens[r * seq_len:r * seq_len + seq_len + 1])
            assert (plan.n_rows * seq_len + 1 if rows else 0) + plan.tokens_dropped == len(tokens)
        else:  # best fit places whole documents (cut only when longer than a row), each token once, none dropped
            placed = np.concatenate(rows) if rows else tokens[:0]
            assert plan.tokens_dropped == 0
            np.testing.assert_array_equal(np.sort(placed), np.sort(tokens))
    return tok


def test_empty_whitespace_and_zero_width_documents_are_removed_as_empty(tmp_path):
    src = read(tmp_path, "blank", {"empty.txt": "", "spaces.txt": " \n\t \r\n ",
                                   "zero_width.txt": "\u200b\u200c\u200d\u2060\ufeff" * 30})
    out = curate(tmp_path, src)
    for name in ("empty.txt", "spaces.txt", "zero_width.txt"):
        assert out.removal(f"blank/{name}").rule == "empty.whitespace"


def test_chinese_paragraph_without_spaces_is_judged_by_character_rules(tmp_path):
    src = read_paths("zh", [str(FIX / "chinese_no_spaces.txt")], 1)
    out = curate(tmp_path, src, cfg=CorpusConfig(languages=["en", "zh"]))
    kept = out.kept.set_index("doc_id").loc["zh/chinese_no_spaces.txt"]
    # English word rules would see one 305-character "word" and remove it (min_words, mean word length)
    assert kept.language == "zh" and kept.n_words > 250


def test_lone_surrogates_and_nul_from_json_are_repaired_and_bad_lines_rejected(tmp_path):
    src = read_paths("j", [str(FIX / "mixed.jsonl")], 4)
    assert src.rejects[["doc_id", "rule"]].values.tolist() == [["j/mixed.jsonl#1", "read.bad_json"],
                                                                ["j/mixed.jsonl#2", "read.missing_field"]]
    assert src.rejects.detail.tolist()[0].startswith("mixed.jsonl line 2: ")
    assert src.docs[["num_replaced", "num_nul_removed"]].values.tolist() == [[1, 0], [0, 1]]
    assert "capital \ufffd." in src.docs.content.iloc[0] and "\x00" not in src.docs.content.iloc[1]
    out = curate(tmp_path, src)
    assert "\ufffd" in out.text("j/mixed.jsonl#0")
    assert out.removal("j/mixed.jsonl#3").stage == "langid"  # 24 characters, no hint: too short to identify


def test_lone_surrogate_given_directly_to_the_corpus_is_sanitised(tmp_path):
    docs = pd.DataFrame([dict(doc_id="s/0", source="s", language_hint=None, content=RAIL + " \ud800",
                              content_type="text")], dtype=object)
    out = build_corpus(docs, CorpusConfig(), out=tmp_path / "corpus")
    assert "\ufffd" in out.kept.text.iloc[0]


def test_a_shard_whose_every_document_is_removed_is_a_ledger_not_a_crash(tmp_path):
    docs = pd.DataFrame([dict(doc_id="s/0", source="s", language_hint=None, content="", content_type="text")])
    out = build_corpus(docs, CorpusConfig(), out=tmp_path / "corpus")
    assert out.kept.empty and out.removals.rule.tolist() == ["empty.whitespace"]


def test_nul_bytes_are_stripped_and_counted(tmp_path):
    src = read(tmp_path, "nul", {"a.txt": RAIL.replace(" the ", " the\x00 ", 3),
                                 "b.html": f"<html><body><article><p>{PII}</p></article></body></html>\x00\x00"})
    assert src.docs.num_nul_removed.tolist() == [3, 2]
    out = curate(tmp_path, src)
    assert out.text("nul/a.txt") == RAIL and "help desk" in out.text("nul/b.html")


def test_long_line_without_spaces_is_removed_with_a_reason(tmp_path):
    src = read(tmp_path, "long", {"line.txt": "".join(random.Random(0).choices("abcdefghij", k=200_000))})
    out = curate(tmp_path, src)
    assert out.removal("long/line.txt").stage in {"langid", "quality"}


def test_latin1_page_that_declares_its_charset(tmp_path):
    src = read_paths("web", [str(FIX / "latin1_declared.html")], 1)
    assert src.docs[["encoding", "encoding_from", "num_replaced"]].values.tolist() == [["cp1252", "declared", 0]]
    out = curate(tmp_path, src)
    text = out.text("web/latin1_declared.html")
    assert "Zoë Martín" in text and "crème brûlée" in text and "Ã" not in text


def test_mojibake_is_repaired_and_then_an_exact_duplicate_of_its_clean_twin(tmp_path):
    src = read_paths("twins", [str(FIX / "mojibake" / "*.txt")], 2)
    assert "â€™" in src.docs.content.iloc[0]
    out = curate(tmp_path, src)
    # ftfy repairs the first; the repaired text equals the clean twin, so exact dedup keeps the first and says why
    kept = out.kept.set_index("doc_id").loc["twins/a_mojibake.txt"]
    assert kept.text == (FIX / "mojibake" / "b_clean.txt").read_text(encoding="utf-8")
    assert "sloppy-windows-1252" in kept.fixes
    removed = out.removal("twins/b_clean.txt")
    assert (removed.rule, removed.detail) == ("dedup.exact", "exact duplicate of twins/a_mojibake.txt")


def test_pii_is_replaced_by_placeholders_and_numbers_are_left_alone(tmp_path):
    out = curate(tmp_path, read(tmp_path, "pii", {"log.txt": PII}))
    text = out.text("pii/log.txt")
    assert "server at <IP> stopped" in text and "192.168" not in text
    assert "version 1.10.0.0 of" in text and "ratio was 0.250750683890174 when" in text
    assert '"contact: <EMAIL>",' in text
    assert out.kept.set_index("doc_id").loc["pii/log.txt"].pii_replacements == 2


def test_second_cat_is_an_exact_duplicate_and_dog_stays(tmp_path):
    src = read(tmp_path, "pets", {"a.txt": "cat", "b.txt": "dog", "c.txt": "cat"}, language="en")
    # one-word documents: relax the word-count and stop-word rules for this source only
    cfg = CorpusConfig(source_overrides={"pets": {"min_words": 1, "min_stop_words": 0}})
    out = curate(tmp_path, src, cfg=cfg)
    assert out.text("pets/a.txt") == "cat" and out.text("pets/b.txt") == "dog"
    removed = out.removal("pets/c.txt")
    assert (removed.rule, removed.detail) == ("dedup.exact", "exact duplicate of pets/a.txt")


def test_binary_bytes_and_invalid_utf8_are_rejects_or_counted_replacements(tmp_path):
    rng = random.Random(0)
    blob = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(rng.randrange(256) for _ in range(5000))
    text = RAIL.replace("serves tea", "serves café crème")  # a UTF-8 page with one stray byte
    page = f"<html><body><article><p>{text}</p></article></body></html>".encode().replace(b"quiet", b"qu\xffiet")
    src = read(tmp_path, "bin", {"image.html": blob, "blob.txt": blob, "latin.txt": "café au lait".encode("latin-1"),
                                 "stray.html": page})
    assert src.rejects[["doc_id", "rule"]].values.tolist() == [["bin/blob.txt", "read.undecodable"],
                                                                ["bin/image.html", "read.binary"],
                                                                ["bin/latin.txt", "read.undecodable"]]
    assert src.rejects.detail.iloc[2] == "latin.txt: not UTF-8 at byte 3: invalid continuation byte"
    assert src.docs[["doc_id", "encoding_from", "num_replaced"]].values.tolist() == [["bin/stray.html", "utf8", 1]]
    assert "qu\ufffdiet" in curate(tmp_path, src).text("bin/stray.html")


def test_fifty_megabyte_single_line_is_removed_by_the_word_limit(tmp_path):
    sentence = "The same sentence is repeated on one very long line of text. "
    src = read(tmp_path, "huge", {"line.txt": sentence * (50_000_000 // len(sentence))})
    assert len(src.docs.content.iloc[0]) > 49_000_000
    removed = curate(tmp_path, src).removal("huge/line.txt")
    assert removed.rule == "gopher.max_words"


def test_extremely_repetitive_text_is_removed_by_the_repetition_rules_and_still_tokenizes(tmp_path):
    files = {"word.txt": "buy now " * 20_000, "line.txt": "Click here to claim your free prize today.\n" * 2_000,
             "paragraph.txt": (RAIL + "\n\n") * 200, "char.txt": "a" * 300_000,
             "ngram.txt": " ".join(["the cheapest tickets for the big match"] * 500)}
    src = read(tmp_path, "rep", files)
    out = curate(tmp_path, src)
    for name in files:
        assert out.removal(f"rep/{name}").stage in {"quality", "langid"}, name
    # the tokenizer itself copes with such text: each document encodes, decodes back and packs
    tokenize(src.docs.content.tolist())


def test_mixed_chinese_english_technical_text_is_kept_and_round_trips(tmp_path):
    out = curate(tmp_path, read_paths("tech", [str(FIX / "mixed_zh_en_technical.txt")], 1))
    kept = out.kept.set_index("doc_id").loc["tech/mixed_zh_en_technical.txt"]
    assert kept.language == "zh"
    for term in ("apt-get install python3-venv", "subprocess.run()", '["dpkg-deb", "--fsys-tarfile", path]',
                 "vocab_size = 1024", "peak_lr = 3e-4", "UnicodeDecodeError"):
        assert term in kept.text, term


def test_html_with_only_scripts_has_no_main_text(tmp_path):
    out = curate(tmp_path, read_paths("web", [str(FIX / "only_scripts.html")], 1))
    assert out.removal("web/only_scripts.html").rule == "extract.no_main_text"


def test_deeply_nested_html_is_removed_with_a_reason(tmp_path):
    html = "<html><body>" + "<div>" * 5000 + f"<p>{RAIL}</p>" + "</div>" * 5000 + "</body></html>"
    out = curate(tmp_path, read(tmp_path, "deep", {"deep.html": html}))
    # libxml2 stops building the tree at its default depth limit (256), so the paragraph is not reached
    assert out.removal("deep/deep.html").rule == "extract.no_main_text"


def test_right_to_left_text(tmp_path):
    mixed = RAIL.replace("serves tea.", "serves tea under a sign that says \u200fשלום\u200f and \u202bمرحبا\u202c.")
    src = read(tmp_path, "rtl", {"mixed.txt": mixed})
    arabic = read_paths("ar", [str(FIX / "rtl_arabic.txt")], 1)
    out = curate(tmp_path, src, arabic)
    assert out.text("rtl/mixed.txt") == mixed  # direction marks and embeddings kept as written
    removed = out.removal("ar/rtl_arabic.txt")
    assert (removed.rule, removed.detail) == ("langid.language", "language ar is not kept (en, zh)")


def test_emoji_kept_and_combining_marks_composed(tmp_path):
    out = curate(tmp_path, read_paths("emoji", [str(FIX / "emoji_combining.txt")], 1))
    kept = out.kept.set_index("doc_id").loc["emoji/emoji_combining.txt"]
    assert all(e in kept.text for e in ("🙂", "☀️", "🚣🏽", "👍"))
    assert "Llorenç" in kept.text and "naïve" in kept.text and "\u0327" not in kept.text  # NFC, explained in fixes
    assert "normalize:NFC" in kept.fixes


def test_parquet_without_the_text_column_or_not_parquet_at_all(tmp_path):
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"body": [RAIL]}), tmp_path / "pq" / "a.parquet")
    with pytest.raises(SourceError, match=r"a\.parquet: no column text_field='text'; it has \['body'\]"):
        read_small_source(SourceConfig(name="pq", kind="local", include=[str(tmp_path / "pq" / "*")]), tmp_path)
    (tmp_path / "pq" / "a.parquet").unlink()
    (tmp_path / "pq" / "b.parquet").write_bytes(b"PAR1 this is not a parquet file PAR1")
    src = read_paths("pq", [str(tmp_path / "pq" / "*")], 1)
    assert src.rejects.rule.tolist() == ["read.bad_parquet"] and src.rejects.detail.iloc[0].startswith("b.parquet: ")
    curate(tmp_path, src)


def test_warc_record_truncated_midway(tmp_path):
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    offsets = []
    for url, text in [("http://rail.example/", RAIL), ("http://pii.example/", PII), ("http://x.example/", GARDEN)]:
        offsets.append(buf.tell())
        body = f"<html><body><article><p>{text}</p></article></body></html>".encode()
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http))
    (tmp_path / "crawl.warc.gz").write_bytes(buf.getvalue()[: offsets[2] + 100])
    src = read_paths("cc", [str(tmp_path / "crawl.warc.gz")], 3)
    assert src.docs.url.tolist() == ["http://rail.example/", "http://pii.example/"]
    assert src.rejects.doc_id.tolist() == [f"cc/crawl.warc.gz@{offsets[2]}"]
    # warcio either stops at the short record or fails parsing it, depending on where the cut falls
    assert src.rejects.rule.iloc[0] in {"read.warc_truncated", "read.warc_broken"}
    assert src.rejects.detail.iloc[0].startswith(f"crawl.warc.gz: record at byte offset {offsets[2]:,} is truncated")
    out = curate(tmp_path, src)
    assert set(out.kept.doc_id) == {*src.docs.doc_id, "anchor/garden.txt"}


def test_compressed_files_damaged_mid_stream_are_one_reject_each_and_give_no_document(tmp_path):
    import bz2
    import gzip
    import json

    def flipped(data: bytes) -> bytes:  # 16 bytes inverted mid-stream: garbage decoded before a checksum fails
        mid = len(data) // 2
        return data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 16]) + data[mid + 16:]

    lines = "".join(json.dumps({"text": f"{t} ({i})"}) + "\n" for i in range(200) for t in (GARDEN, RAIL)).encode()
    src = read(tmp_path, "zipped", {"good.jsonl.gz": gzip.compress(json.dumps({"text": RAIL}).encode() + b"\n"),
                                    "damaged.jsonl.gz": flipped(gzip.compress(lines)),
                                    "damaged.txt.bz2": flipped(bz2.compress(PII.encode()))})
    assert src.docs.doc_id.tolist() == ["zipped/good.jsonl.gz#0"]
    assert src.rejects[["doc_id", "rule"]].values.tolist() == [["zipped/damaged.jsonl.gz", "read.bad_compression"],
                                                               ["zipped/damaged.txt.bz2", "read.bad_compression"]]
    assert src.rejects.detail.str.contains("none of the file is kept").all()
    out = curate(tmp_path, src)
    assert set(out.kept.doc_id) == {"zipped/good.jsonl.gz#0", "anchor/garden.txt"}
