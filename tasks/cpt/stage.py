"""CPT stage: continued pretraining of the main checkpoint (or of ``[cpt] base_checkpoint``: a checkpoint of this
platform or a Hugging Face model folder) on the domain source with replay.

A grid of replay fraction × peak LR × seed; each candidate starts from the same base weights with a fresh AdamW
state and a short warmup (docs/methods.md §11). The replay stream is the base run's mixture (same general sources and
weights) taking ``replay_fraction`` of every batch. General and domain held-out loss are evaluated every
``cpt.budget.eval_every`` steps, so the forgetting curve is visible in MLflow, and the cloze set at the end. With
``[cpt] recovery_steps``, every adapted candidate also branches into recovered ones, ``<name>_rec<k>``: k more steps on
general text only, scored like every other candidate (``tasks.cpt.adapt``). Each candidate and recovery is trained
once and kept in ``runs/cache/cpt/``.

Before training: the base checkpoint's tokenizer is checked against the experiment's, and the evaluation sets
against the CPT training stream (``tasks/cpt/eval_overlap.py``). The base and every candidate are scored on the same
held-out windows: ``budget.eval_tokens`` worth of each split's window grid spread round-robin over its documents
(:func:`eval_starts`), since the gate's loss intervals count documents (docs/methods.md §11).

Outputs: ``candidates/<name>/`` checkpoints, ``decontamination.parquet`` (evaluation windows/items left out),
``evals/<name>.npz`` (per-window general/domain nats and tokens, ``<role>_window_docs`` the document each window
starts in, cloze correctness — the paired units the gate compares, resampling documents), ``heldout.parquet``,
``cloze.parquet``, ``candidates.json`` (with recovery: ``recovery_steps``, ``recovery_lr`` and ``tokens_seen`` per
candidate, and a ``recovery_steps`` column in the held-out and cloze rows), and with ``[samples]`` prompts
``samples.parquet`` (each candidate's continuations of them at its evaluation points, ``tasks.train.samples``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evals.cloze import ClozeItem, score_cloze
from evals.heldout import (bits_per_byte, documents_at, heldout_loss, keep_windows, spread_windows,
                           windows_at)
from infra.errors import CheckpointError, DataError
from infra.stage import StageContext
from models.decoder import Decoder
from tasks.cpt.adapt import CandidateTrainer, link_or_copy, recovery_name
from tasks.cpt.eval_overlap import cloze_hits, hits_frame, training_ngrams, window_hits
from tasks.cpt.hf_base import is_hf_folder, load_hf_base
from tasks.readers import load_choice
from tasks.train.corpus import TokenizedCorpus
from tasks.train.checkpoint import load_model, verify_checkpoint
from tasks.train.loop import local_accelerator
from tasks.train.runner import PeriodicEval, SourceEval, evals_frame, seed_everything
from tasks.train.sections import CptConfig
from tasks.train.samples import SampleConfig, samples_frame
from tasks.train.packing import PackingConfig


DOC_ID_STRIDE = 10**9  # window document id = source index · stride + document index in the source's held-out split


def eval_starts(corpus: TokenizedCorpus, source: str, seq_len: int, eval_tokens: int,
                split: str = "heldout") -> np.ndarray:
    """(n_windows,) int64 start offsets of the windows the CPT stage scores ``source``'s ``split`` on for the gate:
    ``eval_tokens`` worth of the split's stride-``seq_len`` window grid, spread round-robin over its documents
    (``evals.heldout.spread_windows``), so the document-level intervals rest on many documents, not on the one or
    two the first ``eval_tokens`` tokens hold (docs/methods.md §11).

    Raises:
        DataError: as ``spread_windows`` (a split shorter than one window, bad document offsets).
    """
    stream = corpus.stream(source, split)
    return spread_windows(stream.doc_offsets, len(stream.tokens), seq_len, eval_tokens)


def replay_weights(domain: list[str], general_weights: dict[str, float], replay_fraction: float) -> dict[str, float]:
    """Batch shares: domain sources split 1 − f evenly; general sources get f times their base-mixture weight."""
    weights = {name: (1.0 - replay_fraction) / len(domain) for name in domain}
    for name, w in general_weights.items():
        weights[name] = weights.get(name, 0.0) + replay_fraction * w
    return weights


def base_checkpoint(ctx: StageContext, cfg: CptConfig, corpus: TokenizedCorpus) -> Path:
    """The checkpoint CPT starts from: ``cfg.base_checkpoint`` if given (a checkpoint of this platform, a Hugging
    Face model folder, ``tasks.cpt.hf_base``, or a named checkpoint of the main run: ``main@step_00000400``,
    ``main@ema``, ..., ``tasks.train.milestones``), else the main run's final one; checked before any training
    against this experiment's tokenizer.

    Raises:
        CheckpointError: missing/corrupt checkpoint, an unknown checkpoint name (the available ones listed), or one
            trained with another tokenizer or vocabulary (the message gives both hashes: a new vocabulary needs an
            embedding transition, docs/methods.md §11).
    """
    from tasks.train.milestones import resolve_named

    path = (resolve_named(cfg.base_checkpoint, main_artifact=Path(ctx.inputs["main"]), runs_root=ctx.layout.root)
            if cfg.base_checkpoint else ctx.inputs["main"] / "checkpoint")
    if is_hf_folder(path):
        return path  # checked as it is loaded (load_hf_base)
    record = verify_checkpoint(path)
    saved = record.get("extra", {}).get("tokenizer_hash")
    vocab = record.get("model_config", {}).get("vocab_size")
    if saved != corpus.meta["tokenizer_hash"] or vocab != corpus.vocab_size:
        raise CheckpointError(f"CPT base {path} was trained with tokenizer {saved!r} (vocab {vocab}), this "
                              f"experiment's is {corpus.meta['tokenizer_hash']!r} (vocab {corpus.vocab_size}): keep "
                              "the tokenizer fixed for CPT, or train the base with this one")
    return path


def _load_base(checkpoint: Path, corpus: TokenizedCorpus) -> Decoder:
    """A fresh copy of the base's weights: the model shape is the base's own (its saved config, or the HF
    folder's config.json), never the experiment's [main] model.

    Raises:
        CheckpointError, ConfigError, DataError: as :func:`tasks.cpt.hf_base.load_hf_base` and
            :func:`tasks.train.checkpoint.load_model`.
    """
    return load_hf_base(checkpoint, corpus.meta) if is_hf_folder(checkpoint) else load_model(checkpoint)


def setup(ctx: StageContext, cfg: CptConfig):
    """What every CPT kind starts from: the seeded process, the experiment's corpus, its tokenizer and ``encode``,
    the replay weights (``[cpt] replay_weights`` or the base mixture's), the checked base checkpoint and its
    model."""
    seed_everything(ctx.seed, ctx.torch_threads)
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    tokenizer = corpus.tokenizer
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    base_weights = dict(cfg.replay_weights) or load_choice(ctx.inputs["mixture"])["weights"]
    checkpoint = base_checkpoint(ctx, cfg, corpus)
    return corpus, tokenizer, encode, base_weights, checkpoint, _load_base(checkpoint, corpus)


def run(ctx: StageContext, cfg: CptConfig, *, general: list[str], cloze_items: list[ClozeItem],
        packing: PackingConfig = PackingConfig(), samples: SampleConfig = SampleConfig()) -> dict[str, Any]:
    """Check the base and the evaluation sets, score the base, then train (or read from the candidate cache,
    ``tasks.cpt.adapt``) and score every grid candidate: replay × peak LR × seed, and with ``recovery_steps`` each
    adapted candidate's recoveries on general text (``<name>_rec<k>``). With ``samples.prompts``, each
    candidate's evaluation points also continue those prompts (``samples.parquet``)."""
    corpus, tokenizer, encode, base_weights, checkpoint, base = setup(ctx, cfg)
    stream = sorted(set(cfg.domain_sources) | {s for s, w in base_weights.items() if w > 0})
    masks, cloze_items = _decontaminate(ctx, cfg, corpus, general, cloze_items, encode, stream, base.cfg.seq_len)
    scorer = _Scorer(ctx, corpus, general, cfg, cloze_items, encode, masks)
    axis = {"recovery_steps": None} if cfg.recovers else {}  # recovery columns only where recovery is configured
    scorer.score("base", base, {"replay_fraction": None, "peak_lr": None, "seed": None, "checkpoint": str(checkpoint),
                                **({"recovery_lr": None, "tokens_seen": None, **axis} if axis else {})},
                 step=0, columns=axis)
    trainer = CandidateTrainer(ctx, cfg, corpus=corpus, tokenizer=tokenizer, checkpoint=checkpoint,
                               base_weights=base_weights, general=general, packing=packing, samples=samples,
                               load_base=lambda: _load_base(checkpoint, corpus), curve=scorer.curve)
    grid = [(f, lr, s) for f in cfg.replay_fractions for lr in cfg.peak_lrs for s in cfg.seeds]
    recoveries = sorted(k for k in cfg.recovery_steps if k > 0)
    sample_rows: list[dict[str, Any]] = []
    steps = cfg.budget.steps + max(recoveries, default=0)  # the recoveries of one candidate train max(k) steps
    device = local_accelerator().device
    with ctx.progress.task("cpt: replay × LR grid steps", len(grid) * steps) as advance:
        for index, (fraction, peak_lr, offset) in enumerate(grid):
            name = f"replay{fraction:g}_lr{peak_lr:g}" + (f"_s{offset}" if len(cfg.seeds) > 1 else "")
            seed = ctx.seed + index + 1000 * offset
            weights = replay_weights(cfg.domain_sources, base_weights, fraction)
            adapted = trainer.adapt(name, weights, fraction, peak_lr, seed, advance)
            info = json.loads((adapted[1] / "train.json").read_text())
            params = {"replay_fraction": fraction, "peak_lr": peak_lr, "seed": seed, **info["params"]}
            adapt_rows = _samples_of(adapted[1])
            found = ([(0, adapted[1])] if 0 in cfg.recovery_steps else []) + trainer.recover(
                adapted, name, recoveries, peak_lr, seed, advance)
            for k, folder in found:
                candidate = recovery_name(name, k)
                rows = adapt_rows + (_samples_of(folder) if k else [])
                sample_rows += [{**row, "run": candidate} for row in rows]
                shutil.copytree(folder / "checkpoint", ctx.out / "candidates" / candidate, copy_function=link_or_copy)
                trained = json.loads((folder / "train.json").read_text())
                columns = {"recovery_steps": k} if axis else {}
                extra = {"recovery_steps": k, "recovery_lr": cfg.recovery_lr(peak_lr) if k else None,
                         "tokens_seen": trained["tokens_seen"]} if axis else {}
                model = load_model(folder / "checkpoint").to(device)  # what was saved: reused ones score the same
                scorer.score(candidate, model, {**params, **extra}, step=trained["step"], columns=columns)
    print(f"cpt: {trainer.trained} candidate phase(s) trained, {trainer.reused} reused from the candidate cache "
          "(runs/cache/cpt)")
    summary = scorer.write()
    summary.update(base_checkpoint=str(checkpoint), trained=trainer.trained, reused=trainer.reused)
    if samples.prompts:
        samples_frame(sample_rows).to_parquet(ctx.out / "samples.parquet", index=False)
    return summary


def _samples_of(folder: Path) -> list[dict[str, Any]]:
    """The sample rows a cached candidate (or recovery phase) saved, in step order."""
    path = folder / "samples.parquet"
    return pd.read_parquet(path).to_dict("records") if path.exists() else []


def _decontaminate(ctx, cfg, corpus, general, items, encode, stream, seq_len):
    """Window masks per evaluated source and the cloze items kept, after the 13-gram check against the training
    split of the CPT stream; every hit goes to ``decontamination.parquet``."""
    sources = list(dict.fromkeys(general + cfg.domain_sources))
    masks: dict[str, np.ndarray] = {}
    frames = [hits_frame("cloze", "", [], np.empty(0))]
    if not cfg.decontaminate:
        pd.concat(frames).to_parquet(ctx.out / "decontamination.parquet", index=False)
        return masks, list(items)
    train = training_ngrams(corpus.tokens(s, "train") for s in stream if corpus.has(s, "train"))
    for source in sources:
        if not corpus.has(source, "heldout"):
            continue
        windows = windows_at(corpus.tokens(source, "heldout"),
                             eval_starts(corpus, source, seq_len, cfg.budget.eval_tokens), seq_len)
        hits = window_hits(windows, train)
        masks[source] = hits == 0
        frames.append(hits_frame("heldout_window", source, [str(i) for i in range(len(windows))], hits))
    hits = cloze_hits(items, encode, train)
    frames.append(hits_frame("cloze", "", [i.item_id for i in items], hits))
    table = pd.concat(frames, ignore_index=True)
    table.to_parquet(ctx.out / "decontamination.parquet", index=False)
    if len(table):
        print(f"cpt: {len(table)} evaluation window(s)/item(s) share a 13-gram with the CPT training stream and are "
              "left out of every score (decontamination.parquet)")
    return masks, [item for item, h in zip(items, hits) if h == 0]


class _Scorer:
    """Scores models on the held-out splits and the cloze items; collects the rows and paired arrays."""

    def __init__(self, ctx, corpus, general, cfg, items, encode, masks=None):
        self.ctx, self.corpus, self.general, self.cfg = ctx, corpus, general, cfg
        self.items, self.encode, self.masks = items, encode, masks or {}
        self.heldout, self.cloze, self.candidates = [], [], {}
        self._starts: dict[tuple[str, str, int], np.ndarray] = {}
        (ctx.out / "evals").mkdir(parents=True, exist_ok=True)

    def starts(self, source: str, split: str, seq_len: int) -> np.ndarray:
        """The window starts of ``source``'s ``split`` at ``seq_len`` (:func:`eval_starts`), the same for every
        model and for the decontamination masks."""
        key = (source, split, seq_len)
        if key not in self._starts:
            self._starts[key] = eval_starts(self.corpus, source, seq_len, self.cfg.budget.eval_tokens, split)
        return self._starts[key]

    def _evaluate(self, model, sources, seq_len: int, split: str = "heldout") -> list[SourceEval]:
        """Held-out loss and bits per byte per source on its :meth:`starts` windows (sources without the split are
        skipped)."""
        results = []
        for source in sources:
            if not self.corpus.has(source, split):
                continue
            loss = heldout_loss(model, self.corpus.tokens(source, split), seq_len=seq_len, batch_size=8,
                                starts=self.starts(source, split, seq_len))
            results.append(SourceEval(source, split, loss, bits_per_byte(
                loss.loss_nats, self.corpus.tokens_per_byte(source, split))))
        return results

    def _arrays(self, model, sources, seq_len: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        """Per-window nats/token, tokens, document ids and the evaluations of ``sources`` at ``seq_len`` (default
        the model's window), on the windows :meth:`starts` gives."""
        seq_len = seq_len or model.cfg.seq_len
        raw = self._evaluate(model, sources, seq_len)
        docs = np.concatenate([self._window_docs(e, sources.index(e.source), seq_len) for e in raw])
        evals = [self._decontaminated(e) for e in raw]
        nats = np.concatenate([e.loss.window_nats for e in evals])
        tokens = np.concatenate([e.loss.window_tokens for e in evals])
        return nats / np.maximum(tokens, 1), tokens, docs, evals

    def _window_docs(self, e: SourceEval, index: int, seq_len: int) -> np.ndarray:
        """(n_kept_windows,) int64 id of the document each kept window starts in: ``index`` · ``DOC_ID_STRIDE`` +
        its index in the held-out split, so ids are unique across sources; the windows decontamination drops
        drop theirs too."""
        offsets = self.corpus.stream(e.source, e.split).doc_offsets
        if len(offsets) >= DOC_ID_STRIDE:
            raise DataError(f"{e.source} {e.split}: {len(offsets):,} documents, more than the {DOC_ID_STRIDE:,} a "
                            "window document id can number")
        docs = documents_at(offsets, self.starts(e.source, e.split, seq_len)) + index * DOC_ID_STRIDE
        mask = self.masks.get(e.source)
        return docs if mask is None or mask.all() else docs[mask]

    def _decontaminated(self, e: SourceEval) -> SourceEval:
        mask = self.masks.get(e.source)
        if mask is None or mask.all():
            return e
        loss = keep_windows(e.loss, mask)
        return SourceEval(e.source, e.split, loss, bits_per_byte(loss.loss_nats,
                                                                 self.corpus.tokens_per_byte(e.source, e.split)))

    def score(self, name: str, model, params: dict, step: int, columns: dict | None = None) -> None:
        """Score ``model`` as ``name``; ``columns`` (e.g. ``recovery_steps``) are added to its held-out and cloze
        rows."""
        columns = columns or {}
        g_nats, g_tokens, g_docs, g_evals = self._arrays(model, self.general)
        d_nats, d_tokens, d_docs, d_evals = self._arrays(model, self.cfg.domain_sources)
        cloze = score_cloze(model, self.encode, self.items, max_len=model.cfg.seq_len).assign(checkpoint=name,
                                                                                              **columns)
        np.savez(self.ctx.out / "evals" / f"{name}.npz", general_window_nats=g_nats, general_window_tokens=g_tokens,
                 general_window_docs=g_docs, domain_window_nats=d_nats, domain_window_tokens=d_tokens,
                 domain_window_docs=d_docs, cloze_correct=cloze["correct"].to_numpy(bool))
        self.heldout.append(evals_frame(g_evals + d_evals, checkpoint=name, step=step,
                                        tokens_seen=step * self.cfg.budget.batch_size * model.cfg.seq_len,
                                        **columns))
        self.cloze.append(cloze)
        self.candidates[name] = {**params, "general_loss_nats": float(np.average(g_nats, weights=g_tokens)),
                                 "domain_loss_nats": float(np.average(d_nats, weights=d_tokens)),
                                 "cloze_accuracy": float(cloze["correct"].mean())}

    def curve(self, log, seq_len: int) -> PeriodicEval:
        """The forgetting curve: ``general_loss_nats`` and ``domain_loss_nats`` (token-weighted over the sources of
        each role) at every evaluation point, sent to ``log(metrics, step)``. It reads the first ``eval_tokens`` of
        each split, not the gate's spread windows: the curve is kept with the candidate's training in the candidate
        cache, whose key does not read the evaluation windows."""
        def report(step, tokens_seen, evals):
            by_role = {"general": self.general, "domain": self.cfg.domain_sources}
            metrics = {}
            for role, sources in by_role.items():
                mine = [e for e in evals if e.source in sources]
                metrics[f"{role}_loss_nats"] = sum(e.loss.sum_nats for e in mine) / max(
                    1, sum(e.loss.n_tokens for e in mine))
            log(metrics, step)

        return PeriodicEval(self.corpus, self.general + self.cfg.domain_sources, seq_len=seq_len,
                            eval_tokens=self.cfg.budget.eval_tokens, report=report)

    def write(self) -> dict[str, Any]:
        heldout, cloze = pd.concat(self.heldout, ignore_index=True), pd.concat(self.cloze, ignore_index=True)
        for frame in (heldout, cloze):
            if "recovery_steps" in frame.columns:  # the base has none
                frame["recovery_steps"] = frame["recovery_steps"].astype("Int64")
        heldout.to_parquet(self.ctx.out / "heldout.parquet", index=False)
        cloze["logprobs"] = cloze["logprobs"].map(lambda v: json.dumps([float(x) for x in v]))
        cloze.to_parquet(self.ctx.out / "cloze.parquet", index=False)
        (self.ctx.out / "candidates.json").write_text(json.dumps(self.candidates, indent=2))
        return {"candidates": self.candidates}
