"""Context extension as continued pretraining (``[cpt] kind = "context_extension"``, docs/methods.md §15).

Every candidate is the base's weights under one position recipe (``models.context``: position interpolation, Chen
et al. 2023; a larger RoPE base, Xiong et al. 2023; or none, the control) at ``target_seq_len``, trained with a
fresh AdamW on rows of the long-document sources (``tasks.cpt.long_docs``: documents whole up to the target
length, a document mask so no token sees another document) plus ``replay_fraction`` of the base mixture. The grid is
recipes × replay fractions × peak LRs × seeds. Candidates of one seed offset share their seed, so they read the same
batches in the same order (a paired comparison of recipes). Each candidate is cached on its own under
``runs/cache/cpt/`` (checkpoint and scores), so adding a recipe or an LR trains only the new ones.

The base and every candidate are scored on the same units (``evals.long_context``):

- the loss by token position bucket on held-out long windows (one document each) of target_seq_len + 1 tokens;
  the base is evaluated there with its RoPE unchanged (recipe ``none``): positions past its window are new to it;
- passkey retrieval at several lengths and depths, generated deterministically from held-out text;
- the short-context held-out loss at the base's window (general sources, and the long sources) on windows spread
  over the held-out documents as domain adaptation's (``tasks.cpt.stage.eval_starts``), and the cloze items: what
  the extension forgot.

Outputs (beside those of domain adaptation: ``candidates/``, ``evals/<name>.npz``, ``heldout.parquet``,
``cloze.parquet``, ``candidates.json``, ``decontamination.parquet``): ``position_loss.parquet``,
``retrieval.parquet``, ``long_documents.parquet`` (which documents each training/evaluation long document holds),
``context_supply.parquet`` (the long stream's figures per source). Every one of them carries ``construction``
(``natural`` or ``concatenated``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evals.cloze import ClozeItem, score_cloze
from evals.long_context import (bucket_edges, bucket_frame, default_lengths, min_prompt_length, passkey_items,
                                position_bucket_loss, retrieval_frame, score_passkey)
from infra.artifacts import artifact_key, code_version
from infra.atomic import atomic_dir
from infra.errors import ConfigError
from infra.stage import StageContext
from models.context import PositionRecipe, extended_config
from models.decoder import Decoder
from tasks.cpt.digest import base_digest
from tasks.cpt.eval_overlap import cloze_hits, hits_frame, training_ngrams, window_hits
from tasks.cpt.long_docs import LongWindows, check_supply, long_stream, long_windows
from tasks.cpt.stage import DOC_ID_STRIDE, _Scorer, eval_starts, replay_weights, setup
from tasks.train.checkpoint import Checkpointer, load_model
from tasks.train.data import MixtureSampler
from tasks.train.packing import PackingConfig
from tasks.train.runner import MetricsToTracker, StepProgress, run_training
from tasks.train.samples import PeriodicSamples, SampleConfig, samples_frame
from tasks.train.sections import CptConfig

TRAIN_CODE = ("tasks.cpt.context", "tasks.cpt.long_docs", "tasks.train", "models")
CANDIDATE_CODE = ("tasks.cpt", "tasks.train", "models", "evals.long_context", "evals.heldout", "evals.cloze",
                  "evals.stats")
SCORES = ("heldout", "cloze", "position", "retrieval")


def extend(base: Decoder, target_seq_len: int, recipe: PositionRecipe) -> Decoder:
    """A new decoder under ``recipe`` at ``target_seq_len`` holding a copy of ``base``'s weights (RoPE has none)."""
    model = Decoder(extended_config(base.cfg, target_seq_len, recipe))
    model.load_state_dict(base.state_dict())
    return model


@dataclass
class _EvalSets:
    """The units every model is scored on: long windows (with document ids), passkey items, bucket edges."""

    windows: np.ndarray  # (N, T' + 1)
    docs: np.ndarray  # (N,)
    sources: list[str]  # (N,) source of each window
    edges: np.ndarray
    items: list
    construction: str


