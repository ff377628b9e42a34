"""Tokenizer stage: split held-out documents, fit BPE on the training split (or adopt the pretrained tokenizer of
``[tokenizer] pretrained``), pack token shards, report.

Training documents sharing a 13-gram with a held-out document of any source are removed before fitting
(``removals.parquet``, same columns as the corpus ledger, stage ``decontam_heldout``).

Outputs: ``tokenizer.json``, ``splits.parquet`` (doc_id, source, family_id, split),
``shards/<source>/<split>.{bin,json,idx.npy}``, ``shards.parquet`` (one header row per shard), ``report.parquet`` (chars/token and tokens/word by language and by
source, on each split: held-out rows measure text the tokenizer never saw), ``fragmentation.parquet`` (the
configured domain terms), ``packing.parquet`` (documents cut and padding under both packing policies at the
experiment's row lengths), ``tokenizer.meta.json`` (hash, EOS and pad ids, vocab sizes, the fit rule, weights,
roles, training characters and the characters drawn per source), ``sources.parquet`` (per source: documents,
bytes and tokens of each split, the fit sample's weight, characters drawn and share;
``tasks.tokenizer.composition.SOURCE_COLUMNS``).

The kept corpus is streamed part by part (``kept/part-NNNNN.parquet``); no step holds it whole:

1. split: one pass over the (source, family_id) columns (and the texts' lengths) counts documents per family and
   source, fixes the held-out families (``tasks.tokenizer.split``) and writes each part's labels, one byte per
   document, to the scratch folder;
2. decontamination: the held-out n-grams of each part, then the training documents of each part looked up in their
   merged index, each part a shard-map call on ``[tokenizer.execution]`` (``tasks.train.heldout_overlap``);
3. fit: the sample is decided from the training documents' lengths and read in one pass (``sample_plan``);
4. packing: each part encoded on the engine, the shards joined in corpus order, the efficiency report summed from
   the same encoding (``tasks.tokenizer.encode``).

Memory: one part at a time, the fit sample, the held-out n-gram index (16 bytes per distinct held-out n-gram) and
a few bytes per document (family keys, lengths, labels: kept in the scratch folder between passes).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from infra.errors import ConfigError, DataError
from infra.stage import StageContext
from tasks.readers import kept_files, manifest_hash
from tasks.tokenizer.composition import (RULE_DECLARED, RULE_GENERAL, RULE_GENERAL_DOMAIN, default_fit_weights,
                                         source_counts)
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.encode import HELDOUT, REMOVED, SPLITS, TRAIN, pack_parts
from tasks.tokenizer.fit import (drawn_texts, eos_id, fit_tokenizer, padded_vocab_size, sample_plan,
                                 tokenizer_hash)
from tasks.tokenizer.report import fragmentation, split_reports
from tasks.tokenizer.split import REQUIRED_COLUMNS, family_keys, heldout_families, labels, pair_counts
from tasks.train.heldout_overlap import (REMOVAL_COLUMNS, HeldoutGrams, decide, describe_all, index_part,
                                         lookup_part, merge_index_files, removal_rows)
from tasks.train.pretrained_tokenizer import files_digest, read_pretrained
from tasks.train.shards import vocab_span


@dataclass
class Kept:
    """The kept corpus as the stage streams it: its parts, the rows of each, and the per-document files the split
    pass writes to the scratch folder (``work``): labels (``encode.TRAIN``/``HELDOUT``/``REMOVED``), characters
    and source codes (into ``sources``)."""

    parts: list[Path]
    rows: list[int]
    work: Path
    sources: list[str]

    def file(self, kind: str, i: int) -> Path:
        return self.work / kind / f"part-{i:05d}.npy"

    def labels(self, i: int) -> np.ndarray:
        return np.load(self.file("labels", i))

    @property
    def label_files(self) -> list[Path]:
        return [self.file("labels", i) for i in range(len(self.parts))]

    @property
    def first_rows(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)

    def count(self, label: int) -> list[int]:
        return [int((self.labels(i) == label).sum()) for i in range(len(self.parts))]


def run(ctx: StageContext, cfg: TokenizerConfig, *, general: Sequence[str] | None = None,
        domain: Sequence[str] = ()) -> dict[str, Any]:
    """Split → fit on a mixture-weighted sample of train only (or adopt ``cfg.pretrained``) → pack every
    (source, split) → report.

    ``general`` (the general sources; None: every source) and ``domain`` (``[cpt] domain_sources``) set the fit
    sample's default weights (:func:`fit_weights`).

    Returns vocab and token counts. (How the shards are cut into rows depends on each model's row length, so the
    packing report is written by the training stages, see :func:`packing_report`.)

    Raises:
        ConfigError: ``fit_weights`` names a source with no training documents, no general source has training
            text, or ``fit_domain_share`` has no domain source to draw from; the pretrained tokenizer cannot be
            read or has no EOS.
        DataError: the kept parts lack doc_id, source or family_id, or a family_id is null.
    """
    parts = kept_files(ctx.inputs["corpus"])
    work = ctx.scratch / "stream"
    shutil.rmtree(work, ignore_errors=True)  # a killed attempt's files are never mixed into this one
    kept = Kept(parts, [pq.ParquetFile(p).metadata.num_rows for p in parts], work, [])
    with ctx.progress.task("tokenizer: held-out split (documents)", sum(kept.rows)) as advance:
        _split(kept, cfg, advance)
    if cfg.decontam_ngram:
        with ctx.progress.task(f"tokenizer: held-out decontamination, {cfg.decontam_ngram}-grams (documents)",
                               sum(kept.rows)) as advance:
            n_removed = _decontaminate(ctx, cfg, kept, ctx.out / "removals.parquet", advance)
    else:
        n_removed = 0
        pd.DataFrame(columns=REMOVAL_COLUMNS).to_parquet(ctx.out / "removals.parquet", index=False)
    _write_splits(kept, ctx.out / "splits.parquet")
    train_lengths = _train_lengths(kept)
    train_chars = {s: int(n.sum()) for s, n in sorted(train_lengths.items()) if len(n)}
    if cfg.pretrained:
        tok, meta = _adopt(ctx, cfg)
    else:
        tok, meta = _fit(ctx, cfg, kept, train_lengths, general=general, domain=domain)
    del train_lengths
    meta["manifest_hash"] = manifest_hash(ctx.inputs["corpus"])
    headers, counts = _pack(ctx, cfg, tok, kept, meta)
    (ctx.out / "tokenizer.meta.json").write_text(json.dumps(meta, indent=2))
    present = sorted(set(headers["source"])) if len(headers) else []
    sources = source_counts(headers, meta, roles=_roles(present, general), train_chars=train_chars)
    sources.to_parquet(ctx.out / "sources.parquet", index=False)
    split_reports(counts).to_parquet(ctx.out / "report.parquet", index=False)
    fragmentation(tok, cfg.domain_terms).to_parquet(ctx.out / "fragmentation.parquet", index=False)
    shutil.rmtree(work, ignore_errors=True)
    return {**{k: v for k, v in meta.items() if k not in ("fit_sample_chars", "fit_weights", "fit_roles",
                                                           "fit_train_chars")},
            "decontaminated_train_docs": n_removed,
            "tokens": {f"{r.source}/{r.split}": int(r.n_tokens) for r in headers.itertuples()}}


def _split(kept: Kept, cfg: TokenizerConfig, advance: Callable[[int], None]) -> None:
    """Pass 1: family keys, characters and source codes of every part; the held-out families; each part's labels."""
    for kind in ("keys", "chars", "sources", "labels"):
        (kept.work / kind).mkdir(parents=True, exist_ok=True)
    pairs, codes = [], {}
    for i, part in enumerate(kept.parts):
        names = pq.ParquetFile(part).schema_arrow.names
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise DataError(f"{part}: the held-out split needs columns {REQUIRED_COLUMNS}; missing {missing}")
        table = pq.read_table(part, columns=["source", "family_id", "text"])
        sources = table.column("source").to_pandas().astype(str)
        keys = family_keys(table.column("family_id").to_pandas(), cfg.seed)
        np.save(kept.file("keys", i), keys)
        np.save(kept.file("chars", i), pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False)
                .astype(np.int64))
        part_codes = np.array([codes.setdefault(s, len(codes)) for s in sources], np.int32)
        np.save(kept.file("sources", i), part_codes)
        pairs.append(pair_counts(part_codes, keys))
        if len(pairs) >= 16:  # bounded: the sums so far, plus a few parts
            pairs = [pair_counts(*(np.concatenate(column) for column in zip(*pairs)))]
        del table
        _release()
        advance(kept.rows[i])
    kept.sources = list(codes)
    pair_codes, pair_keys, pair_docs = (pair_counts(*(np.concatenate(column) for column in zip(*pairs))) if pairs
                                        else (np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64)))
    del pairs
    heldout = heldout_families(pd.DataFrame({
        "source": pd.Categorical.from_codes(pair_codes, categories=kept.sources), "key": pair_keys,
        "n_docs": pair_docs}), cfg)
    for i in range(len(kept.parts)):
        held = labels(np.load(kept.file("keys", i)), heldout)
        np.save(kept.file("labels", i), np.where(held, HELDOUT, TRAIN).astype(np.uint8))


