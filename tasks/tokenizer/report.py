"""Tokenizer efficiency per language or source, and how terms fragment (docs/methods.md §8: TinyStories tokenizer reference 3.952 chars/token,
1.294 tokens/word).

Words are whitespace-separated for space-delimited languages; Chinese and Japanese do not delimit words with spaces,
so there a "word" is a non-space character and the row says ``word_unit="char"``.
"""

from collections.abc import Callable

import numpy as np
import pandas as pd
from tokenizers import Tokenizer

from infra.errors import ConfigError, DataError

CHAR_UNIT_LANGUAGES = frozenset({"zh", "ja"})
ENCODE_BATCH = 1024  # documents encoded per call by the reports (one progress step each)
GROUP_COLUMNS = ("language", "source")
COUNT_COLUMNS = ["language", "source", "unit", "n_docs", "n_chars", "n_bytes", "n_tokens", "n_words"]
REPORT_COLUMNS = ["group", "n_docs", "n_chars", "n_bytes", "n_tokens", "chars_per_token", "n_words",
                  "tokens_per_word", "word_unit"]


def tokenizer_report(tok: Tokenizer, docs: pd.DataFrame, *, by: str) -> pd.DataFrame:
    """One row per group of ``docs`` (columns text, language, source), sorted by group.

    Columns: group, n_docs, n_chars (Unicode code points), n_bytes (UTF-8), n_tokens (no EOS added; special-token
    strings count as plain text), chars_per_token, n_words, tokens_per_word, word_unit ("word", "char", or "mixed"
    when a source mixes both kinds of language). Ratios are NaN when the denominator is 0.

    Raises:
        ConfigError: ``by`` is not "language" or "source".
        DataError: docs lacks a required column.
    """
    if by not in GROUP_COLUMNS:
        raise ConfigError(f"by must be one of {GROUP_COLUMNS}, got {by!r}")
    missing = [c for c in ("text", *GROUP_COLUMNS) if c not in docs.columns]
    if missing:
        raise DataError(f"tokenizer_report needs columns text, language, source; missing {missing}")
    return _grouped_report(_per_doc_counts(tok, docs), docs, by)


def tokenizer_reports(tok: Tokenizer, docs: pd.DataFrame, bys: tuple[str, ...] = GROUP_COLUMNS,
                      advance: Callable[[int], None] = lambda n: None) -> pd.DataFrame:
    """:func:`tokenizer_report` for each grouping in ``bys``, concatenated with a ``group_by`` column; the documents
    are encoded once for all groupings, ``ENCODE_BATCH`` at a time, each batch counted by ``advance(n)``
    (progress over ``len(docs)`` documents)."""
    per_doc = _per_doc_counts(tok, docs, advance)
    return pd.concat([_grouped_report(per_doc, docs, by).assign(group_by=by) for by in bys], ignore_index=True)


def _grouped_report(per_doc: pd.DataFrame, docs: pd.DataFrame, by: str) -> pd.DataFrame:
    counts = per_doc.assign(n_docs=1, language=docs["language"].to_numpy(), source=docs["source"].to_numpy())
    return grouped_counts(counts, by)


def grouped_counts(counts: pd.DataFrame, by: str) -> pd.DataFrame:
    """:func:`tokenizer_report`'s rows from counts already summed over documents: one row per (language, source,
    unit) or finer, columns ``COUNT_COLUMNS`` (:func:`document_counts` gives them per part of a corpus)."""
    rows = [_group_row(group, g) for group, g in counts.groupby(counts[by].astype(str), sort=True)]
    return pd.DataFrame(rows, columns=REPORT_COLUMNS)


def split_reports(counts: pd.DataFrame, bys: tuple[str, ...] = GROUP_COLUMNS) -> pd.DataFrame:
    """The stage's ``report.parquet``: :func:`tokenizer_reports` of each split (column ``split``, in name order),
    from the summed counts of the encoded parts (``COUNT_COLUMNS`` plus ``split``), so no document is encoded
    twice."""
    frames = [pd.concat([grouped_counts(part, by).assign(group_by=by) for by in bys], ignore_index=True)
              .assign(split=split) for split, part in counts.groupby("split", sort=True)]
    return pd.concat(frames) if frames else pd.DataFrame(columns=[*REPORT_COLUMNS, "group_by", "split"])


