"""A synthetic crawl for the corpus build's scale benchmark: real text mutated into new documents, with declared
near- and exact-duplicate shares, written as Parquet in the raw-document schema the build reads.

    python benchmarks/crawl.py --docs 100000 --out /tmp/crawl-1e5          # generate and report

Text comes from :mod:`benchmarks.real_text` (the demo corpus when fetched, else the smoke fixtures), or from its
snapshot in a crawl folder (:func:`real_text`), so that a crawl folder's crawls are the same in every process and
checkout that uses it. Sources:
``web_<source>`` (HTML, one per HTML source of the real documents, pages of that source as templates) and
``text_<language>`` (plain text made of paragraphs: the real plain-text documents, e.g. fortunes, and the text blocks
of the HTML pages). Every generated document is one of three kinds, in the shares declared by ``CrawlSpec``:

* original: HTML: the page's head and tail around a window of its body cut at block-element openings (median
  ``html_median_bytes``); text: a run of consecutive paragraphs (median ``text_median_chars``). With probability
  ``splice_share`` the second half comes from another page or paragraph group of the same source (a splice); with
  probability ``shuffle_share`` the sentences of each long text node or paragraph are shuffled; then each word
  (Latin letters, 3 or more) or Han character of the visible text is replaced by a random one of the same kind with
  probability ``mutation_rate``, so two originals share few word 5-grams.
* near duplicate (``near_share``): a uniformly drawn earlier original of the same source (reservoir sampling,
  Vitter 1985, "Random Sampling with a Reservoir", algorithm R) with each word or Han character replaced with
  probability ``near_edit_rate`` (at least one). A replaced unit breaks the shingles that cover it, so at rate q
  about (1 − q)^5 of the 5-gram shingles survive and the Jaccard similarity is ≈ s / (2 − s) with s = (1 − q)^5:
  0.91 at q = 0.01, above the default threshold 0.8 (docs/methods.md §7). The share really above the threshold is
  measured on a sample, on the text the build shingles (main text of HTML extracted as the build does).
* exact duplicate (``exact_share``): an earlier original of the same source, byte for byte.

Counts are exact: after ``i`` documents, ``round(i · share)`` of each duplicate kind have been written (the kinds are
shuffled within each batch). Memory is bounded by ``batch_rows`` documents, the reservoir (``reservoir`` documents)
and the templates, whatever ``docs`` is. Files: ``docs/part-NNNNN.parquet`` (``file_docs`` documents each, row
groups of ``batch_rows``), ``labels.parquet`` (doc_id, kind, origin_id: the ground truth) and ``crawl.json`` (the
report, :func:`generate`).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import html
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: a project checkout put first (corpus_scale --code) stays first

from benchmarks.real_text import ORIGINS, real_documents  # noqa: E402

COLUMNS = ["doc_id", "source", "language_hint", "content", "content_type"]  # tasks.corpus.filters.INPUT_COLUMNS
KINDS = ("original", "near", "exact")
_TAG_RE = re.compile(r"(<[^>]*>)")
_UNIT_RE = re.compile(r"([A-Za-z]{3,}|[\u3400-\u4dbf\u4e00-\u9fff])")
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])|(?<=[。！？])")
_BLOCK_RE = re.compile(r"<(?:div|p|section|pre|ul|ol|dl|table|h[1-6]|blockquote)\b", re.I)
_SKIP_OPEN_RE = re.compile(r"<(script|style|head)\b", re.I)
_SKIP_CLOSE_RE = re.compile(r"</(script|style|head)\s*>", re.I)
_HAN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_BODY_RE = re.compile(r"<body\b[^>]*>(.*)</body", re.I | re.S)
_DROP_RE = re.compile(r"<(script|style)\b.*?</\1\s*>", re.I | re.S)
_BREAK_RE = re.compile(r"</?(?:p|div|li|h[1-6]|pre|tr|br|dd|dt|table|section|blockquote)\b[^>]*>", re.I)
_ANY_TAG_RE = re.compile(r"<[^>]*>")
_SEP = "\ue000"  # a private-use character: joins text pieces for one substitution pass


@dataclass(frozen=True)
class CrawlSpec:
    """What to generate. Shares are fractions of ``docs`` in [0, 1]; rates are per word or Han character."""

    docs: int
    seed: int = 0
    near_share: float = 0.30
    exact_share: float = 0.05
    html_share: float = 0.5
    mutation_rate: float = 0.25
    near_edit_rate: float = 0.01
    splice_share: float = 0.3
    shuffle_share: float = 0.5
    html_median_bytes: int = 16_000
    text_median_chars: int = 1_500
    batch_rows: int = 4096
    file_docs: int = 250_000
    reservoir: int = 2000
    verify_pairs: int = 200

    def check(self) -> None:
        """Raises ValueError on a count below 1 or a share or rate outside [0, 1] (shares summing above 1)."""
        if min(self.docs, self.batch_rows, self.file_docs, self.reservoir) < 1:
            raise ValueError("crawl docs, batch_rows, file_docs and reservoir must be >= 1")
        for name in ("near_share", "exact_share", "html_share", "mutation_rate", "near_edit_rate", "splice_share",
                     "shuffle_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"crawl {name}={getattr(self, name)} must lie in [0, 1]")
        if self.near_share + self.exact_share > 1.0:
            raise ValueError(f"crawl near_share + exact_share = {self.near_share + self.exact_share} exceeds 1")


@dataclass
class HtmlTemplate:
    """A page split at its tags: ``pieces`` alternate text (even indices) and tags (odd); ``body`` is the
    [start, end) piece range inside <body>; ``cuts`` the body pieces that open a block element; ``editable`` the
    text pieces of the body outside <script>/<style>; ``ends`` the cumulative length in characters after each
    piece."""

    pieces: list[str]
    body: tuple[int, int]
    cuts: list[int]
    editable: np.ndarray
    ends: np.ndarray


@dataclass
class TextPool:
    """The real text the crawl is made of: HTML templates per crawl source, paragraph groups per language, and the
    replacement vocabularies (Latin words, Han characters) of the substitutions."""

    origin: str
    html: dict[str, list[HtmlTemplate]]
    language: dict[str, str]
    text: dict[str, list[list[str]]]
    latin: list[str]
    han: list[str]
    digest: str = ""

    @property
    def sources(self) -> dict[str, str]:
        """crawl source → content type, in a fixed order."""
        return {**{s: "html" for s in self.html}, **{s: "text" for s in self.text}}


def parse_html(page: str) -> HtmlTemplate | None:
    """``page`` split for editing; None when it has no text in a <body>."""
    pieces = _TAG_RE.split(page)
    lo = next((i + 1 for i in range(1, len(pieces), 2) if pieces[i][:5].lower() == "<body"), 0)
    hi = next((i for i in range(len(pieces) - 2, lo, -2) if pieces[i][:6].lower() == "</body"), len(pieces))
    editable = np.zeros(len(pieces), dtype=bool)
    skipping = None
    for i in range(lo, hi):
        piece = pieces[i]
        if i % 2:
            if skipping is None and (m := _SKIP_OPEN_RE.match(piece)) and not piece.endswith("/>"):
                skipping = m.group(1).lower()
            elif skipping is not None and (m := _SKIP_CLOSE_RE.match(piece)) and m.group(1).lower() == skipping:
                skipping = None
        elif skipping is None and piece.strip():
            editable[i] = True
    if not editable.any():
        return None
    cuts = [i for i in range(lo, hi) if i % 2 and _BLOCK_RE.match(pieces[i])] or [lo]
    ends = np.cumsum([len(p) for p in pieces])
    return HtmlTemplate(pieces, (lo, hi), cuts, editable, ends)


def page_paragraphs(page: str, min_chars: int = 40) -> list[str]:
    """The text blocks of an HTML page's body (script and style dropped, block elements as breaks, entities
    unescaped, whitespace collapsed) with at least ``min_chars`` characters. Deliberately simple and independent
    of the project's extractor, so the crawl is the same whichever checkout is measured."""
    body = _BODY_RE.search(page)
    text = _DROP_RE.sub(" ", body.group(1) if body else page)
    text = _BREAK_RE.sub("\n", text)
    text = html.unescape(_ANY_TAG_RE.sub(" ", text))
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return [line for line in lines if len(line) >= min_chars]