def _release() -> None:
    """Give Arrow's freed memory back after a part (its allocator keeps it otherwise: resident memory would creep
    with the number of parts read)."""
    pa.default_memory_pool().release_unused()


def _sized(advance: Callable[[int], None], sizes: list[int]) -> Callable[[], None]:
    """An ``on_done`` for a shard map whose calls cover ``sizes`` documents each: the bar counts documents."""
    left = iter(sizes)
    return lambda: advance(next(left, 0))


def _decontaminate(ctx: StageContext, cfg: TokenizerConfig, kept: Kept, ledger: Path,
                   advance: Callable[[int], None]) -> int:
    """Pass 2: the held-out n-gram index (a call per part), the training documents looked up (a call per part),
    the removals decided from the hits of all parts: labelled ``REMOVED`` and written to ``ledger``. Returns how
    many training documents were removed."""
    for kind in ("heldout", "hits"):
        (kept.work / kind).mkdir(parents=True, exist_ok=True)
    first_rows = kept.first_rows
    calls = [dict(part_path=str(part), labels_path=str(kept.file("labels", i)),
                  out_path=str(kept.work / "heldout" / f"part-{i:05d}.npz"), ngram=cfg.decontam_ngram,
                  first_row=int(first_rows[i])) for i, part in enumerate(kept.parts)]
    shard_map = ctx.shard_map_for(cfg.execution, _sized(advance, kept.count(HELDOUT)))
    found = shard_map(index_part, calls, "tokenizer-heldout-index")
    merge_index_files([c["out_path"] for c in calls], [r["firsts"] for r in found], kept.work / "index")
    calls = [dict(part_path=str(part), labels_path=str(kept.file("labels", i)), index_dir=str(kept.work / "index"),
                  out_path=str(kept.work / "hits" / f"part-{i:05d}.npz"), common_min_docs=cfg.decontam_common_docs)
             for i, part in enumerate(kept.parts)]
    shard_map = ctx.shard_map_for(cfg.execution, _sized(advance, kept.count(TRAIN)))
    shard_map(lookup_part, calls, "tokenizer-heldout-lookup")
    index = HeldoutGrams.load(kept.work / "index", owners=True)
    docs_per_gram = np.zeros(len(index), dtype=np.int32)
    for call in calls:
        with np.load(call["out_path"]) as hits:
            docs_per_gram[hits["hit"]] += hits["n_docs"]
    decided = {}
    for i, call in enumerate(calls):
        with np.load(call["out_path"]) as hits:
            removed, n_shared, first = decide(hits["rows"], hits["grams"], docs_per_gram, cfg.decontam_common_docs)
        if len(removed):
            decided[i] = removed, n_shared, first
            part_labels = kept.labels(i)
            part_labels[removed] = REMOVED
            np.save(kept.file("labels", i), part_labels)
    shown = _describe(kept, index, np.unique(np.concatenate([d[2] for d in decided.values()]))) if decided else {}
    writer = None
    try:
        for i, (removed, n_shared, first) in decided.items():
            table = pq.read_table(kept.parts[i], columns=["doc_id", "source"]).take(removed)
            rows = removal_rows(table.column("doc_id").to_pylist(), table.column("source").to_pylist(), n_shared,
                                cfg.decontam_ngram, [shown[int(f)] for f in first])
            arrow = pa.Table.from_pandas(rows, preserve_index=False)
            writer = writer or pq.ParquetWriter(ledger, arrow.schema)
            writer.write_table(arrow)
            _release()
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pd.DataFrame(columns=REMOVAL_COLUMNS).to_parquet(ledger, index=False)
    return sum(len(d[0]) for d in decided.values())


