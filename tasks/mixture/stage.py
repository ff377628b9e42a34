"""Mixture stage: proxy models per candidate mixture, scored by held-out loss per general source, and a decision
that says when seed noise leaves it open (docs/methods.md §14).

Round 1 trains every candidate at the experiment seed (and at the transfer size when configured; then the
regression proposal, fitted on those trials). Round 2 trains the ``top_k`` leading eligible candidates of round 1 at
``seeds − 1`` derived seeds more (``tasks.mixture.decide.derived_seeds``), and repeats while the extra seeds move a
candidate without them into the top ``top_k`` by mean. The transfer check and the proposal's fit
use the experiment seed only. ``tasks.mixture.decide`` then scores every candidate on the mean over its seeds and
puts an interval on the leader's margin over the runner-up.

Outputs: ``trials.parquet`` (candidate, proxy size, d_model, seed, source, weight, loss_nats, bits_per_byte,
heldout_tokens, proxy_tokens, unique_train_tokens, chosen; one row per candidate × size × seed × source),
``windows.parquet`` (the proxy-size runs' per-window held-out nats, ``decide.WINDOW_COLUMNS``), ``choice.json``
(the chosen mixture, each candidate's mean score with its seed interval, the margin with its interval, the verdict,
the decision record under ``"decision"``, the proposal and the rank agreement between proxy sizes when configured)
and ``mixture_loss.png`` (per-source loss per candidate, mean over seeds, a panel per proxy size). The epochs each
source gets in the main run depend on the main run's budget, so the main stage reports them; the mixture's key
stays free of it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from evals.decision import DecisionRecord  # noqa: E402
from evals.heldout import window_documents  # noqa: E402
from infra.artifacts import artifact_key, code_version  # noqa: E402
from infra.atomic import atomic_file  # noqa: E402
from infra.json_safe import dumps  # noqa: E402
from infra.stage import StageContext  # noqa: E402
from tasks.mixture.candidates import ResolvedCandidate, resolve_candidates  # noqa: E402
from tasks.mixture.config import NATURAL_NAME, PROPOSED_NAME, MixtureConfig  # noqa: E402
from tasks.mixture.decide import (WINDOW_COLUMNS, MixtureDecision, decide, derived_seeds, leading,  # noqa: E402
                                  rule_config, rule_text)
from tasks.mixture.design import propose_mixture, rank_agreement  # noqa: E402
from tasks.mixture.select import select_mixture  # noqa: E402
from tasks.train.corpus import TokenizedCorpus  # noqa: E402
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training  # noqa: E402
from tasks.train.sections import ModelShape, ProxyConfig  # noqa: E402
from tasks.train.packing import PackingConfig  # noqa: E402


PROXY_CODE = ("tasks.mixture", "tasks.train", "models", "evals.heldout")


def run(ctx: StageContext, cfg: MixtureConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig(), languages: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Train and score the proxies of both rounds, then apply the declared rule with its uncertainty.

    ``languages`` (source → declared language) groups the sources of a candidate whose temperature is over
    languages (``alpha_over = "language"``, ``tasks.mixture.candidates.language_temperature_weights``).

    Every proxy's result is cached on its own, keyed by its weights, shape, budget, LR, packing, seed, tokenizer
    and code (``<runs>/cache/proxies/``), so adding a candidate or a seed trains only what is new.
    """
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    sizes = corpus.train_sizes(general)
    candidates = resolve_candidates(cfg, sizes, languages)
    natural = next(c.name for c in candidates if c.alpha == 1.0 or c.name == NATURAL_NAME)
    record = DecisionRecord.declare("mixture", rule=rule_text(cfg, natural), rule_config=rule_config(cfg))
    shapes = {"proxy": proxy.model} | ({"transfer": cfg.transfer_model} if cfg.transfer_model else {})
    trainer = _ProxyTrainer(ctx, corpus, proxy, general, packing)
    seeds = derived_seeds(ctx.seed, cfg.seeds)
    rows: list[dict] = []
    windows: list[pd.DataFrame] = []

    def train(name: str, weights: dict[str, float], size: str, seed: int, step: int) -> None:
        scored, per_window = trainer.rows(name, weights, size, shapes[size], seed=seed, step=step)
        rows.extend(scored)
        if size == "proxy":
            windows.append(per_window.assign(candidate=name, seed=seed)[WINDOW_COLUMNS])

    with ctx.progress.task("mixture: proxy per candidate", len(candidates) * len(shapes) + int(cfg.propose)) as advance:
        for size in shapes:
            for index, cand in enumerate(candidates):
                advance(0, doing=f"training {cand.name} ({size} model)")
                train(cand.name, cand.weights, size, ctx.seed, index)
                advance(1)
        names = [c.name for c in candidates]
        proposal = None
        if cfg.propose:
            at_proxy = pd.DataFrame(rows).query("proxy == 'proxy'")
            proposal = propose_mixture(at_proxy, _score_weights(at_proxy, natural, cfg.rule))
            weights = {s: proposal.weights.get(s, 0.0) for s in sizes}
            train(PROPOSED_NAME, weights, "proxy", ctx.seed, len(candidates))
            candidates.append(ResolvedCandidate(PROPOSED_NAME, weights, None))
            names.append(PROPOSED_NAME)
            advance(1)
    by_name = {c.name: c for c in candidates}
    seeded: set[str] = set()
    # More seeds can reorder the leaders, so round 2 repeats until the top_k by mean all have every seed (at most
    # one pass per candidate).
    with ctx.progress.task("mixture: more seeds for the leading candidates", None) as advance:
        while cfg.seeds > 1:
            top = [n for n in leading(_at_proxy(pd.DataFrame(rows)), cfg, natural=natural, names=names)
                   if n not in seeded]
            if not top:
                break
            for name in top:
                for seed in seeds[1:]:
                    advance(0, doing=f"training {name}, seed {seed}")
                    train(name, by_name[name].weights, "proxy", seed, names.index(name))
                    advance(1)
                seeded.add(name)
    trials = pd.DataFrame(rows)
    window_frame = pd.concat(windows, ignore_index=True)
    tokens_per_byte = {s: corpus.tokens_per_byte(s, "heldout") for s in general if corpus.has(s, "heldout")}
    decision = decide(_at_proxy(trials), window_frame, cfg, natural=natural, names=names,
                      weights={c.name: c.weights for c in candidates}, unique=trainer.unique,
                      tokens_per_byte=tokens_per_byte, seed=ctx.seed)
    record = decision.settle(record, cfg.confidence, {"table": "mixture_trials", "artifact_key": ctx.key,
                                                       "windows": "windows.parquet"})
    trials["chosen"] = trials["candidate"] == decision.choice
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    window_frame.to_parquet(ctx.out / "windows.parquet", index=False)
    result = _choice_record(decision, record, by_name, natural, ctx.seed, seeds, cfg.confidence)
    # how many proxies this call trained vs read back is run history (meta.json), not the decision
    if proposal is not None:
        result["proposal"] = {"weights": proposal.weights, "predicted_bpb": proposal.predicted_bpb,
                              "predicted_score": proposal.predicted_score, "fit": proposal.fit.to_dict(orient="records"),
                              "seeds": "fitted on the experiment seed's trials"}
    if cfg.transfer_model is not None:
        result["transfer"] = _transfer(trials[trials["seed"] == ctx.seed], cfg, natural,
                                       [c.name for c in candidates if c.name != PROPOSED_NAME],
                                       proxy.model.d_model, cfg.transfer_model.d_model)
    (ctx.out / "choice.json").write_text(dumps(result, indent=2, default=str))
    plot_trials(trials, ctx.out / "mixture_loss.png")
    if trainer.reused:
        print(f"mixture: {trainer.trained} proxy run(s) trained, {trainer.reused} reused from runs/cache/proxies")
    margin = decision.margin
    summary = {"chosen": decision.choice, "weights": by_name[decision.choice].weights,
               "margin": decision.selection.margin, "verdict": decision.verdict,
               "margin_low": margin.low if margin else math.nan, "margin_high": margin.high if margin else math.nan,
               "proxies_trained": trainer.trained, "proxies_reused": trainer.reused}
    if "transfer" in result:
        summary["kendall_tau"] = result["transfer"]["tau"]
    return summary


