"""Quality-classifier ablation: does the classifier help the model? (docs/methods.md §7, "Does it help?").

The same proxy (``[proxy]`` shape, budget, LR; ``[packing]``; the experiment seed) is trained twice on the general
sources at the same per-source weights (their natural token shares with the classifier on):

- ``with_classifier``: the tokenizer's training shards, the corpus as built;
- ``without_classifier``: the same shards with the documents the classifier removed put back
  (``quality_removed.parquet`` of the corpus), encoded with the same tokenizer and appended to their source's
  training shard. They pass the held-out decontamination first (a removed document sharing a 13-gram with a
  held-out document is left out, as the tokenizer does for the kept ones); they never joined the near-dedup
  (the classifier acts before it), so near copies among them stay.

Each arm trains at ``ablate_seeds`` seeds (the experiment seed, +1, …), paired: both arms of a seed share it.
Both are scored on the same held-out windows of every source; the difference of bits per byte,
Δ = bpb(without) − bpb(with), averaged over seeds, gets a t interval whose variance adds the training seeds' and
the held-out documents' parts (``evals.stats.seed_cluster_mean_ci``): putting back a few documents changes the
data order, and that training noise alone moves a proxy's loss. The verdict per source: ``helped`` when the
interval lies above 0 (the corpus with the classifier gives the lower loss), ``hurt`` when it lies below 0, else
``undetermined`` (also below ``MIN_UNITS``: fewer than 3 seeds or 5 held-out documents, where the interval's
coverage is not assured, docs/methods.md §16; the row's ``reason`` says which);
``unchanged`` when nothing was put back, or the two arms' losses are bit-identical (the proxy never drew the
re-added rows).

The overall row is also the stage's decision record (``evals.decision``, kind ``quality_ablation``, docs/methods.md
§14): declared before the first arm trains, ``decided`` when the overall verdict is ``helped`` or ``hurt``, else
``undetermined`` with what would settle it. The corpus goes on as built either way: the ablation informs, it does
not switch the classifier off.

Outputs: ``ablation.parquet`` (``ABLATION_COLUMNS``, one row per source), ``windows.parquet`` (the paired window
losses behind it), ``ablation.json`` (arms, weights, budget, decontamination counts, verdicts, overall row, the
decision record under ``"decision"``) and ``ablation.png``. Not requested (``ablate = false`` or no classifier): ``ablation.json`` with ``requested: false``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from evals.decision import DecisionRecord
from evals.heldout import heldout_loss, window_documents
from evals.stats import MIN_UNITS, SeedClusterCI, has_width, seed_cluster_mean_ci, units_shortfall
from infra.atomic import atomic_file
from infra.errors import DataError
from infra.stage import StageContext
from tasks.train.corpus import TokenizedCorpus
from tasks.train.data import MixtureSampler, TokenStream
from tasks.train.heldout_overlap import decontaminate_train
from tasks.train.runner import build_model, run_training
from tasks.train.shards import encode_documents, join_shards, read_shard, text_bytes, write_shard
from tasks.readers import kept_files

ARMS = ("with_classifier", "without_classifier")
ABLATION_COLUMNS = ["source", "role", "in_training", "weight", "removed_docs", "readded_docs", "readded_tokens",
                    "heldout_windows", "heldout_docs", "seeds", "bpb_with", "bpb_without", "delta_bpb", "delta_low",
                    "delta_high", "seed_sd", "verdict", "reason"]
WINDOW_COLUMNS = ["arm", "seed", "source", "window", "doc", "nats", "tokens"]
CONFIDENCE = 0.95


def requested(cfg: Any) -> bool:
    """True when ``[corpus.quality_model]`` is enabled and asks for the ablation (``ablate = true``)."""
    qm = cfg.corpus.quality_model
    return bool(qm.enabled and qm.ablate)


def run(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    """Train both arms (each cached in the scratch folder, so a crash resumes at the arm it was in), score them on
    the same held-out windows, and compare per source.

    Raises:
        DataError: the corpus artifact has no ``quality_removed.parquet`` (built before the classifier kept its
            removals), or a source has too few held-out tokens for one window.
    """
    if not requested(cfg):
        (ctx.out / "ablation.json").write_text(json.dumps({"requested": False}))
        return {"requested": False}
    declared = declare(cfg.corpus.quality_model.ablate_seeds)  # before any evidence is computed
    corpus_dir, tokenized = Path(ctx.inputs["corpus"]), TokenizedCorpus(ctx.inputs["tokenizer"])
    removed_path = corpus_dir / "quality_removed.parquet"
    if not removed_path.is_file():
        raise DataError(f"{corpus_dir} has no quality_removed.parquet: rebuild the corpus with this version "
                        "(`pretrain run CONFIG --refresh corpus`)")
    general = [s for s in cfg.general_sources if tokenized.has(s, "train")]
    sizes = tokenized.train_sizes(general)
    total = sum(sizes.values())
    weights = {s: n / total for s, n in sizes.items() if n > 0}
    readd, decontam = _readded_documents(ctx, cfg, corpus_dir, tokenized, removed_path, list(weights))
    streams = {arm: _streams(ctx, tokenized, list(weights), readd if arm == ARMS[1] else {}) for arm in ARMS}
    eval_sources = [s for s in cfg.sources if tokenized.has(s, "heldout")]
    seeds = [ctx.seed + i for i in range(cfg.corpus.quality_model.ablate_seeds)]
    windows = []
    with ctx.progress.task("quality ablation: proxy per arm and seed", len(ARMS) * len(seeds)) as advance:
        for i, seed in enumerate(seeds):
            for j, arm in enumerate(ARMS):
                windows.append(_arm(ctx, cfg, tokenized, arm, seed, streams[arm], weights, eval_sources,
                                    step=2 * i + j))
                advance(1)
    windows_frame = pd.concat(windows, ignore_index=True)
    windows_frame.to_parquet(ctx.out / "windows.parquet", index=False)
    removed_by_source = pd.read_parquet(removed_path, columns=["source"]).source.value_counts().to_dict()
    tokens_per_byte = {s: tokenized.tokens_per_byte(s, "heldout") for s in eval_sources}
    roles = {name: src.role for name, src in cfg.sources.items()}
    table, overall = compare(windows_frame, tokens_per_byte, roles, weights, removed_by_source,
                             {s: (len(r["doc_ids"]), r.get("tokens", 0)) for s, r in readd.items()}, seed=ctx.seed)
    table.to_parquet(ctx.out / "ablation.parquet", index=False)
    record = {
        "requested": True, "arms": list(ARMS), "seeds": seeds, "weights": weights,
        "proxy": {"d_model": cfg.proxy.model.d_model, "n_layers": cfg.proxy.model.n_layers,
                  "steps": cfg.proxy.budget.steps, "batch_size": cfg.proxy.budget.batch_size,
                  "seq_len": cfg.proxy.model.seq_len, "peak_lr": cfg.proxy.peak_lr,
                  "tokens": cfg.proxy.budget.steps * cfg.proxy.budget.batch_size * cfg.proxy.model.seq_len},
        "removed_docs": int(sum(removed_by_source.values())),
        "removed_docs_training": int(sum(n for s, n in removed_by_source.items() if s in weights)),
        "readded_docs": int(sum(int(len(r["doc_ids"])) for r in readd.values())),
        "decontaminated_docs": int(len(decontam)), "confidence": CONFIDENCE, "overall": overall,
        "verdicts": dict(zip(table.source, table.verdict)),
    }
    record["decision"] = json.loads(settle(declared, overall, readded_docs=record["readded_docs"],
                                           evidence={"table": "quality_ablation", "artifact_key": ctx.key}).to_json())
    (ctx.out / "ablation.json").write_text(json.dumps(record, indent=2, default=float))
    plot_ablation(table, ctx.out / "ablation.png")
    return {"requested": True, "verdicts": record["verdicts"], "overall": overall["verdict"],
            "overall_delta_bpb": overall["delta_bpb"], "readded_docs": record["readded_docs"]}


RULE = ("Δ = bits/byte of the proxy trained with the classifier's removals put back − without them, over the training "
        "sources' held-out documents, averaged over {seeds} paired seeds; {confidence:.0%} t interval over seeds and "
        "documents; decided when it excludes 0 (above: the classifier helped, below: it hurt) on >= 3 seeds and >= 5 "
        "documents, else undetermined; the corpus is built with the classifier either way")
FALLBACK = "the corpus stays as built, with the classifier's removals left out"


def declare(seeds: int) -> DecisionRecord:
    """The ``quality_ablation`` decision record with its rule fixed, before any arm trains."""
    return DecisionRecord.declare("quality_ablation", rule=RULE.format(seeds=seeds, confidence=CONFIDENCE),
                                  rule_config={"seeds": seeds, "confidence": CONFIDENCE, "min_units": MIN_UNITS})


def settle(declared: DecisionRecord, overall: dict[str, Any], *, readded_docs: int,
           evidence: dict[str, Any]) -> DecisionRecord:
    """``declared`` settled on the overall row of :func:`compare` (Δ bits/byte over the training sources):
    ``decided`` with choice ``classifier helped`` / ``classifier hurt`` when the verdict is ``helped`` / ``hurt``;
    otherwise ``undetermined`` (choice ``classifier kept``) with the reason as what would resolve it."""
    word = overall["verdict"]
    resolve = ""
    if word == "unchanged":
        resolve = ("nothing to put back: no document the classifier removed from the training sources passed the "
                   "held-out decontamination" if not readded_docs else
                   f"the proxy never drew the {readded_docs:,} documents put back (both arms bit-identical): a "
                   "longer proxy ([proxy] budget.steps)")
    elif word == "undetermined":
        resolve = overall.get("reason") or ("the interval holds 0: more seeds (corpus.quality_model.ablate_seeds) "
                                            "or held-out documents ([proxy] budget.eval_tokens) narrow it")
    decided = word in ("helped", "hurt")
    return declared.settle(
        choice=f"classifier {word}" if decided else "classifier kept", verdict="decided" if decided else "undetermined",
        estimate=overall["delta_bpb"], low=overall["delta_low"], high=overall["delta_high"], unit="bits/byte",
        confidence=CONFIDENCE, fallback=FALLBACK, resolve=resolve,
        evidence={**evidence, "verdict": word, "readded_docs": readded_docs, "sources": overall["sources"]},
        n_units=int(overall["seeds"]), units=f"seeds × {int(overall['heldout_docs']):,} documents",
        min_units=MIN_UNITS["seeds"])


def _readded_documents(ctx: StageContext, cfg: Any, corpus_dir: Path, tokenized: TokenizedCorpus,
                       removed_path: Path, train_sources: list[str]) -> tuple[dict[str, dict], pd.DataFrame]:
    """The classifier's removals of the training sources that pass the held-out decontamination, by source:
    {"doc_ids", "texts"}; and the decontamination's removal rows."""
    removed = pd.read_parquet(removed_path, columns=["doc_id", "source", "text"])
    removed = removed[removed.source.isin(train_sources)]
    if removed.empty:
        return {}, pd.DataFrame()
    with duckdb.connect() as con:
        heldout = con.execute(
            "SELECT k.doc_id, k.source, k.text FROM read_parquet(?) k JOIN read_parquet(?) s USING (doc_id) "
            "WHERE s.split = 'heldout' ORDER BY k.doc_id",
            [[str(f) for f in kept_files(corpus_dir)], str(tokenized.path / "splits.parquet")]).df()
    frame = pd.concat([heldout.assign(split="heldout"), removed.assign(split="train")], ignore_index=True)
    clean, decontam = decontaminate_train(frame, ngram=cfg.tokenizer.decontam_ngram,
                                          common_min_docs=cfg.tokenizer.decontam_common_docs)
    clean = clean[clean.split == "train"]
    return ({s: {"doc_ids": list(g.doc_id), "texts": list(g.text)} for s, g in clean.groupby("source", sort=True)},
            decontam)