TEXT_COLUMNS = ["source", "content_type", "language_hint", "content"]  # what the pool is made of


def real_text(origin: str = "auto", runs_dir: Path = Path("runs"), snapshot_dir: Path | None = None):
    """(documents with ``TEXT_COLUMNS``, the origin used): the real documents of ``origin``
    (``real_text.real_documents``), or their snapshot in ``snapshot_dir``.

    With ``snapshot_dir``, the documents are read from ``text-<origin>.parquet`` there when it exists, else read from
    the sources and written there first, so every later process, from any checkout and any working directory, makes
    its pool from the same text: the sources themselves can change under a crawl folder (a Debian package resolved
    to a newer version once the apt lists move, another checkout's configs, readers or runs folder, ``auto``
    finding the demo packages in one runs folder and not in another). ``auto`` takes a demo snapshot when there is
    one, else the demo packages when fetched, else a fixtures snapshot, else the fixtures.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.real_text import demo_fetched

    if snapshot_dir is None:
        docs, used = real_documents(origin, Path(runs_dir))
        return docs[TEXT_COLUMNS].reset_index(drop=True), used
    if origin not in ORIGINS:
        raise ValueError(f"text origin {origin!r}: use one of {', '.join(ORIGINS)}")
    path = {name: Path(snapshot_dir) / f"text-{name}.parquet" for name in ("demo", "fixtures")}
    if origin == "auto":
        origin = "demo" if path["demo"].exists() or demo_fetched(Path(runs_dir)) else "fixtures"
    if path[origin].exists():
        table = pq.read_table(path[origin])
        docs = table.drop_columns(["content"]).to_pandas()
        # Stored as UTF-8 bytes with surrogates passed through: a page may hold a lone surrogate.
        docs["content"] = [c.decode("utf-8", "surrogatepass") for c in table.column("content").to_pylist()]
        return docs[TEXT_COLUMNS], origin
    docs, used = real_documents(origin, Path(runs_dir))
    docs = docs[TEXT_COLUMNS].reset_index(drop=True)
    table = pa.table({"source": pa.array(docs.source.astype(str).tolist(), pa.string()),
                      "content_type": pa.array(docs.content_type.astype(str).tolist(), pa.string()),
                      "language_hint": pa.array([h if isinstance(h, str) else None for h in docs.language_hint],
                                                pa.string()),
                      "content": pa.array([c.encode("utf-8", "surrogatepass") for c in docs.content], pa.binary())})
    Path(snapshot_dir).mkdir(parents=True, exist_ok=True)
    tmp = path[used].with_name(f".{path[used].name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path[used])  # complete or absent: a concurrent writer of the same text is harmless
    return docs, used


def load_pool(origin: str = "auto", runs_dir: Path = Path("runs"), max_templates: int = 200,
              snapshot_dir: Path | None = None) -> TextPool:
    """Read the real documents (:func:`real_text`, from the snapshot in ``snapshot_dir`` when given) and cut them
    into templates and paragraph groups; at most ``max_templates`` pages per HTML source (evenly spaced in reading
    order). The pool's ``digest`` covers everything the generator draws from: the sources in order with their
    content type and language, the templates, the paragraph groups and both replacement vocabularies."""
    docs, used = real_text(origin, Path(runs_dir), snapshot_dir)
    web: dict[str, list[HtmlTemplate]] = {}
    language: dict[str, str] = {}
    paragraphs: dict[str, list[list[str]]] = {}
    pages = docs[docs.content_type == "html"]
    for source, group in pages.groupby("source", sort=True):
        lang = str(group.language_hint.mode().iat[0]) if group.language_hint.notna().any() else "en"
        contents = group.content.tolist()
        contents = contents[::max(1, len(contents) // max_templates)][:max_templates]
        templates = [t for t in map(parse_html, contents) if t is not None]
        if templates:
            web[f"web_{source}"] = templates
            language[f"web_{source}"] = lang
        for page in contents:
            lines = page_paragraphs(page)
            if lines:
                paragraphs.setdefault(lang, []).append(lines)
    plain = docs[docs.content_type != "html"]
    for (lang, _), group in plain.groupby([plain.language_hint.fillna("en"), "source"], sort=True):
        entries = [e.strip() for e in group.content if isinstance(e, str) and e.strip()]
        for start in range(0, len(entries), 40):
            paragraphs.setdefault(str(lang), []).append(entries[start:start + 40])
    text = {f"text_{lang}": groups for lang, groups in sorted(paragraphs.items())}
    language.update({f"text_{lang}": lang for lang in paragraphs})
    words: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    for groups in paragraphs.values():
        for group in groups:
            for para in group:
                words.update(w.lower() for w in _UNIT_RE.findall(para) if len(w) > 1 and len(w) <= 12)
                chars.update(_HAN_RE.findall(para))
    latin = sorted(w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:20000])
    han = sorted(c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:3000])
    if not web and not text:
        raise ValueError(f"no usable text in the {used} documents")
    pool = TextPool(used, web, language, text, latin or ["word"], han or ["字"])
    pool.digest = pool_digest(pool)
    return pool


def pool_digest(pool: TextPool) -> str:
    """16 hex digits of SHA-256 over what the generator draws from ``pool`` (sources in their order with content
    type and language, templates, paragraph groups, vocabularies), each field length-prefixed."""
    digest = hashlib.sha256()

    def put(value: str) -> None:
        data = value.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    for name, content_type in pool.sources.items():
        for value in (name, content_type, pool.language[name]):
            put(value)
    for name, templates in pool.html.items():
        put(name)
        for t in templates:
            put("".join(t.pieces))
    for name, groups in pool.text.items():
        put(name)
        for group in groups:
            put("\n".join(group))
    for vocab in (pool.latin, pool.han):
        put("\n".join(vocab))
    return digest.hexdigest()[:16]


class _Mutator:
    """The random edits, from one seeded generator (numpy's PCG64), so a seed fixes every document."""

    def __init__(self, rng: np.random.Generator, pool: TextPool):
        self.rng, self.latin, self.han = rng, pool.latin, pool.han

    def substitute(self, text: str, rate: float) -> tuple[str, int]:
        """``text`` with each unit replaced by a different one of its kind with probability ``rate``; returns the
        text and the number of units replaced."""
        parts = _UNIT_RE.split(text)
        n = len(parts) // 2
        if not n or rate <= 0:
            return text, 0
        chosen = np.flatnonzero(self.rng.random(n) < rate)
        if not len(chosen):
            return text, 0
        latin = self.rng.integers(len(self.latin), size=len(chosen)).tolist()
        han = self.rng.integers(len(self.han), size=len(chosen)).tolist()
        for u, a, b in zip(chosen.tolist(), latin, han):
            unit = parts[2 * u + 1]
            parts[2 * u + 1] = self._pick(unit, a, b)
        return "".join(parts), len(chosen)

    def substitute_pieces(self, pieces: list[str], rate: float) -> tuple[list[str], int]:
        """``substitute`` over several text pieces at once (one split and one draw for all of them)."""
        if not pieces or any(_SEP in p for p in pieces):
            done = [self.substitute(p, rate) for p in pieces]
            return [p for p, _ in done], sum(k for _, k in done)
        text, k = self.substitute(_SEP.join(pieces), rate)
        return text.split(_SEP), k

    def _pick(self, unit: str, a: int, b: int) -> str:
        """The a-th Latin word or b-th Han character, the next one when that equals ``unit``; capitalised like
        ``unit``."""
        vocab, i = (self.latin, a) if unit.isascii() else (self.han, b)
        new = vocab[i]
        if new == unit.lower():
            new = vocab[(i + 1) % len(vocab)] if len(vocab) > 1 else unit + unit[-1]
        return new.capitalize() if unit[:1].isupper() else new

    def _other(self, unit: str) -> str:
        return self._pick(unit, int(self.rng.integers(len(self.latin))), int(self.rng.integers(len(self.han))))

    def replace_one(self, text: str) -> str:
        """``text`` with one random unit replaced (a word appended when it has none)."""
        parts = _UNIT_RE.split(text)
        if len(parts) < 2:
            return text + " " + self._other("word")
        u = 2 * int(self.rng.integers(len(parts) // 2)) + 1
        parts[u] = self._other(parts[u])
        return "".join(parts)

    def shuffle(self, text: str) -> str:
        """Sentences of ``text`` in a random order (unchanged when it has fewer than three)."""
        sentences = [s for s in _SENTENCE_RE.split(text) if s]
        if len(sentences) < 3:
            return text
        order = self.rng.permutation(len(sentences)).tolist()
        joiner = " " if text.isascii() else ""
        return joiner.join(sentences[i] for i in order)

    def lognormal(self, median: float, lo: float, hi: float, sigma: float = 0.6) -> float:
        return float(min(hi, max(lo, median * np.exp(sigma * self.rng.standard_normal()))))


def _window(t: HtmlTemplate, target: float, rng: np.random.Generator) -> list[int]:
    """Body piece indices of a window of about ``target`` characters starting at a block opening."""
    lo, hi = t.body
    start_at = float(t.ends[lo - 1]) if lo else 0.0
    if float(t.ends[hi - 1]) - start_at <= target:
        return list(range(lo, hi))
    last_start = float(t.ends[hi - 1]) - target
    starts = [c for c in t.cuts if float(t.ends[c - 1]) <= last_start] or [t.cuts[0]]
    a = starts[int(rng.integers(len(starts)))]
    stop_at = float(t.ends[a - 1]) + target
    b = t.cuts[min(bisect.bisect_left([float(t.ends[c - 1]) for c in t.cuts], stop_at), len(t.cuts) - 1)]
    b = hi if b <= a else b
    return list(range(a, b))


def _html_original(source: str, pool: TextPool, spec: CrawlSpec, m: _Mutator) -> str:
    templates = pool.html[source]
    t = templates[int(m.rng.integers(len(templates)))]
    target = m.lognormal(spec.html_median_bytes, 2_000, 200_000)
    if len(templates) > 1 and m.rng.random() < spec.splice_share:
        other = templates[int(m.rng.integers(len(templates)))]
        first, second = _window(t, target / 2, m.rng), _window(other, target / 2, m.rng)
        body = [(t, i) for i in first[:max(1, len(first) // 2)]] + [(other, i) for i in second[len(second) // 2:]]
    else:
        body = [(t, i) for i in _window(t, target, m.rng)]
    lo, hi = t.body
    shuffle = m.rng.random() < spec.shuffle_share
    out = t.pieces[:lo]
    editable = []
    for tpl, i in body:
        piece = tpl.pieces[i]
        if tpl.editable[i]:
            editable.append(len(out))
            if shuffle and len(piece) > 200:
                piece = m.shuffle(piece)
        out.append(piece)
    for j, piece in zip(editable, m.substitute_pieces([out[j] for j in editable], spec.mutation_rate)[0]):
        out[j] = piece
    out += t.pieces[hi:]
    return "".join(out)


def _text_original(source: str, pool: TextPool, spec: CrawlSpec, m: _Mutator) -> str:
    groups = pool.text[source]
    target = m.lognormal(spec.text_median_chars, 300, 20_000, sigma=0.7)
    spliced = len(groups) > 1 and m.rng.random() < spec.splice_share
    paras: list[str] = []
    for part, want in ((0, target / 2), (1, target / 2)) if spliced else ((0, target),):
        group = groups[int(m.rng.integers(len(groups)))]
        i, got = int(m.rng.integers(len(group))), 0
        while got < want:
            paras.append(group[i % len(group)])
            got, i = got + len(paras[-1]), i + 1
            if i % len(group) == 0:  # the group ran out: continue in another one
                group = groups[int(m.rng.integers(len(groups)))]
    shuffle = m.rng.random() < spec.shuffle_share
    out = []
    for para in paras:
        if shuffle and len(para) > 200:
            para = m.shuffle(para)
        out.append(m.substitute(para, spec.mutation_rate)[0])
    return "\n\n".join(out)


def near_copy(content: str, content_type: str, rate: float, m: _Mutator) -> str:
    """``content`` with each word or Han character of its visible text replaced with probability ``rate``, at
    least one (in HTML only body text outside <script>/<style> is edited)."""
    if content_type != "html":
        new, k = m.substitute(content, rate)
        return new if k else m.replace_one(content)
    t = parse_html(content)
    if t is None:
        return m.replace_one(content)
    pieces = list(t.pieces)
    editable = np.flatnonzero(t.editable).tolist()
    edited, changed = m.substitute_pieces([pieces[i] for i in editable], rate)
    for i, piece in zip(editable, edited):
        pieces[i] = piece
    if not changed:
        with_units = [i for i in editable if _UNIT_RE.search(pieces[i])] or editable
        i = with_units[int(m.rng.integers(len(with_units)))]
        pieces[i] = m.replace_one(pieces[i])
    return "".join(pieces)


@dataclass
class _Reservoir:
    """A uniform sample of at most ``size`` earlier originals of one source (algorithm R)."""

    size: int
    items: list[tuple] = field(default_factory=list)
    seen: int = 0

    def offer(self, item: tuple, rng: np.random.Generator) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(item)
        else:
            j = int(rng.integers(self.seen))
            if j < self.size:
                self.items[j] = item


def _kinds(start: int, stop: int, spec: CrawlSpec, rng: np.random.Generator) -> list[str]:
    """Kinds of documents ``start``..``stop - 1``: cumulative counts round(i · share), shuffled in the batch."""
    near = round(stop * spec.near_share) - round(start * spec.near_share)
    exact = round(stop * spec.exact_share) - round(start * spec.exact_share)
    kinds = ["near"] * near + ["exact"] * exact + ["original"] * (stop - start - near - exact)
    return [kinds[i] for i in rng.permutation(len(kinds)).tolist()]


def generate(spec: CrawlSpec, pool: TextPool, out: Path, corpus=None) -> dict:
    """Write the crawl into ``out`` (replacing it) and return its report (also written to ``out/crawl.json``).

    ``corpus``: the ``CorpusConfig`` whose near-dedup shingle size and threshold (and HTML extractor, where it
    has one) the sample is measured with (the project's default when None). The report holds ``docs``,
    ``content_bytes`` (UTF-8 bytes of ``content``), ``file_bytes``, per-source and per-type counts and bytes,
    ``written`` counts per kind, the ``declared`` shares and the ``measured`` ones (see :func:`measure`),
    ``seconds`` and the generator's docs/s.

    Raises:
        ValueError: the spec is invalid (``CrawlSpec.check``).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.corpus.config import CorpusConfig

    spec.check()
    corpus = corpus or CorpusConfig()
    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    (out / "docs").mkdir(parents=True)
    rng = np.random.default_rng(spec.seed)
    m = _Mutator(rng, pool)
    sources = pool.sources
    by_type = {kind: [s for s, t in sources.items() if t == kind] for kind in ("html", "text")}
    p_html = spec.html_share
    for kind, needed in (("html", p_html > 0), ("text", p_html < 1)):
        if needed and not by_type[kind]:
            raise ValueError(f"html_share={p_html} needs {kind} documents, and the {pool.origin} text has none")
    reservoirs = {s: _Reservoir(max(2, spec.reservoir // len(sources))) for s in sources}
    near_sample = _Reservoir(spec.verify_pairs)  # (origin, near copy, content type, language)
    schema = pa.schema([(c, pa.string()) for c in COLUMNS])
    label_schema = pa.schema([("doc_id", pa.string()), ("kind", pa.string()), ("origin_id", pa.string())])
    labels = pq.ParquetWriter(out / "labels.parquet", label_schema)
    writer, n_files, in_file = None, 0, 0
    counts = {k: 0 for k in KINDS}
    per_source = {s: {"docs": 0, "bytes": 0} for s in sources}
    owed: list[str] = []  # duplicate kinds drawn before their source had an original
    for start in range(0, spec.docs, spec.batch_rows):
        stop = min(spec.docs, start + spec.batch_rows)
        rows: dict[str, list[str]] = {c: [] for c in COLUMNS}
        label_rows: dict[str, list[str]] = {"doc_id": [], "kind": [], "origin_id": []}
        for i, kind in zip(range(start, stop), _kinds(start, stop, spec, rng)):
            ctype = "html" if rng.random() < p_html else "text"
            source = by_type[ctype][int(rng.integers(len(by_type[ctype])))]
            reservoir = reservoirs[source]
            if kind != "original" and not reservoir.items:
                owed.append(kind)
                kind = "original"
            elif kind == "original" and owed and reservoir.items:
                kind = owed.pop()
            doc_id, origin_id = f"{source}/{i:09d}", ""
            if kind == "original":
                content = (_html_original if ctype == "html" else _text_original)(source, pool, spec, m)
                reservoir.offer((doc_id, content), rng)
            else:
                origin_id, origin = reservoir.items[int(rng.integers(len(reservoir.items)))]
                content = origin if kind == "exact" else near_copy(origin, ctype, spec.near_edit_rate, m)
                if kind == "near":
                    near_sample.offer((origin, content, ctype, pool.language[source]), rng)
            counts[kind] += 1
            per_source[source]["docs"] += 1
            per_source[source]["bytes"] += len(content.encode("utf-8", "surrogatepass"))
            for col, value in zip(COLUMNS, (doc_id, source, pool.language[source], content, ctype)):
                rows[col].append(value)
            for col, value in zip(label_rows, (doc_id, kind, origin_id)):
                label_rows[col].append(value)
        if writer is None:
            writer = pq.ParquetWriter(out / "docs" / f"part-{n_files:05d}.parquet", schema)
        writer.write_table(pa.table(rows, schema=schema), row_group_size=spec.batch_rows)
        labels.write_table(pa.table(label_rows, schema=label_schema))
        in_file += stop - start
        if in_file >= spec.file_docs:
            writer.close()
            writer, n_files, in_file = None, n_files + 1, 0
        del rows, label_rows
    if writer is not None:
        writer.close()
    labels.close()
    seconds = time.perf_counter() - started
    files = sorted((out / "docs").glob("*.parquet"))
    unrelated = _unrelated_pairs(reservoirs, spec.verify_pairs, rng, pool)
    report = {
        "origin": pool.origin, "pool_digest": pool.digest, "spec": asdict(spec), "docs": spec.docs,
        "files": len(files), "content_bytes": sum(v["bytes"] for v in per_source.values()),
        "file_bytes": sum(f.stat().st_size for f in files),
        "sources": {s: {**v, "content_type": sources[s], "language": pool.language[s]}
                    for s, v in per_source.items()},
        "by_type": {t: {"docs": sum(per_source[s]["docs"] for s in ss),
                        "bytes": sum(per_source[s]["bytes"] for s in ss)} for t, ss in by_type.items()},
        "written": counts, "owed_unpaid": len(owed),
        "declared": {"near_share": spec.near_share, "exact_share": spec.exact_share},
        "seconds": seconds, "docs_per_s": spec.docs / seconds if seconds else float("nan"),
    }
    report["measured"] = measure(files, near_sample.items, unrelated, corpus, counts["near"] / spec.docs)
    (out / "crawl.json").write_text(json.dumps(report, indent=2))
    return report


def _unrelated_pairs(reservoirs: dict[str, _Reservoir], n: int, rng: np.random.Generator, pool: TextPool):
    """Up to ``n`` pairs of distinct originals of the same source, drawn from the reservoirs."""
    names = [s for s, r in reservoirs.items() if len(r.items) >= 2]
    if not names:
        return []
    weights = np.array([len(reservoirs[s].items) for s in names], dtype=float)
    pairs = []
    for _ in range(n):
        s = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        a, b = rng.choice(len(reservoirs[s].items), size=2, replace=False).tolist()
        pairs.append((reservoirs[s].items[a][1], reservoirs[s].items[b][1], pool.sources[s], pool.language[s]))
    return pairs


def visible_text(content: str, content_type: str, extractor: str | None = None) -> str | None:
    """The text the build shingles, before its boilerplate cut: the main text of HTML (``extractor`` of
    ``tasks.corpus.extract``, its default when None; None when there is none), tidied."""
    from tasks.corpus.extract import extract_html, tidy

    if content_type == "html":
        text = extract_html(content) if extractor is None else extract_html(content, extractor)
    else:
        text = content
    return tidy(text) if isinstance(text, str) else None


def pair_jaccards(pairs, corpus) -> tuple[list[float], int]:
    """Jaccard of the ``corpus.near_dedup.shingle_size``-gram shingle sets of each (content_a, content_b,
    content_type, language) pair's visible text, with character shingles for character languages; returns the
    values and the number of pairs skipped because a side had no main text."""
    from tasks.corpus.minhash import jaccard, shingles
    from tasks.corpus.quality import CHARACTER_LANGUAGES

    near_dedup, extractor = corpus.near_dedup, getattr(corpus, "extractor", None)
    values, skipped = [], 0
    for a, b, ctype, lang in pairs:
        ta, tb = visible_text(a, ctype, extractor), visible_text(b, ctype, extractor)
        if ta is None or tb is None:
            skipped += 1
            continue
        by_chars = lang in CHARACTER_LANGUAGES
        values.append(jaccard(shingles(ta, near_dedup.shingle_size, by_chars),
                              shingles(tb, near_dedup.shingle_size, by_chars)))
    return values, skipped


def measure(files: list[Path], near_pairs, unrelated_pairs, corpus, near_written_share: float) -> dict:
    """The shares as the build would see them.

    ``exact_share``: (rows − distinct contents) / rows over the written files (DuckDB, out of core, 64-bit hashes).
    ``near_share``: the written near share × the fraction of sampled (origin, near copy) pairs whose Jaccard on the
    visible text is at or above ``near_dedup.jaccard_threshold``, with a 95% Wilson interval (Wilson 1927) of that
    fraction; ``identical_after_extraction``: sampled pairs with Jaccard 1 (the build's exact dedup takes them).
    ``unrelated_above_threshold``: the fraction of sampled pairs of distinct originals of one source at or above
    the threshold (accidental near duplicates; should be 0).
    """
    import duckdb

    with duckdb.connect(config={"threads": 1, "memory_limit": "256MB"}) as con:  # streamed, bounded
        n, distinct = con.execute("SELECT count(*), count(DISTINCT hash(content)) FROM read_parquet(?)",
                                  [[str(f) for f in files]]).fetchone()
    thr = corpus.near_dedup.jaccard_threshold
    near, near_skipped = pair_jaccards(near_pairs, corpus)
    other, other_skipped = pair_jaccards(unrelated_pairs, corpus)
    above = sum(v >= thr for v in near)
    frac = above / len(near) if near else float("nan")
    lo, hi = _wilson(above, len(near))

    def quantiles(v: list[float]) -> dict[str, float]:
        if not v:
            return {}
        q = np.quantile(v, [0.0, 0.05, 0.5, 0.95, 1.0])
        return dict(zip(("min", "p5", "median", "p95", "max"), map(float, q)))

    return {
        "threshold": thr, "shingle_size": corpus.near_dedup.shingle_size,
        "extractor": getattr(corpus, "extractor", "trafilatura"),
        "exact_share": (n - distinct) / n if n else 0.0,
        "near_pairs": len(near), "near_pairs_skipped": near_skipped, "near_above_threshold": frac,
        "near_above_threshold_95ci": [lo, hi], "near_share": near_written_share * frac if near else float("nan"),
        "identical_after_extraction": sum(v >= 1.0 for v in near) / len(near) if near else float("nan"),
        "near_jaccard": quantiles(near),
        "unrelated_pairs": len(other), "unrelated_pairs_skipped": other_skipped,
        "unrelated_above_threshold": sum(v >= thr for v in other) / len(other) if other else float("nan"),
        "unrelated_jaccard": quantiles(other),
    }


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (Wilson 1927, "Probable inference, the law of
    succession, and statistical inference")."""
    if not n:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def ensure(spec: CrawlSpec, pool: TextPool, out: Path, corpus=None) -> dict:
    """The crawl in ``out``: reused when its ``crawl.json`` names the same spec, text and measuring config, else
    generated (``generate``)."""
    from tasks.corpus.config import CorpusConfig

    corpus = corpus or CorpusConfig()
    wanted = {"threshold": corpus.near_dedup.jaccard_threshold, "shingle_size": corpus.near_dedup.shingle_size,
              "extractor": getattr(corpus, "extractor", "trafilatura")}
    report_path = out / "crawl.json"
    if report_path.exists():
        report = json.loads(report_path.read_text())
        measured = {k: report.get("measured", {}).get(k) for k in wanted}
        if report.get("spec") == asdict(spec) and report.get("pool_digest") == pool.digest and measured == wanted:
            return report
    return generate(spec, pool, out, corpus)


def doc_files(out: Path) -> list[Path]:
    """The crawl's document files, in corpus order."""
    return sorted((out / "docs").glob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", choices=ORIGINS, default="auto", help="real text: demo corpus or smoke fixtures")
    parser.add_argument("--runs-dir", type=Path, default=Path(os.environ.get("PRETRAIN_RUNS_DIR", "runs")))
    parser.add_argument("--near-share", type=float, default=CrawlSpec.near_share)
    parser.add_argument("--exact-share", type=float, default=CrawlSpec.exact_share)
    parser.add_argument("--html-share", type=float, default=CrawlSpec.html_share)
    parser.add_argument("--text-snapshot", type=Path, default=None,
                        help="folder of the real text's snapshot: written on first use, read afterwards")
    args = parser.parse_args()
    pool = load_pool(args.text, args.runs_dir, snapshot_dir=args.text_snapshot)
    spec = CrawlSpec(docs=args.docs, seed=args.seed, near_share=args.near_share, exact_share=args.exact_share,
                     html_share=args.html_share)
    print(json.dumps(generate(spec, pool, args.out), indent=2))


if __name__ == "__main__":
    main()