def _describe(kept: Kept, index: HeldoutGrams, positions: np.ndarray) -> dict[int, tuple[str, Any]]:
    """n-gram position → (its words, the doc_id of the first held-out document holding it), reading only those
    documents."""
    owners = np.asarray(index.owners[positions])
    part_of = np.searchsorted(kept.first_rows, owners, side="right") - 1
    shown = {}
    for i in np.unique(part_of):
        mine = part_of == i
        rows = owners[mine] - kept.first_rows[i]
        table = pq.read_table(kept.parts[i], columns=["doc_id", "text"]).take(rows)
        words = describe_all(index, positions[mine], table.column("text").to_pylist())
        for position, text, doc_id in zip(positions[mine], words, table.column("doc_id").to_pylist()):
            shown[int(position)] = text, doc_id
        _release()
    return shown


def _write_splits(kept: Kept, path: Path) -> None:
    """``splits.parquet``: doc_id, source, family_id, split of every document not removed, in corpus order."""
    writer = None
    try:
        for i, part in enumerate(kept.parts):
            part_labels = kept.labels(i)
            rows = np.flatnonzero(part_labels != REMOVED)
            frame = pq.read_table(part, columns=["doc_id", "source", "family_id"]).take(rows).to_pandas()
            frame["split"] = np.array([SPLITS[TRAIN], SPLITS[HELDOUT]], dtype=object)[part_labels[rows]]
            arrow = pa.Table.from_pandas(frame, preserve_index=False)
            writer = writer or pq.ParquetWriter(path, arrow.schema)
            writer.write_table(arrow.cast(writer.schema))
            _release()
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pd.DataFrame(columns=["doc_id", "source", "family_id", "split"]).to_parquet(path, index=False)