def document_counts(texts: list[str], languages: list[str], sources: list[str], n_tokens: np.ndarray,
                    n_chars: np.ndarray | None = None, n_bytes: np.ndarray | None = None) -> pd.DataFrame:
    """Counts of documents summed per (language, source): ``COUNT_COLUMNS``; ``n_tokens`` per document without EOS
    (a shard's document length − 1), ``n_chars`` and ``n_bytes`` per document when already known."""
    units = [word_unit(lang) for lang in languages]
    frame = pd.DataFrame({
        "language": languages, "source": sources, "unit": units, "n_docs": 1,
        "n_chars": n_chars if n_chars is not None else [len(t) for t in texts],
        "n_bytes": n_bytes if n_bytes is not None else [len(t.encode("utf-8")) for t in texts],
        "n_tokens": np.asarray(n_tokens, dtype=np.int64),
        "n_words": [count_words(t, u) for t, u in zip(texts, units)],
    })
    return frame.groupby(["language", "source", "unit"], sort=True, as_index=False)[
        ["n_docs", "n_chars", "n_bytes", "n_tokens", "n_words"]].sum()[COUNT_COLUMNS]


def fragmentation(tok: Tokenizer, terms: list[str]) -> pd.DataFrame:
    """How each term splits: columns term, n_tokens, pieces (list of the text of each token; bytes that are only part
    of a multi-byte character are shown escaped, e.g. ``\\xe8\\xbd``, so a split inside a Chinese character is
    visible)."""
    plain = _plain(tok)
    rows = []
    for term in terms:
        ids = plain.encode(term, add_special_tokens=False).ids
        pieces = [_piece(plain, i) for i in ids]
        rows.append(dict(term=term, n_tokens=len(ids), pieces=pieces))
    return pd.DataFrame(rows, columns=["term", "n_tokens", "pieces"])


def _piece(tok: Tokenizer, token_id: int) -> str:
    """The text of one token: its bytes for a byte-level vocabulary entry, else the decoded token (a pretrained
    tokenizer's SentencePiece-style entries, such as "▁the")."""
    from tasks.tokenizer.fit import token_bytes

    try:
        return token_bytes(tok.id_to_token(token_id)).decode("utf-8", errors="backslashreplace")
    except KeyError:
        return tok.decode([token_id], skip_special_tokens=False)


def word_unit(language: str) -> str:
    """"char" for zh/ja (any region suffix, e.g. "zh-Hans"), else "word"."""
    base = str(language).lower().replace("_", "-").split("-")[0]
    return "char" if base in CHAR_UNIT_LANGUAGES else "word"


def count_words(text: str, unit: str) -> int:
    """Whitespace-separated words, or non-space characters when ``unit == "char"``."""
    if unit == "char":
        return sum(map(len, text.split()))  # the characters str.split() keeps are those not isspace()
    return len(text.split())


def _plain(tok: Tokenizer) -> Tokenizer:
    """A copy that encodes special-token strings as ordinary text, as shards do."""
    copy = Tokenizer.from_str(tok.to_str())
    copy.encode_special_tokens = True
    copy.no_truncation()  # a released tokenizer.json may carry them; reports count whole documents
    copy.no_padding()
    return copy


def _per_doc_counts(tok: Tokenizer, docs: pd.DataFrame,
                    advance: Callable[[int], None] = lambda n: None) -> pd.DataFrame:
    texts = docs["text"].astype(str).tolist()
    units = [word_unit(lang) for lang in docs["language"]]
    plain = _plain(tok)
    n_tokens: list[int] = []
    for start in range(0, len(texts), ENCODE_BATCH):
        batch = texts[start:start + ENCODE_BATCH]
        n_tokens += [len(e.ids) for e in plain.encode_batch(batch, add_special_tokens=False)]
        advance(len(batch))
    return pd.DataFrame({
        "n_chars": [len(t) for t in texts],
        "n_bytes": [len(t.encode("utf-8")) for t in texts],
        "n_tokens": n_tokens,
        "n_words": [count_words(t, u) for t, u in zip(texts, units)],
        "unit": units,
    }, index=docs.index)


def _group_row(group: str, g: pd.DataFrame) -> dict:
    n_chars, n_tokens, n_words = int(g["n_chars"].sum()), int(g["n_tokens"].sum()), int(g["n_words"].sum())
    units = set(g["unit"])
    return dict(group=group, n_docs=int(g["n_docs"].sum()), n_chars=n_chars, n_bytes=int(g["n_bytes"].sum()),
                n_tokens=n_tokens, chars_per_token=_ratio(n_chars, n_tokens), n_words=n_words,
                tokens_per_word=_ratio(n_tokens, n_words), word_unit=units.pop() if len(units) == 1 else "mixed")


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else np.nan
