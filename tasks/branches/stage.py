"""Decay branches of a WSD main run: what a short decay from a stable step, on the main mixture or an anneal mixture,
does to every source's held-out loss (docs/methods.md §6; Hu et al. 2024, MiniCPM; Hägele et al. 2024).

A branch at step s (``[main.branches] at_steps``) resumes the main run's stable checkpoint at s (weights, AdamW
moments, loader position, RNG; ``tasks.train.trunk``), trains k = ``decay_steps`` more steps with the LR decaying from
the peak to the main run's floor in its ``decay_shape`` (``tasks.train.schedule.branch_lr``), and scores each
source's held-out split. On the main mixture the branch is the WSD main run of s + k steps whose decay starts at s,
step for step. With ``weights`` each step gets a second branch on that mixture (an anneal on higher-quality or
specialised sources): its loader keeps every source's row position from the trunk, so an anneal source the trunk
read continues where it stopped, and a new one starts at its first epoch.

Caching: every branch and every branch point is cached on its own under ``<runs>/cache/branches/<key>.parquet``,
keyed by the trunk key (the stable checkpoint's identity), the step, k, the mixture, the decay shape and floor, the
evaluation settings and the code; the stable checkpoints are shared by main runs of any length. Adding a branch
trains only that branch (and, when no run kept its step, the stable phase from the newest kept step before it);
growing the main run's budget re-keys this stage but trains nothing already done.

Outputs: ``branches.parquet`` (``COLUMNS``: one row per branch and source; ``delta_bpb_vs_branch_point`` = bits per
byte after the branch − at its branch point; ``delta_bpb_vs_main_mixture`` = an anneal branch − the main-mixture
branch of the same s and k, empty for the main-mixture branches) and ``branches.json`` (settings, trunk key, the
mixtures, the branch list, the main run's own held-out bits per byte). Not requested: ``branches.json`` with
``requested: false``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from infra.artifacts import artifact_key, code_version_closure
from infra.atomic import atomic_file
from infra.stage import StageContext
from infra.errors import DataError
from infra.runs import ensure_folder
from tasks.readers import load_choice
from tasks.train.checkpoint import Checkpointer
from tasks.train.config import OptimConfig
from tasks.train.corpus import TokenizedCorpus
from tasks.train.data import MixtureSampler
from tasks.train.loop import local_accelerator
from tasks.train.optim import build_optimizer
from tasks.train.parallel import parallelize
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training
from tasks.train.sections import MainConfig
from tasks.train.trunk import extend_trunk, trunk_checkpoints, trunk_folder

COLUMNS = ["branch", "mixture", "at_step", "decay_steps", "tokens_seen", "source", "tokens", "loss_nats",
           "bits_per_byte", "branch_point_loss_nats", "branch_point_bits_per_byte", "delta_bpb_vs_branch_point",
           "delta_bpb_vs_main_mixture"]
MAIN_MIXTURE, ANNEAL = "main", "anneal"


def requested(cfg: Any) -> bool:
    """True when the experiment has ``[main.branches]`` (which requires a WSD main run)."""
    return cfg.main.branches is not None


def branch_name(mixture: str, at_step: int, decay_steps: int) -> str:
    """``<mixture>-at<s>-k<k>``, e.g. ``anneal-at400-k100`` (a valid MLflow metric-name part)."""
    return f"{mixture}-at{at_step}-k{decay_steps}"


def run(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    """Train (or read back) every branch of ``[main.branches]`` and write ``branches.parquet`` and ``branches.json``.

    The peak LR and the trunk key are the main artifact's (``run.json``), so the branches start from the stable
    checkpoints the main run kept.

    Raises:
        DataError: the main artifact records no trunk (not a WSD run), or as training. CheckpointError: a kept stable
            checkpoint fails its checks.
    """
    if not requested(cfg):
        (ctx.out / "branches.json").write_text(json.dumps({"requested": False}, indent=2))
        return {"requested": False}
    main: MainConfig = cfg.main
    spec = main.branches
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    choice = load_choice(ctx.inputs["mixture"])
    main_run = json.loads((Path(ctx.inputs["main"]) / "run.json").read_text())
    if not main_run.get("trunk_key"):
        raise DataError(f"main artifact {ctx.inputs['main']} records no stable-phase trunk (schedule "
                        f"{main_run.get('schedule', 'cosine')!r}); decay branches need a main run with budget.schedule "
                        "= \"wsd\"")
    peak_lr, trunk = float(main_run["peak_lr"]), main_run["trunk_key"]
    folder = trunk_folder(ctx.layout.root, trunk)
    sources = list(cfg.general_sources + cfg.domain_sources)
    main_weights = {s: float(w) for s, w in choice["weights"].items() if w > 0}
    mixtures = {MAIN_MIXTURE: main_weights} | ({ANNEAL: {s: float(w) for s, w in spec.weights.items() if w > 0}}
                                               if spec.weights else {})
    cache = _Cache(ctx.layout.root / "cache" / "branches", tokenizer=Path(ctx.inputs["tokenizer"]).name, trunk=trunk,
                   main=main, sources=sources, ctx=ctx)
    plan = [(s, spec.length(s)) for s in sorted(spec.at_steps)]
    needed = [s for s, k in plan if not cache.has(cache.point_key(s)) or
              any(not cache.has(cache.branch_key(s, k, w)) for w in mixtures.values())]
    extra = {"tokenizer_hash": corpus.meta["tokenizer_hash"], "manifest_hash": corpus.meta.get("manifest_hash", ""),
             "mixture": choice["weights"], "peak_lr": peak_lr}
    accelerator = local_accelerator()
    scratch = ctx.scratch
    stable_trained = sorted(set(needed) - {step for step, _ in trunk_checkpoints(folder)})
    trunk_dirs = extend_trunk(folder, needed, cfg=main, corpus=corpus, weights=main_weights, peak_lr=peak_lr,
                              packing=cfg.packing, seed=ctx.seed, extra=extra, scratch=scratch,
                              accelerator=accelerator) if needed else {}
    train = dict(main=main, corpus=corpus, peak_lr=peak_lr, packing=cfg.packing, seed=ctx.seed, sources=sources,
                 accelerator=accelerator, trunk_weights=main_weights)
    rows, listed = [], []
    with ctx.progress.task("branches: decay branches", len(plan) * len(mixtures)) as advance:
        for index, (s, k) in enumerate(plan):
            point = cache.get(cache.point_key(s), lambda: score_point(trunk_dirs[s], **train))
            by_mixture = {}
            for mixture, weights in mixtures.items():
                by_mixture[mixture] = cache.get(cache.branch_key(s, k, weights), lambda: train_branch(
                    trunk_dirs[s], weights=weights, at_step=s, decay_steps=k, **train))
                listed.append({"branch": branch_name(mixture, s, k), "mixture": mixture, "at_step": s,
                               "decay_steps": k})
                advance(1)
            rows += branch_rows(s, k, point, by_mixture)
            ctx.log_metrics({f"{branch_name(m, s, k)}.{r.source}.bits_per_byte": float(r.bits_per_byte)
                             for m, frame in by_mixture.items() for r in frame.itertuples()}, index)
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.to_parquet(ctx.out / "branches.parquet", index=False)
    record = {"requested": True, "trunk_key": trunk, "trunk_folder": str(folder), "peak_lr": peak_lr,
              "main_steps": main.budget.steps, "main_decay_start": main.budget.decay_start,
              "decay_shape": main.budget.decay_shape, "min_lr_ratio": main.min_lr_ratio, "mixtures": mixtures,
              "branches": listed, "main_run": _main_run_bpb(Path(ctx.inputs["main"]))}
    (ctx.out / "branches.json").write_text(json.dumps(record, indent=2))
    if cache.reused:
        print(f"branches: {cache.computed} branch run(s) trained, {cache.reused} reused from runs/cache/branches")
    # How many this call trained vs read back is run history (meta.json), not the result.
    return {"requested": True, "branches": len(listed), "computed": cache.computed, "reused": cache.reused,
            "stable_steps_trained": stable_trained, "trunk_key": trunk}


def branch_rows(at_step: int, decay_steps: int, point: pd.DataFrame, by_mixture: dict[str, pd.DataFrame]) -> list[dict]:
    """``COLUMNS`` rows of the branches at one (s, k): each source's loss, and its deltas to the branch point and to
    the main-mixture branch (bits per byte; negative = lower loss)."""
    at_point = point.set_index("source")
    reference = by_mixture[MAIN_MIXTURE].set_index("source")
    rows = []
    for mixture, frame in by_mixture.items():
        for r in frame.itertuples():
            bp = at_point.loc[r.source] if r.source in at_point.index else None
            vs_main = None
            if mixture != MAIN_MIXTURE and r.source in reference.index:
                vs_main = float(r.bits_per_byte) - float(reference.loc[r.source, "bits_per_byte"])
            rows.append({"branch": branch_name(mixture, at_step, decay_steps), "mixture": mixture, "at_step": at_step,
                         "decay_steps": decay_steps, "tokens_seen": int(r.tokens_seen), "source": r.source,
                         "tokens": int(r.tokens), "loss_nats": float(r.loss_nats),
                         "bits_per_byte": float(r.bits_per_byte),
                         "branch_point_loss_nats": float(bp["loss_nats"]) if bp is not None else None,
                         "branch_point_bits_per_byte": float(bp["bits_per_byte"]) if bp is not None else None,
                         "delta_bpb_vs_branch_point": (float(r.bits_per_byte) - float(bp["bits_per_byte"])
                                                       if bp is not None else None),
                         "delta_bpb_vs_main_mixture": vs_main})
    return rows


def continue_loader(trunk_state: dict, sampler: MixtureSampler) -> None:
    """Give ``sampler`` (other weights than the trunk's) the trunk loader's per-source row positions, rows drawn and
    batch count, with no carried remainders: each source the trunk read continues where it stopped.

    Raises:
        DataError: as ``MixtureSampler.load_state_dict`` (e.g. a shard that changed under the checkpoint).
    """
    state = sampler.state_dict()
    for source in sampler.sources:
        saved = trunk_state["position"].get(source)
        if saved is not None and saved["rows"] == state["position"][source]["rows"]:
            state["position"][source] = dict(saved)
            state["rows_drawn"][source] = int(trunk_state["rows_drawn"][source])
    state["batches_drawn"] = int(trunk_state["batches_drawn"])
    sampler.load_state_dict(state)


def _load_trunk(directory: Path, *, main: MainConfig, corpus: TokenizedCorpus, peak_lr: float, seed: int,
                accelerator: Any):
    model_cfg = main.model.build(corpus.vocab_size)
    model = parallelize(build_model(model_cfg, seed), accelerator, "ddp",
                        activation_checkpointing=main.distributed.activation_checkpointing)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=peak_lr, warmup_steps=main.budget.warmup_steps,
                                                   **main.budget.adamw.model_dump()))
    loaded = Checkpointer(directory.parent, accelerator=accelerator).load(directory, model=model, optimizer=optimizer)
    return model, optimizer, loaded, model_cfg


def score_point(directory: Path, *, main: MainConfig, corpus: TokenizedCorpus, peak_lr: float, seed: int,
                sources: list[str], accelerator: Any, **_: Any) -> pd.DataFrame:
    """Held-out loss per source of the stable checkpoint at ``directory`` (the branch point)."""
    model, _, loaded, model_cfg = _load_trunk(directory, main=main, corpus=corpus, peak_lr=peak_lr, seed=seed,
                                              accelerator=accelerator)
    evals = evaluate_sources(model, corpus, sources, seq_len=model_cfg.seq_len, eval_tokens=main.budget.eval_tokens)
    return _frame(evals, loaded["state"].tokens_seen)


def train_branch(directory: Path, *, weights: dict[str, float], at_step: int, decay_steps: int, main: MainConfig,
                 corpus: TokenizedCorpus, peak_lr: float, packing: Any, seed: int, sources: list[str],
                 accelerator: Any, trunk_weights: dict[str, float]) -> pd.DataFrame:
    """One branch: the stable checkpoint at step ``at_step`` (``directory``) trained ``decay_steps`` more steps on
    ``weights`` with the LR of ``tasks.train.schedule.branch_lr`` (WSD over at_step + decay_steps steps with that
    decay length, the main run's shape and floor), then scored per source. On the trunk's own weights the loader
    resumes exactly; on others it continues each source's position (``continue_loader``).

    Spike rewinds have no checkpoint to go back to inside a branch, so a spike skips its batch (``SpikePolicy``).
    """
    model, optimizer, loaded, model_cfg = _load_trunk(directory, main=main, corpus=corpus, peak_lr=peak_lr,
                                                      seed=seed, accelerator=accelerator)
    sampler = make_sampler(corpus, weights, seq_len=model_cfg.seq_len, batch_size=main.budget.batch_size, seed=seed,
                           packing=packing)
    if _same(weights, trunk_weights):
        sampler.load_state_dict(loaded["sampler_state"])
    else:
        continue_loader(loaded["sampler_state"], sampler)
    budget = main.budget.model_copy(update={"steps": at_step + decay_steps, "eval_every": 0})
    result = run_training(model, sampler, peak_lr=peak_lr, budget=budget, seed=seed, state=loaded["state"],
                          optimizer=optimizer, stability=main.stability, accelerator=accelerator,
                          min_lr_ratio=main.min_lr_ratio, decay_steps=decay_steps)
    evals = evaluate_sources(model, corpus, sources, seq_len=model_cfg.seq_len, eval_tokens=main.budget.eval_tokens)
    return _frame(evals, result.state.tokens_seen)


def _frame(evals, tokens_seen: int) -> pd.DataFrame:
    return pd.DataFrame([{"source": e.source, "tokens": int(e.loss.n_tokens), "loss_nats": float(e.loss.loss_nats),
                          "bits_per_byte": float(e.bits_per_byte), "tokens_seen": int(tokens_seen)} for e in evals])


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return set(a) == set(b) and all(abs(a[s] - b[s]) <= 1e-9 for s in a)


def _main_run_bpb(main_artifact: Path) -> dict[str, float]:
    """The main run's final held-out bits per byte per source, for reference."""
    heldout = pd.read_parquet(main_artifact / "heldout.parquet")
    return {r.source: float(r.bits_per_byte) for r in heldout.itertuples()}


class _Cache:
    """Per-branch and per-branch-point results under ``folder``, keyed as the module docstring says. Under
    ``--refresh branches`` (``ctx.reuses``) every entry is computed again and overwritten."""

    def __init__(self, folder: Path, *, tokenizer: str, trunk: str, main: MainConfig, sources: list[str],
                 ctx: StageContext):
        self.folder, self.tokenizer, self.trunk, self.ctx = Path(folder), tokenizer, trunk, ctx
        self.eval = {"eval_tokens": main.budget.eval_tokens, "sources": sorted(sources)}
        self.decay = {"decay_shape": main.budget.decay_shape, "min_lr_ratio": main.min_lr_ratio,
                      "stability": main.stability.model_dump()}
        self.code = code_version_closure("tasks.branches.stage")
        self.computed = self.reused = 0  # branches and branch points alike

    def point_key(self, at_step: int) -> str:
        return artifact_key("branch-point", {"trunk": self.trunk, "at_step": at_step, **self.eval},
                            {"tokenizer": self.tokenizer}, self.code)

    def branch_key(self, at_step: int, decay_steps: int, weights: dict[str, float]) -> str:
        config = {"trunk": self.trunk, "at_step": at_step, "decay_steps": decay_steps,
                  "weights": {s: round(w, 9) for s, w in sorted(weights.items())}, **self.decay, **self.eval}
        return artifact_key("decay-branch", config, {"tokenizer": self.tokenizer}, self.code)

    def has(self, key: str) -> bool:
        return self.ctx.reuses(key, (self.folder / f"{key}.parquet").is_file())

    def get(self, key: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        path = self.folder / f"{key}.parquet"
        if self.has(key):
            self.reused += 1
            return pd.read_parquet(path)
        frame = compute()
        ensure_folder(self.folder)
        with atomic_file(path) as f:  # whole or absent: a crash never leaves a half-written result
            frame.to_parquet(f, index=False)
        self.ctx.wrote(key)
        self.computed += 1
        return frame