def _train_lengths(kept: Kept) -> dict[str, np.ndarray]:
    """Characters of each training document (not removed), per source, in corpus order."""
    out: dict[str, list[np.ndarray]] = {}
    for i in range(len(kept.parts)):
        train = kept.labels(i) == TRAIN
        chars, codes = np.load(kept.file("chars", i))[train], np.load(kept.file("sources", i))[train]
        for code in np.unique(codes):
            out.setdefault(kept.sources[code], []).append(chars[codes == code])
    return {s: np.concatenate(chunks) for s, chunks in out.items()}


def _fit(ctx: StageContext, cfg: TokenizerConfig, kept: Kept, train_lengths: dict[str, np.ndarray], *,
         general: Sequence[str] | None, domain: Sequence[str]) -> tuple[Tokenizer, dict[str, Any]]:
    """Fit BPE on a mixture-weighted sample of the training split; writes ``tokenizer.json``."""
    train_chars = {name: int(n.sum()) for name, n in sorted(train_lengths.items()) if len(n)}
    weights = fit_weights(cfg, train_chars, general=general, domain=domain)
    draws, sample_chars = sample_plan(train_lengths, weights, cfg.sample_max_chars, cfg.seed)
    with ctx.progress.task("tokenizer: fitting BPE", None):
        sample = _read_sample(kept, draws)
        tok = fit_tokenizer(sample, cfg)
    tok.save(str(ctx.out / "tokenizer.json"))
    pad = tok.token_to_id("<|pad|>")
    return tok, {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": eos_id(tok), "pad_id": eos_id(tok) if pad is None else pad,
        "vocab_size": tok.get_vocab_size(), "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple),
        "fit_rule": fit_rule(cfg), "fit_weights": weights, "fit_sample_chars": sample_chars,
        "fit_sample_docs": len(sample), "fit_train_chars": dict(sorted(train_chars.items())),
        "fit_roles": _roles(train_chars, general),
    }


def _read_sample(kept: Kept, draws: dict) -> list[str]:
    """The fit sample: each source's drawn documents (``fit.sample_plan``), read part by part, in drawn order."""
    wanted: dict[int, list[tuple[str, np.ndarray, np.ndarray]]] = {}  # part → (source, rows, places)
    per_part = {s: np.zeros(len(kept.parts) + 1, np.int64) for s in draws}
    train_rows: dict[tuple[int, str], np.ndarray] = {}
    for i in range(len(kept.parts)):
        train = kept.labels(i) == TRAIN
        codes = np.load(kept.file("sources", i))
        for source in draws:
            rows = np.flatnonzero(train & (codes == kept.sources.index(source))) if source in kept.sources else \
                np.zeros(0, np.int64)
            train_rows[i, source] = rows
            per_part[source][i + 1] = per_part[source][i] + len(rows)
    for source, draw in draws.items():
        part_of = np.searchsorted(per_part[source], draw.docs, side="right") - 1
        for i in np.unique(part_of):
            mine = np.flatnonzero(part_of == i)
            rows = train_rows[int(i), source][draw.docs[mine] - per_part[source][i]]
            wanted.setdefault(int(i), []).append((source, rows, mine))
    texts: dict[str, list] = {s: [None] * len(d.docs) for s, d in draws.items()}
    for i in sorted(wanted):
        column = pq.read_table(kept.parts[i], columns=["text"]).column("text")
        for source, rows, places in wanted[i]:
            for place, text in zip(places, column.take(rows).to_pylist()):
                texts[source][place] = text
        del column
        _release()
    return [t for source, draw in draws.items() for t in drawn_texts(draw, texts[source])]