def _streams(ctx: StageContext, tokenized: TokenizedCorpus, sources: list[str],
             readd: dict[str, dict]) -> dict[str, TokenStream]:
    """Training streams of one arm: the tokenizer's train shard, or (for a source with documents put back) that
    shard joined with the re-added documents' tokens, written to the scratch folder (streamed, memory-mapped)."""
    meta, out = tokenized.meta, {}
    for source in sources:
        if source not in readd:
            out[source] = tokenized.stream(source, "train")
            continue
        folder = ctx.scratch / "unfiltered" / source
        joined = folder / "train"
        if not joined.with_suffix(".json").is_file():
            tokens, offsets = encode_documents(tokenized.tokenizer, readd[source]["texts"], eos_id=meta["eos_id"])
            part = folder / "readded"
            write_shard(part, tokens, vocab_size=meta["padded_vocab_size"], eos_id=meta["eos_id"],
                        tokenizer_hash=meta["tokenizer_hash"], n_bytes=text_bytes(readd[source]["texts"]),
                        doc_offsets=offsets)
            kept_bytes = int(tokenized.headers.set_index(["source", "split"]).loc[(source, "train"), "n_bytes"])
            join_shards(joined, [tokenized.path / "shards" / source / "train", part],
                        n_bytes=kept_bytes + text_bytes(readd[source]["texts"]),
                        extra={"source": source, "split": "train_unfiltered"})
        shard = read_shard(joined, expected_tokenizer_hash=meta["tokenizer_hash"])
        readd[source]["tokens"] = int(len(shard.tokens)) - tokenized.train_sizes([source])[source]
        out[source] = TokenStream(shard.tokens, shard.doc_offsets)
    return out