def _at_proxy(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[trials["proxy"] == "proxy"].drop(columns=["proxy", "d_model"])


def _choice_record(decision: MixtureDecision, record: DecisionRecord, by_name: dict[str, ResolvedCandidate],
                   natural: str, experiment_seed: int, seeds: list[int], confidence: float) -> dict[str, Any]:
    """``choice.json``: ``name``/``weights`` are the final choice (after any fallback); ``runner_up`` and ``margin``
    are the rule's runner-up to the leader and its seed-averaged margin (bits/byte)."""
    selection, margin = decision.selection, decision.margin
    scores = selection.scores.merge(decision.candidates.drop(columns="score"), on="candidate", how="left")
    chosen_score = scores.set_index("candidate")["score"].get(decision.choice)
    return {
        "name": decision.choice, "weights": by_name[decision.choice].weights, "score": float(chosen_score),
        "leader": decision.leader, "runner_up": selection.runner_up, "runner_up_score": selection.runner_up_score,
        "margin": selection.margin, "rule": record.rule, "natural": natural,
        "verdict": decision.verdict, "verdict_reason": decision.reason, "fallback": decision.fallback,
        "resolve": decision.resolve, "fallback_pool": decision.pool,
        "margin_interval": None if margin is None else margin.as_dict() | {"confidence": confidence},
        "seeds": {"experiment": experiment_seed, "derived": seeds[1:], "by_candidate": decision.seeds},
        "scores": scores.to_dict(orient="records"), "decision": record.as_dict(),
    }


class _ProxyTrainer:
    """Trains (or reads back from the proxy cache) one proxy and returns its per-source rows and per-window
    held-out losses. A refreshed stage (``ctx.refresh``) trains every proxy again and overwrites its cache entry."""

    def __init__(self, ctx: StageContext, corpus: TokenizedCorpus, proxy: ProxyConfig, general: list[str],
                 packing: PackingConfig):
        self.ctx, self.corpus, self.proxy, self.general, self.packing = ctx, corpus, proxy, general, packing
        self.folder = ctx.layout.root / "cache" / "proxies"
        self.code = code_version(*PROXY_CODE)
        self.unique = corpus.train_sizes(general)  # U_s per source, read once for every row
        self.trained = self.reused = 0

    def key(self, weights: dict[str, float], shape: ModelShape, seed: int) -> str:
        config = {"weights": {s: round(w, 9) for s, w in sorted(weights.items())}, "model": shape.model_dump(),
                  "budget": self.proxy.budget.model_dump(), "peak_lr": self.proxy.peak_lr,
                  "packing": self.packing.model_dump(), "seed": int(seed), "eval_sources": sorted(self.general)}
        return artifact_key("mixture-proxy", config, {"tokenizer": Path(self.ctx.inputs["tokenizer"]).name}, self.code)

    def rows(self, name: str, weights: dict[str, float], size: str, shape: ModelShape, *, seed: int,
             step: int) -> tuple[list[dict], pd.DataFrame]:
        """The proxy's rows (one per source) and its held-out windows (source, window, doc, nats, tokens).

        ``seed`` seeds the initialisation and the data order. The per-source result is written last, so a result
        on disk always has its windows beside it."""
        key = self.key(weights, shape, seed)
        path, windows_path = self.folder / f"{key}.parquet", self.folder / f"{key}.windows.parquet"
        if self.ctx.reuses(key, path.is_file() and windows_path.is_file()):
            scored, windows = pd.read_parquet(path), pd.read_parquet(windows_path)
            self.reused += 1
        else:
            scored, windows = self._train(weights, shape, seed)
            self.folder.mkdir(parents=True, exist_ok=True)
            for frame, target in ((windows, windows_path), (scored, path)):
                with atomic_file(target) as f:  # whole or absent: a crash never leaves a half-written result
                    frame.to_parquet(f, index=False)
            self.ctx.wrote(key)
            self.trained += 1
        prefix = "" if size == "proxy" else f"{size}."
        tag = "" if seed == self.ctx.seed else f"seed{seed}."
        self.ctx.log_metrics({f"{prefix}{name}.{tag}{r.source}.bits_per_byte": r.bits_per_byte
                              for r in scored.itertuples()}, step)
        return [{"candidate": name, "proxy": size, "d_model": shape.d_model, "seed": int(seed), "source": r.source,
                 "weight": weights.get(r.source, 0.0), "loss_nats": r.loss_nats, "bits_per_byte": r.bits_per_byte,
                 "heldout_tokens": int(r.heldout_tokens), "proxy_tokens": int(r.proxy_tokens),
                 "unique_train_tokens": int(self.unique.get(r.source, 0))}
                for r in scored.itertuples()], windows

    def _train(self, weights: dict[str, float], shape: ModelShape, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        model_cfg = shape.build(self.corpus.vocab_size)
        model = build_model(model_cfg, seed)
        sampler = make_sampler(self.corpus, weights, seq_len=model_cfg.seq_len,
                               batch_size=self.proxy.budget.batch_size, seed=seed, packing=self.packing)
        result = run_training(model, sampler, peak_lr=self.proxy.peak_lr, budget=self.proxy.budget, seed=seed)
        evals = evaluate_sources(model, self.corpus, self.general, seq_len=model_cfg.seq_len,
                                 eval_tokens=self.proxy.budget.eval_tokens)
        scored = pd.DataFrame([{"source": e.source, "loss_nats": e.loss.loss_nats, "bits_per_byte": e.bits_per_byte,
                                "heldout_tokens": int(e.loss.n_tokens), "proxy_tokens": int(result.state.tokens_seen)}
                               for e in evals])
        windows = []
        for e in evals:
            n = len(e.loss.window_nats)
            docs = window_documents(self.corpus.stream(e.source, "heldout").doc_offsets, n, model_cfg.seq_len)
            windows.append(pd.DataFrame({"source": e.source, "window": range(n), "doc": docs,
                                         "nats": e.loss.window_nats, "tokens": e.loss.window_tokens}))
        return scored, pd.concat(windows, ignore_index=True)


def _score_weights(trials: pd.DataFrame, natural: str, rule: str) -> dict[str, float]:
    """Per-source weight of the selection score: held-out tokens (token-weighted rule) or equal (plain mean)."""
    rows = trials[trials["candidate"] == natural]
    if rule == "min_token_weighted_bpb":
        return {r.source: float(r.heldout_tokens) for r in rows.itertuples()}
    return {r.source: 1.0 for r in rows.itertuples()}


def _transfer(trials: pd.DataFrame, cfg: MixtureConfig, natural: str, names: list[str], small_width: int,
              large_width: int) -> dict[str, Any]:
    """Scores under the declared rule at both proxy sizes and their rank agreement (Kendall τ), on ``trials`` of one
    seed (the experiment seed: the transfer size trains there only)."""
    scores = {}
    for size in ("proxy", "transfer"):
        at_size = trials[(trials["proxy"] == size) & trials["candidate"].isin(names)].drop(columns=["proxy", "d_model"])
        table = select_mixture(at_size, cfg, natural=natural, names=names).scores
        scores[size] = table.set_index("candidate")["score"]
    agreement = rank_agreement(scores["proxy"], scores["transfer"])
    return {"d_model": {"proxy": small_width, "transfer": large_width}, "tau": agreement.tau,
            "p_value": agreement.p_value, "best": {"proxy": agreement.best_small, "transfer": agreement.best_large},
            "winner_flips": agreement.winner_flips, "flipped_pairs": agreement.flipped_pairs,
            "scores": {size: {k: float(v) for k, v in table.items()} for size, table in scores.items()}}


def plot_trials(trials: pd.DataFrame, path: Path) -> None:
    """Grouped bars, one panel per proxy size: held-out bits per byte per source (groups) and candidate (bars),
    the mean over the candidate's seeds."""
    sizes = list(dict.fromkeys(trials["proxy"])) if "proxy" in trials else [None]
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        rows = trials if size is None else trials[trials["proxy"] == size]
        table = rows.pivot_table(index="source", columns="candidate", values="bits_per_byte", aggfunc="mean")
        table.plot.bar(ax=ax, rot=0)
        ax.set_ylabel("held-out bits per byte")
        width = "" if size is None else f" (d_model {int(rows['d_model'].iloc[0])})"
        ax.set_title(f"Proxy held-out loss per source and candidate{width}")
    plt.tight_layout()
    plt.savefig(path, dpi=100)
    plt.close("all")