def run(ctx: StageContext, cfg: CptConfig, *, general: list[str], cloze_items: list[ClozeItem],
        packing: PackingConfig = PackingConfig(), samples: SampleConfig = SampleConfig(),
        required_lengths: tuple[int, ...] = ()) -> dict[str, Any]:
    """Check the long-document supply, build the evaluation sets, score the base, then train (or read from the
    candidate cache) and score every grid candidate. ``required_lengths``: the passkey lengths the gate's retrieval
    criteria name, checked before any training. ``packing`` does not apply: rows are best fit with a document mask.

    Raises:
        ConfigError: target_seq_len not above the base's window (an external base); passkey lengths too short for
            a prompt under this tokenizer, or missing a length the gate names.
        DataError: the long sources cannot supply documents longer than the base window
            (``tasks.cpt.long_docs.check_supply``, with the figures), or too few held-out long documents.
    """
    ext = cfg.context
    corpus, tokenizer, encode, base_weights, checkpoint, base = setup(ctx, cfg)
    base_len, target = base.cfg.seq_len, ext.target_seq_len
    if target <= base_len:
        raise ConfigError(f"cpt.context.target_seq_len = {target} must exceed the base's seq_len = {base_len}")
    construction = "concatenated" if ext.construction == "concatenate" else "natural"

    longs = [long_stream(s, corpus.stream(s, "train"), base_seq_len=base_len, target_seq_len=target,
                         construction=ext.construction) for s in ext.long_sources]
    supply = pd.DataFrame([{"source": ls.source, "split": "train", **ls.report, "construction": construction}
                           for ls in longs])
    supply.to_parquet(ctx.out / "context_supply.parquet", index=False)
    check_supply(longs, min_long_token_share=ext.min_long_token_share, base_seq_len=base_len, target_seq_len=target)
    for ls in longs:
        print(f"cpt: {ls.source} long stream ({construction}): {ls.report['long_documents']:,} of "
              f"{ls.report['documents']:,} documents longer than the {base_len}-token window, "
              f"{ls.report['long_token_share']:.0%} of its tokens; {ls.report['beyond_window_tokens']:,} tokens sit "
              f"past position {base_len} of their own document in {target}-token rows")

    stream = sorted(set(ext.long_sources) | {s for s, w in base_weights.items() if w > 0})
    masks, cloze_items, sets, members = _eval_sets(ctx, cfg, corpus, general, cloze_items, encode, stream, base_len,
                                                   required_lengths)
    pd.concat([*(ls.members.assign(split="train") for ls in longs), members], ignore_index=True).assign(
        construction=construction).to_parquet(ctx.out / "long_documents.parquet", index=False)

    scorer = _ContextScorer(ctx, corpus, general, cfg, cloze_items, encode, masks, sets, base_len)
    reference = extend(base, target, PositionRecipe(name="none", position="none"))
    scorer.score("base", reference, {"recipe": "base", "position": "none", "replay_fraction": None, "peak_lr": None,
                                     "seed": None, "checkpoint": str(checkpoint),
                                     "rope_theta": base.cfg.rope_theta,
                                     "rope_scaling_factor": base.cfg.rope_scaling_factor}, step=0)

    trainer = _CandidateTrainer(ctx, cfg, corpus, longs, base_weights, checkpoint, general, samples, tokenizer,
                                cloze_items)
    grid = [(r, f, lr, s) for r in ext.recipes for f in cfg.replay_fractions for lr in cfg.peak_lrs for s in cfg.seeds]
    sample_rows: list[dict[str, Any]] = []
    with ctx.progress.task("cpt: context extension grid steps", len(grid) * cfg.budget.steps) as advance:
        for recipe, fraction, peak_lr, offset in grid:
            name = f"{recipe.name}_replay{fraction:g}_lr{peak_lr:g}" + (f"_s{offset}" if len(cfg.seeds) > 1 else "")
            # One seed per seed offset, shared by every recipe, replay share and LR: the candidates see the same
            # batches in the same order (paired), and a candidate's key does not move when the grid grows.
            seed = ctx.seed + 1 + 1000 * offset
            params = {"recipe": recipe.name, "position": recipe.position, "replay_fraction": fraction,
                      "peak_lr": peak_lr, "seed": seed}
            folder, scores, reused = trainer.candidate(name, recipe, fraction, peak_lr, seed, base, scorer, params,
                                                       advance)
            scorer.adopt(name, scores)
            shutil.copytree(folder / "checkpoint", ctx.out / "candidates" / name, copy_function=_link_or_copy)
            if (folder / "samples.parquet").exists():
                sample_rows += pd.read_parquet(folder / "samples.parquet").assign(run=name).to_dict("records")
            if reused:
                advance(cfg.budget.steps)
    print(f"cpt: {trainer.trained} candidate(s) trained, {trainer.reused} reused from runs/cache/cpt")
    summary = scorer.write()
    summary.update(base_checkpoint=str(checkpoint), kind="context_extension", trained=trainer.trained,
                   reused=trainer.reused, scored=trainer.scored)
    if sample_rows:
        samples_frame(sample_rows).to_parquet(ctx.out / "samples.parquet", index=False)
    return summary