def _arm(ctx: StageContext, cfg: Any, tokenized: TokenizedCorpus, arm: str, seed: int,
         streams: dict[str, TokenStream], weights: dict[str, float], eval_sources: list[str], *,
         step: int) -> pd.DataFrame:
    """One arm's held-out window losses at one training seed (``WINDOW_COLUMNS``), trained now or read back from the
    scratch folder. ``seed`` seeds the initialisation and the data order."""
    cached = ctx.scratch / f"{arm}-seed{seed}.parquet"
    if cached.is_file():
        return pd.read_parquet(cached)
    shape, budget = cfg.proxy.model, cfg.proxy.budget
    model_cfg = shape.build(tokenized.vocab_size)
    model = build_model(model_cfg, seed)
    sampler = MixtureSampler(streams, weights, seq_len=model_cfg.seq_len, batch_size=budget.batch_size,
                             seed=seed, packing=cfg.packing.policy, document_mask=cfg.packing.document_mask,
                             pad_id=tokenized.pad_id)
    result = run_training(model, sampler, peak_lr=cfg.proxy.peak_lr, budget=budget, seed=seed)
    rows = []
    for source in eval_sources:
        stream = tokenized.stream(source, "heldout")
        loss = heldout_loss(model, stream.tokens, seq_len=model_cfg.seq_len, batch_size=8,
                            max_tokens=budget.eval_tokens)
        docs = window_documents(stream.doc_offsets, len(loss.window_nats), model_cfg.seq_len)
        rows.append(pd.DataFrame({"arm": arm, "seed": seed, "source": source, "window": np.arange(len(docs)), "doc": docs,
                                  "nats": loss.window_nats, "tokens": loss.window_tokens}))
    frame = pd.concat(rows, ignore_index=True)[WINDOW_COLUMNS]
    ctx.log_metrics({f"{arm}.seed{seed}.{s}.bits_per_byte": _bpb(g, tokenized.tokens_per_byte(s, "heldout"))
                     for s, g in frame.groupby("source")}
                    | {f"{arm}.seed{seed}.tokens_seen": float(result.state.tokens_seen)}, step)
    with atomic_file(cached) as f:
        frame.to_parquet(f, index=False)
    return frame