def _roles(sources, general: Sequence[str] | None) -> dict[str, str]:
    """Source → "general" or "domain" (every source is general when ``general`` is None)."""
    return {s: "general" if general is None or s in general else "domain" for s in sorted(sources)}


def _adopt(ctx: StageContext, cfg: TokenizerConfig) -> tuple[Tokenizer, dict[str, Any]]:
    """Adopt ``cfg.pretrained`` as it is (no fit): its ``tokenizer.json`` is copied byte for byte; the meta
    records where it came from, its files' SHA-256 and its EOS token.

    Raises:
        ConfigError: as :func:`tasks.train.pretrained_tokenizer.read_pretrained`.
    """
    pretrained = read_pretrained(cfg.pretrained)
    shutil.copyfile(pretrained.tokenizer_file, ctx.out / "tokenizer.json")
    tok = Tokenizer.from_file(str(ctx.out / "tokenizer.json"))
    return tok, {
        "tokenizer_hash": tokenizer_hash(tok), "eos_id": pretrained.eos_id, "pad_id": pretrained.pad_id,
        "vocab_size": pretrained.vocab_size, "padded_vocab_size": padded_vocab_size(tok, cfg.pad_multiple),
        "pretrained": {"path": str(Path(cfg.pretrained).resolve()), "eos_token": pretrained.eos_token,
                       "files": files_digest(cfg.pretrained)},
    }


def fit_rule(cfg: TokenizerConfig) -> str:
    """How the fit sample was weighed: ``declared`` (``fit_weights``), ``general_natural``, or
    ``general_natural+domain_share`` (``tasks.tokenizer.composition``)."""
    if cfg.fit_weights:
        return RULE_DECLARED
    return RULE_GENERAL_DOMAIN if cfg.fit_domain_share > 0 else RULE_GENERAL


def fit_weights(cfg: TokenizerConfig, train_chars: dict[str, int], *, general: Sequence[str] | None = None,
                domain: Sequence[str] = ()) -> dict[str, float]:
    """Weights of the fit sample, summing to 1: ``cfg.fit_weights`` normalised; when none are given, the general
    sources at their shares of the training characters, and ``cfg.fit_domain_share`` split equally among the
    ``domain`` sources (:func:`tasks.tokenizer.composition.default_fit_weights`; ``general`` None: every source
    is general, so the weights are the natural mixture of all sources).

    Raises:
        ConfigError: a weighted source has no training documents; no general source has training text.
    """
    if not cfg.fit_weights:
        return default_fit_weights(train_chars, general, domain, cfg.fit_domain_share)
    missing = sorted(s for s, w in cfg.fit_weights.items() if w > 0 and not train_chars.get(s))
    if missing:
        raise ConfigError(f"tokenizer.fit_weights names {missing}, which have no training documents; "
                          f"sources with training text: {sorted(train_chars)}")
    total = sum(cfg.fit_weights.values())
    return {s: w / total for s, w in sorted(cfg.fit_weights.items()) if w > 0}



def _pack(ctx: StageContext, cfg: TokenizerConfig, tok: Tokenizer, kept: Kept,
          meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Encode every kept part in calls of at most ``cfg.execution.part_docs`` documents where ``cfg.execution`` says,
    and join each (source, split) into its shard (``tasks.tokenizer.encode``); writes ``shards.parquet``. Returns
    the shard headers and the report counts."""
    calls = sum(-(-n // cfg.execution.part_docs) for n in kept.rows)
    groups = {(kept.sources[c], SPLITS[label]) for i in range(len(kept.parts))
              for c, label in set(zip(np.load(kept.file("sources", i)).tolist(), kept.labels(i).tolist()))
              if label != REMOVED}
    with ctx.progress.task("tokenizer: packing shards", calls + len(groups)) as advance:
        shard_map = ctx.shard_map_for(cfg.execution, lambda: advance(1))
        headers, counts = pack_parts(kept.parts, kept.label_files, kept.rows, tokenizer_path=ctx.out / "tokenizer.json",
                                     out=ctx.out, work=kept.work / "encode", part_docs=cfg.execution.part_docs,
                                     meta=meta, tokenizer_vocab=vocab_span(tok), shard_map=shard_map,
                                     advance=advance)
    headers.to_parquet(ctx.out / "shards.parquet", index=False)
    return headers, counts