def _digest(items: list[ClozeItem]) -> str:
    """sha256 of the scored cloze items (after decontamination): a candidate's scores depend on them."""
    import dataclasses
    import hashlib

    payload = json.dumps([dataclasses.asdict(i) for i in items], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the cache and the artifact store share a runs folder: no second copy of the weights
    except OSError:
        shutil.copy2(src, dst)


def _eval_sets(ctx, cfg, corpus, general, items, encode, stream, base_len, required_lengths=()):
    """Short-context window masks and cloze items after the 13-gram check against the training stream (as domain
    adaptation does), the long windows (decontaminated the same way) and the passkey items."""
    ext = cfg.context
    sources = list(dict.fromkeys(general + ext.long_sources))
    masks: dict[str, np.ndarray] = {}
    frames = [hits_frame("cloze", "", [], np.empty(0))]
    train = (training_ngrams(corpus.tokens(s, "train") for s in stream if corpus.has(s, "train"))
             if cfg.decontaminate else None)
    from evals.heldout import windows_at

    if train is not None:
        for source in sources:
            if corpus.has(source, "heldout"):  # the short windows the scorer reads (spread over documents)
                windows = windows_at(corpus.tokens(source, "heldout"),
                                     eval_starts(corpus, source, base_len, cfg.budget.eval_tokens), base_len)
                hits = window_hits(windows, train)
                masks[source] = hits == 0
                frames.append(hits_frame("heldout_window", source, [str(i) for i in range(len(windows))], hits))
    found: list[LongWindows] = [long_windows(s, corpus.stream(s, "heldout"), target_seq_len=ext.target_seq_len,
                                             max_windows=ext.eval_windows, construction=ext.construction)
                                for s in ext.long_sources if corpus.has(s, "heldout")]
    windows, docs, window_sources = [], [], []
    for index, lw in enumerate(found):
        keep = np.ones(len(lw.windows), dtype=bool)
        if train is not None:
            hits = window_hits(lw.windows, train)
            keep = hits == 0
            frames.append(hits_frame("long_window", lw.source, [str(d) for d in lw.docs], hits))
        windows.append(lw.windows[keep])
        docs.append(lw.docs[keep] + ext.long_sources.index(lw.source) * DOC_ID_STRIDE)
        window_sources += [lw.source] * int(keep.sum())
    if not windows or sum(len(w) for w in windows) < 2:
        from infra.errors import DataError

        raise DataError(f"cpt.context: {sum(len(w) for w in windows)} held-out long window(s) of "
                        f"{ext.target_seq_len + 1} tokens left in {ext.long_sources} after decontamination; the loss "
                        "by position needs at least 2 (more held-out long documents, or construction = 'concatenate')")
    if train is not None:
        hits = cloze_hits(items, encode, train)
        frames.append(hits_frame("cloze", "", [i.item_id for i in items], hits))
        items = [item for item, h in zip(items, hits) if h == 0]
    table = pd.concat(frames, ignore_index=True)
    table.to_parquet(ctx.out / "decontamination.parquet", index=False)
    if len(table):
        print(f"cpt: {len(table)} evaluation window(s)/item(s) share a 13-gram with the CPT training stream and are "
              "left out of every score (decontamination.parquet)")
    filler = np.concatenate([np.asarray(corpus.tokens(s, "heldout")) for s in ext.long_sources
                             if corpus.has(s, "heldout")])
    shortest = min_prompt_length(encode)
    if ext.retrieval_lengths:
        short = [n for n in ext.retrieval_lengths if n < shortest]
        if short:
            raise ConfigError(f"cpt.context.retrieval_lengths: {short} too short; under this tokenizer a passkey prompt "
                              f"needs at least {shortest} tokens (the key's sentences, the question, an option and 16 "
                              "filler tokens)")
        lengths = list(ext.retrieval_lengths)
    else:  # the defaults start at the base window; a window too small for a prompt starts them later
        lengths = [n for n in default_lengths(base_len, ext.target_seq_len) if n >= shortest]
        if not lengths:
            raise ConfigError(f"cpt.context: a passkey prompt needs at least {shortest} tokens under this tokenizer, "
                              f"more than target_seq_len = {ext.target_seq_len}")
    missing = sorted(set(required_lengths) - set(lengths))
    if missing:
        raise ConfigError(f"gate: retrieval criteria at length {missing}, but the passkey prompts have lengths "
                          f"{lengths}: set cpt.context.retrieval_lengths to include them, or length = 0 (the longest)")
    passkeys = passkey_items(filler, encode, lengths=lengths, depths=list(ext.retrieval_depths),
                             per_cell=ext.retrieval_items, n_choices=ext.retrieval_choices, seed=ctx.seed)
    construction = "concatenated" if ext.construction == "concatenate" else "natural"
    sets = _EvalSets(np.concatenate(windows), np.concatenate(docs), window_sources,
                     bucket_edges(base_len, ext.target_seq_len), passkeys, construction)
    members = pd.concat([lw.members.assign(split="heldout") for lw in found], ignore_index=True)
    return masks, items, sets, members


class _ContextScorer(_Scorer):
    """Domain adaptation's scorer (short-context held-out at the base window: ``general`` and the long sources as
    ``domain``; cloze) plus the long windows by position bucket and passkey retrieval."""

    def __init__(self, ctx, corpus, general, cfg, items, encode, masks, sets: _EvalSets, base_len: int):
        super().__init__(ctx, corpus, general, cfg, items, encode, masks)
        self.sets, self.base_len = sets, base_len
        self.position, self.retrieval = [], []
        self.domain_sources = cfg.context.long_sources

    def scores(self, name: str, model, params: dict, step: int) -> dict[str, Any]:
        """Every score of one model: npz arrays, frames and its candidates.json entry (short context at the base
        window, long windows and passkeys at the model's own window)."""
        g_nats, g_tokens, g_docs, g_evals = self._arrays(model, self.general, self.base_len)
        d_nats, d_tokens, d_docs, d_evals = self._arrays(model, self.domain_sources, self.base_len)
        cloze = score_cloze(model, self.encode, self.items, max_len=self.base_len).assign(
            checkpoint=name, construction=self.sets.construction)
        pl = position_bucket_loss(model, self.sets.windows, self.sets.edges)
        long_tokens = pl.bucket_tokens.sum(axis=1)
        long_nats = pl.bucket_nats.sum(axis=1) / np.maximum(long_tokens, 1)
        correct, margin = score_passkey(model, self.sets.items)
        label = {"checkpoint": name, "recipe": params.get("recipe", ""), "construction": self.sets.construction}
        arrays = dict(general_window_nats=g_nats, general_window_tokens=g_tokens, general_window_docs=g_docs,
                      domain_window_nats=d_nats, domain_window_tokens=d_tokens, domain_window_docs=d_docs,
                      cloze_correct=cloze["correct"].to_numpy(bool), long_window_nats=long_nats,
                      long_window_tokens=long_tokens.astype(np.int64), long_window_docs=self.sets.docs,
                      long_bucket_nats=pl.bucket_nats, long_bucket_tokens=pl.bucket_tokens,
                      long_bucket_edges=np.asarray(self.sets.edges, np.int64),
                      retrieval_correct=correct.astype(bool), retrieval_margin=margin,
                      retrieval_length=np.array([i.length for i in self.sets.items], np.int64),
                      retrieval_depth=np.array([i.depth for i in self.sets.items], np.float64))
        from tasks.train.runner import evals_frame

        # A long source that is also general is scored once in the table (the npz keeps it in both roles).
        heldout = evals_frame(g_evals + [e for e in d_evals if e.source not in self.general], checkpoint=name, step=step,
                              tokens_seen=step * self.cfg.budget.batch_size * model.cfg.seq_len,
                              construction=self.sets.construction)
        position = bucket_frame(pl, self.sets.docs, seed=self.ctx.seed).assign(**label)
        retrieval = retrieval_frame(self.sets.items, correct).assign(**label)
        longest = max(i.length for i in self.sets.items)
        at_longest = arrays["retrieval_length"] == longest
        entry = {**params, "seq_len": model.cfg.seq_len, "rope_theta": model.cfg.rope_theta,
                 "rope_scaling_factor": model.cfg.rope_scaling_factor,
                 "general_loss_nats": float(np.average(g_nats, weights=g_tokens)),
                 "domain_loss_nats": float(np.average(d_nats, weights=d_tokens)),
                 "cloze_accuracy": float(cloze["correct"].mean()) if len(cloze) else float("nan"),
                 "long_loss_nats": float(pl.bucket_nats.sum() / max(1, pl.bucket_tokens.sum())),
                 "retrieval_length": int(longest),
                 "retrieval_accuracy": float(correct[at_longest].mean()),
                 "construction": self.sets.construction}
        return {"arrays": arrays, "heldout": heldout, "cloze": cloze, "position": position, "retrieval": retrieval,
                "entry": entry}

    def score(self, name: str, model, params: dict, step: int) -> None:
        """Score ``model`` and keep its results (the base; candidates go through the cache, ``save``/``adopt``)."""
        folder = self.ctx.out / "scores" / name
        folder.mkdir(parents=True)
        save_scores(folder, self.scores(name, model, params, step))
        self.adopt(name, folder)

    def adopt(self, name: str, folder: Path) -> None:
        """Take the scores saved in ``folder`` (``save_scores``) as candidate ``name``'s."""
        shutil.copyfile(folder / "evals.npz", self.ctx.out / "evals" / f"{name}.npz")
        # The name is the grid's now (a seed suffix appears once there are several seeds); the scores are the key's.
        frames = {part: pd.read_parquet(folder / f"{part}.parquet").assign(checkpoint=name) for part in SCORES}
        self.heldout.append(frames["heldout"])
        cloze = frames["cloze"]
        cloze["logprobs"] = cloze["logprobs"].map(lambda v: list(json.loads(v)) if isinstance(v, str) else v)
        self.cloze.append(cloze)
        self.position.append(frames["position"])
        self.retrieval.append(frames["retrieval"])
        self.candidates[name] = json.loads((folder / "entry.json").read_text())

    def write(self) -> dict[str, Any]:
        pd.concat(self.position, ignore_index=True).to_parquet(self.ctx.out / "position_loss.parquet", index=False)
        pd.concat(self.retrieval, ignore_index=True).to_parquet(self.ctx.out / "retrieval.parquet", index=False)
        scores = self.ctx.out / "scores"
        if scores.exists():
            shutil.rmtree(scores)
        return super().write()


def save_scores(folder: Path, scores: dict[str, Any]) -> None:
    """Write one model's scores into ``folder``: ``evals.npz``, one parquet per frame, ``entry.json``."""
    np.savez(folder / "evals.npz", **scores["arrays"])
    for part in SCORES:
        frame = scores[part].copy()
        if part == "cloze":
            frame["logprobs"] = frame["logprobs"].map(lambda v: json.dumps([float(x) for x in v]))
        frame.to_parquet(folder / f"{part}.parquet", index=False)
    (folder / "entry.json").write_text(json.dumps(scores["entry"], indent=2))


class _CandidateTrainer:
    """Trains one candidate, or finds it in the candidate cache, and scores it, or finds its scores there.

    Two levels, so that changing only the evaluation re-scores without retraining: ``runs/cache/cpt/<train key>/``
    holds the checkpoint, the samples and ``train.json``; its ``scores/<score key>/`` the scores
    (``save_scores``). The train key reads what the weights depend on: the extended model config (equivalent
    recipes share it), replay share, peak LR, seed, budget, stream sources and construction, tokenizer, the base's
    content and the training code; the score key adds the evaluation settings and code.
    """

    def __init__(self, ctx, cfg, corpus, longs, base_weights, checkpoint, general, samples, tokenizer, cloze_items):
        self.ctx, self.cfg, self.corpus, self.longs = ctx, cfg, corpus, longs
        self.base_weights, self.samples, self.tokenizer = base_weights, samples, tokenizer
        self.folder = ctx.layout.root / "cache" / "cpt"
        self.inputs = {"tokenizer": Path(ctx.inputs["tokenizer"]).name, "base": base_digest(checkpoint)}
        ext = cfg.context
        self.training = {"budget": cfg.budget.model_dump(mode="json"), "min_lr_ratio": cfg.min_lr_ratio,
                         "replay_sampling": cfg.replay_sampling, "base_weights": base_weights,
                         "long_sources": list(ext.long_sources), "construction": ext.construction,
                         "samples": samples.model_dump(mode="json")}
        self.evaluation = {"context": ext.model_dump(mode="json", exclude={"recipes"}), "general": sorted(general),
                           "decontaminate": cfg.decontaminate, "cloze": _digest(cloze_items),
                           "experiment_seed": ctx.seed}
        self.train_code, self.score_code = code_version(*TRAIN_CODE), code_version(*CANDIDATE_CODE)
        self.trained = self.reused = self.scored = 0

    def key(self, model_cfg, fraction: float, peak_lr: float, seed: int) -> str:
        config = {**self.training, "model": model_cfg.model_dump(mode="json"), "replay_fraction": fraction,
                  "peak_lr": peak_lr, "seed": int(seed)}
        return artifact_key("cpt-context-candidate", config, self.inputs, self.train_code)

    def candidate(self, name, recipe, fraction, peak_lr, seed, base, scorer: _ContextScorer, params,
                  advance) -> tuple[Path, Path, bool]:
        """The candidate's cache folder and its scores folder (trained and scored now where absent), and whether
        the training was reused."""
        model_cfg = extended_config(base.cfg, self.cfg.context.target_seq_len, recipe)
        train_key = self.key(model_cfg, fraction, peak_lr, seed)
        path, reused = self.folder / train_key, True
        if not self.ctx.reuses(train_key, (path / "train.json").is_file()):  # --refresh cpt: train afresh
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_dir(path, replace=self.ctx.refresh) as tmp:  # refreshed: the new one replaces the old
                self._train(tmp, name, recipe, fraction, peak_lr, seed, base, params, advance)
            self.ctx.wrote(train_key)
            self.trained, reused = self.trained + 1, False
        else:
            self.reused += 1
        score_key = artifact_key("cpt-context-scores", self.evaluation, {"train": train_key}, self.score_code)
        scores = path / "scores" / score_key
        if not (scores / "entry.json").is_file():
            (path / "scores").mkdir(exist_ok=True)
            trained = load_model(path / "checkpoint")  # what was saved: a reused candidate scores the same
            info = json.loads((path / "train.json").read_text())
            with atomic_dir(scores) as tmp:
                save_scores(tmp, scorer.scores(name, trained, {**params, **info["params"]}, step=info["step"]))
            self.scored += 1
        return path, scores, reused

    def _train(self, out, name, recipe, fraction, peak_lr, seed, base, params, advance) -> None:
        cfg, ext = self.cfg, self.cfg.context
        model = extend(base, ext.target_seq_len, recipe)
        # The long streams are named apart from the replay ones, even for a source that is both (its documents
        # whole up to the target length, or joined): the realised replay share is then exact.
        weights = {f"long:{s}": (1.0 - fraction) / len(ext.long_sources) for s in ext.long_sources}
        weights.update({s: w for s, w in replay_weights([], self.base_weights, fraction).items()})
        weights = {s: w for s, w in weights.items() if w > 0}
        own = {f"long:{ls.source}": ls.stream for ls in self.longs}
        streams = {s: own[s] if s in own else self.corpus.stream(s, "train") for s in weights}
        # Rows keep documents whole up to the target length, with no attention across documents (docs §15).
        sampler = MixtureSampler(streams, weights, seq_len=ext.target_seq_len, batch_size=cfg.budget.batch_size,
                                 seed=seed, packing="best_fit", document_mask=True, pad_id=self.corpus.pad_id,
                                 sampling=cfg.replay_sampling)
        callbacks = [MetricsToTracker(self.ctx.log_metrics, 1, prefix=f"{name}."), StepProgress(advance)]
        if self.samples.prompts:
            callbacks.append(PeriodicSamples(self.samples, self.tokenizer, eos_id=int(self.corpus.meta["eos_id"]),
                                             run=name))
        result = run_training(model, sampler, peak_lr=peak_lr, budget=cfg.budget, seed=seed, callbacks=callbacks,
                              min_lr_ratio=cfg.min_lr_ratio)
        extra = {"tokenizer_hash": self.corpus.meta["tokenizer_hash"], "replay_weights": weights,
                 "manifest_hash": self.corpus.meta.get("manifest_hash", ""), "base": params.get("checkpoint", ""),
                 "context_extension": {"recipe": recipe.model_dump(mode="json"), "target_seq_len": ext.target_seq_len,
                                       "construction": ext.construction}}
        Checkpointer(out, extra=extra).save(out / "checkpoint", model=model, optimizer=result.optimizer,
                                            state=result.state, sampler_state=sampler.state_dict())
        realised = sampler.realised_fractions()
        replay = sum(share for s, share in realised.items() if not s.startswith("long:"))
        rows = [row for c in callbacks if isinstance(c, PeriodicSamples) for row in c.rows]
        if rows:
            samples_frame(rows).to_parquet(out / "samples.parquet", index=False)
        (out / "train.json").write_text(json.dumps({"step": int(result.state.step), "params": {
            "realised_replay_fraction": float(replay), "tokens_seen": int(result.state.tokens_seen)}}, indent=2))