def _bpb(windows: pd.DataFrame, tokens_per_byte: float) -> float:
    return float(windows.nats.sum() / windows.tokens.sum() * tokens_per_byte / math.log(2))


def shortfall(seeds: int, docs: int) -> str:
    """"" when ``seeds`` per arm and ``docs`` held-out documents meet ``MIN_UNITS``; else the reason."""
    return (units_shortfall("seeds", seeds, "raise corpus.quality_model.ablate_seeds")
            or units_shortfall("documents", docs, "raise [proxy] budget.eval_tokens"))


def verdict(low: float, high: float, *, seeds: int = MIN_UNITS["seeds"], docs: int = MIN_UNITS["documents"],
            identical: bool = False) -> str:
    """``helped`` (Δ interval above 0: the classifier's corpus has the lower loss), ``hurt`` (below 0),
    ``undetermined`` (it holds 0, there is no interval — NaN bounds —, or fewer ``seeds`` or held-out ``docs``
    than ``MIN_UNITS``: :func:`shortfall`), or ``unchanged`` (the arms trained on identical data)."""
    if identical:
        return "unchanged"
    if shortfall(seeds, docs) or not has_width(low, high):
        return "undetermined"
    if low > 0:
        return "helped"
    if high < 0:
        return "hurt"
    return "undetermined"


def compare(windows: pd.DataFrame, tokens_per_byte: dict[str, float], roles: dict[str, str],
            weights: dict[str, float], removed_by_source: dict[str, int], readded: dict[str, tuple[int, int]], *,
            seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per source (``ABLATION_COLUMNS``) and over the training sources together: Δ = bpb(without) − bpb(with)
    averaged over the training seeds, and its 95% t interval over seeds and held-out documents
    (``evals.stats.seed_cluster_mean_ci``); ``seed_sd`` is the standard deviation of the per-seed Δ; ``reason`` why
    a verdict is undetermined for want of units ("" otherwise).

    Args:
        windows: ``WINDOW_COLUMNS`` rows of both arms at every seed over the same windows (nats summed per window).
        tokens_per_byte: held-out tokens per UTF-8 byte of each source.
        roles: source → role ("general", "domain").
        weights: the training mixture (source → weight); its sources are pooled into the overall row.
        removed_by_source: documents the classifier removed, by source.
        readded: source → (documents, tokens) put back in the ``without_classifier`` arm; empty, or both arms'
            losses equal to the bit (the proxy never drew what was put back): every verdict is ``unchanged``.
        seed: seeds the bootstrap.

    Each window enters as its bits per byte, nats / (ln 2 · bytes), weighted by its bytes = tokens / (tokens per
    byte of its source), so the weighted mean is the split's bits per byte (docs/methods.md §10) and sources pool
    by their bytes.

    Raises:
        DataError: a window is missing from one arm or one seed.
    """
    wide = windows.pivot_table(index=["source", "window", "doc", "tokens"], columns=["arm", "seed"],
                               values="nats")
    if wide.isna().any().any() or set(wide.columns.get_level_values("arm")) != set(ARMS):
        raise DataError("the two arms were not scored on the same held-out windows at every seed")
    seeds = sorted(set(wide.columns.get_level_values("seed")))
    keys = wide.index.to_frame(index=False)
    window_bytes = (keys.tokens / keys.source.map(tokens_per_byte)).to_numpy()
    bpb = {arm: np.stack([wide[(arm, s)].to_numpy() for s in seeds]) / (math.log(2) * window_bytes)
           for arm in ARMS}  # (S, N) per arm
    # Documents put back that the proxy never draws (best-fit packing can slot them into existing padding, leaving
    # the row order as it was) leave the arms bit-identical: that is no evidence either way.
    identical = not readded or bool(np.array_equal(bpb[ARMS[0]], bpb[ARMS[1]]))
    rows = []
    for source in sorted(keys.source.unique()):
        mask = (keys.source == source).to_numpy()
        ci, sd = _interval(bpb, mask, keys.doc.to_numpy()[mask], window_bytes[mask], seed)
        with_, without = (float(np.mean(bpb[a][:, mask] @ window_bytes[mask]) / window_bytes[mask].sum())
                          for a in ARMS)
        rows.append({"source": source, "role": roles.get(source, ""), "in_training": source in weights,
                     "weight": float(weights.get(source, 0.0)), "removed_docs": int(removed_by_source.get(source, 0)),
                     "readded_docs": int(readded.get(source, (0, 0))[0]),
                     "readded_tokens": int(readded.get(source, (0, 0))[1]),
                     "heldout_windows": ci.n_units, "heldout_docs": ci.n_clusters, "seeds": len(seeds),
                     "bpb_with": with_, "bpb_without": without, "delta_bpb": ci.delta, "delta_low": ci.low,
                     "delta_high": ci.high, "seed_sd": sd,
                     "verdict": verdict(ci.low, ci.high, seeds=len(seeds), docs=ci.n_clusters, identical=identical),
                     "reason": "" if identical else shortfall(len(seeds), ci.n_clusters)})
    table = pd.DataFrame(rows, columns=ABLATION_COLUMNS)
    mask = keys.source.isin(list(weights)).to_numpy()
    docs = (keys.source + "\x00" + keys.doc.astype(str)).to_numpy()[mask]
    ci, sd = _interval(bpb, mask, docs, window_bytes[mask], seed)
    overall = {"sources": sorted(weights), "delta_bpb": ci.delta, "delta_low": ci.low, "delta_high": ci.high,
               "seed_sd": sd, "seeds": len(seeds), "heldout_docs": ci.n_clusters, "heldout_windows": ci.n_units,
               "verdict": verdict(ci.low, ci.high, seeds=len(seeds), docs=ci.n_clusters, identical=identical),
               "reason": "" if identical else shortfall(len(seeds), ci.n_clusters)}
    return table, overall


def _interval(bpb: dict[str, np.ndarray], mask: np.ndarray, docs: np.ndarray, window_bytes: np.ndarray,
              seed: int) -> tuple[SeedClusterCI, float]:
    """Δ with its seed-and-document t interval over the windows ``mask`` (``evals.stats.seed_cluster_mean_ci``),
    and the standard deviation of the per-seed Δ (NaN for one seed). With a single held-out document there is no
    interval (NaN bounds): its windows are not independent evidence. ``seed`` is unused (nothing is resampled)."""
    a, b = bpb[ARMS[0]][:, mask], bpb[ARMS[1]][:, mask]
    per_seed = (b - a) @ window_bytes / window_bytes.sum()
    sd = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else math.nan
    n_docs = len(np.unique(docs))
    if n_docs < 2:
        return SeedClusterCI(float(per_seed.mean()), math.nan, math.nan, len(per_seed), n_docs, int(a.shape[1]),
                             math.nan, math.nan, math.nan), sd
    return seed_cluster_mean_ci(a, b, docs, weights=window_bytes, confidence=CONFIDENCE), sd


def plot_ablation(table: pd.DataFrame, path: Path) -> None:
    """Δ bits per byte per source with its interval; above 0 the classifier helped, below 0 it hurt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(table)), 3.5))
    x = np.arange(len(table))
    err = np.vstack([table.delta_bpb - table.delta_low, table.delta_high - table.delta_bpb])
    colors = table.verdict.map({"helped": "tab:green", "hurt": "tab:red"}).fillna("tab:gray")
    ax.bar(x, table.delta_bpb, color=colors, yerr=err, capsize=4)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, table.source, rotation=20)
    ax.set_ylabel("Δ bits/byte (without − with)")
    ax.set_title("Quality classifier ablation: > 0 means the classifier helped")
    plt.tight_layout()
    with atomic_file(path) as f:
        plt.savefig(f, format="png", dpi=100)
    plt.close(fig)
