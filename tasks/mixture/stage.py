"""Mixture stage: one proxy model per candidate mixture, scored by held-out loss per general source.

Outputs: ``trials.parquet`` (candidate, proxy size, d_model, source, weight, loss_nats, bits_per_byte,
heldout_tokens, proxy_tokens, unique_train_tokens, chosen), ``choice.json`` (the chosen mixture, the rule declared in the config, the
margin to the runner-up, the proposal and the rank agreement between proxy sizes when configured) and
``mixture_loss.png`` (per-source loss per candidate, a panel per proxy size). The epochs each source gets in the main run depend on
the main run's budget, so the main stage reports them; the mixture's key stays free of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from infra.artifacts import artifact_key, code_version  # noqa: E402
from infra.atomic import atomic_file  # noqa: E402
from infra.stage import StageContext  # noqa: E402
from tasks.mixture.candidates import ResolvedCandidate, resolve_candidates  # noqa: E402
from tasks.mixture.config import NATURAL_NAME, PROPOSED_NAME, MixtureConfig  # noqa: E402
from tasks.mixture.design import propose_mixture, rank_agreement  # noqa: E402
from tasks.mixture.select import select_mixture  # noqa: E402
from tasks.train.corpus import TokenizedCorpus  # noqa: E402
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training  # noqa: E402
from tasks.train.sections import ModelShape, ProxyConfig  # noqa: E402
from tasks.train.packing import PackingConfig  # noqa: E402


PROXY_CODE = ("tasks.mixture", "tasks.train", "models", "evals.heldout")


def run(ctx: StageContext, cfg: MixtureConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Train and score one proxy per candidate (at each proxy size), then apply the declared selection rule.

    Every proxy's result is cached on its own, keyed by its weights, shape, budget, LR, packing, seed, tokenizer
    and code (``<runs>/cache/proxies/``), so adding a candidate trains only that candidate.
    """
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    sizes = corpus.train_sizes(general)
    candidates = resolve_candidates(cfg, sizes)
    natural = next(c.name for c in candidates if c.alpha == 1.0 or c.name == NATURAL_NAME)
    shapes = {"proxy": proxy.model} | ({"transfer": cfg.transfer_model} if cfg.transfer_model else {})
    trainer = _ProxyTrainer(ctx, corpus, proxy, general, packing)
    rows = []
    with ctx.progress.task("mixture: proxy per candidate", len(candidates) * len(shapes) + int(cfg.propose)) as advance:
        for size, shape in shapes.items():
            for index, cand in enumerate(candidates):
                rows += trainer.rows(cand.name, cand.weights, size, shape, step=index)
                advance(1)
        trials = pd.DataFrame(rows)
        names = [c.name for c in candidates]
        proposal = None
        if cfg.propose:
            at_proxy = trials[trials["proxy"] == "proxy"]
            proposal = propose_mixture(at_proxy, _score_weights(at_proxy, natural, cfg.rule))
            weights = {s: proposal.weights.get(s, 0.0) for s in sizes}
            trials = pd.concat([trials, pd.DataFrame(trainer.rows(PROPOSED_NAME, weights, "proxy", proxy.model,
                                                                  step=len(candidates)))], ignore_index=True)
            candidates.append(ResolvedCandidate(PROPOSED_NAME, weights, None))
            names.append(PROPOSED_NAME)
            advance(1)
    at_proxy = trials[trials["proxy"] == "proxy"].drop(columns=["proxy", "d_model"])
    choice = select_mixture(at_proxy, cfg, natural=natural, names=names)
    chosen = next(c for c in candidates if c.name == choice.name)
    trials["chosen"] = trials["candidate"] == choice.name
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    record = {
        "name": choice.name, "weights": chosen.weights, "score": choice.score, "runner_up": choice.runner_up,
        "runner_up_score": choice.runner_up_score, "margin": choice.margin, "rule": choice.rule_text,
        "natural": natural, "scores": choice.scores.to_dict(orient="records"),
    }  # how many proxies this call trained vs read back is run history (meta.json), not the decision
    if proposal is not None:
        record["proposal"] = {"weights": proposal.weights, "predicted_bpb": proposal.predicted_bpb,
                              "predicted_score": proposal.predicted_score, "fit": proposal.fit.to_dict(orient="records")}
    if cfg.transfer_model is not None:
        record["transfer"] = _transfer(trials, cfg, natural, [c.name for c in candidates if c.name != PROPOSED_NAME],
                                       proxy.model.d_model, cfg.transfer_model.d_model)
    (ctx.out / "choice.json").write_text(json.dumps(record, indent=2, default=str))
    plot_trials(trials, ctx.out / "mixture_loss.png")
    summary = {"chosen": choice.name, "weights": chosen.weights, "margin": choice.margin,
               "proxies_trained": trainer.trained, "proxies_reused": trainer.reused}
    if "transfer" in record:
        summary["kendall_tau"] = record["transfer"]["tau"]
    return summary


class _ProxyTrainer:
    """Trains (or reads back from the proxy cache) one proxy and returns its per-source rows."""

    def __init__(self, ctx: StageContext, corpus: TokenizedCorpus, proxy: ProxyConfig, general: list[str],
                 packing: PackingConfig):
        self.ctx, self.corpus, self.proxy, self.general, self.packing = ctx, corpus, proxy, general, packing
        self.folder = ctx.layout.root / "cache" / "proxies"
        self.code = code_version(*PROXY_CODE)
        self.unique = corpus.train_sizes(general)  # U_s per source, read once for every row
        self.trained = self.reused = 0

    def key(self, weights: dict[str, float], shape: ModelShape) -> str:
        config = {"weights": {s: round(w, 9) for s, w in sorted(weights.items())}, "model": shape.model_dump(),
                  "budget": self.proxy.budget.model_dump(), "peak_lr": self.proxy.peak_lr,
                  "packing": self.packing.model_dump(), "seed": self.ctx.seed, "eval_sources": sorted(self.general)}
        return artifact_key("mixture-proxy", config, {"tokenizer": Path(self.ctx.inputs["tokenizer"]).name}, self.code)

    def rows(self, name: str, weights: dict[str, float], size: str, shape: ModelShape, *, step: int) -> list[dict]:
        path = self.folder / f"{self.key(weights, shape)}.parquet"
        if path.is_file():
            scored = pd.read_parquet(path)
            self.reused += 1
        else:
            scored = self._train(weights, shape)
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as f:  # whole or absent: a crash never leaves a half-written result
                scored.to_parquet(f, index=False)
            self.trained += 1
        prefix = "" if size == "proxy" else f"{size}."
        self.ctx.log_metrics({f"{prefix}{name}.{r.source}.bits_per_byte": r.bits_per_byte
                              for r in scored.itertuples()}, step)
        return [{"candidate": name, "proxy": size, "d_model": shape.d_model, "source": r.source,
                 "weight": weights.get(r.source, 0.0), "loss_nats": r.loss_nats, "bits_per_byte": r.bits_per_byte,
                 "heldout_tokens": int(r.heldout_tokens), "proxy_tokens": int(r.proxy_tokens),
                 "unique_train_tokens": int(self.unique.get(r.source, 0))}
                for r in scored.itertuples()]

    def _train(self, weights: dict[str, float], shape: ModelShape) -> pd.DataFrame:
        model_cfg = shape.build(self.corpus.vocab_size)
        model = build_model(model_cfg, self.ctx.seed)
        sampler = make_sampler(self.corpus, weights, seq_len=model_cfg.seq_len,
                               batch_size=self.proxy.budget.batch_size, seed=self.ctx.seed, packing=self.packing)
        result = run_training(model, sampler, peak_lr=self.proxy.peak_lr, budget=self.proxy.budget,
                              seed=self.ctx.seed)
        evals = evaluate_sources(model, self.corpus, self.general, seq_len=model_cfg.seq_len,
                                 eval_tokens=self.proxy.budget.eval_tokens)
        return pd.DataFrame([{"source": e.source, "loss_nats": e.loss.loss_nats, "bits_per_byte": e.bits_per_byte,
                              "heldout_tokens": int(e.loss.n_tokens), "proxy_tokens": int(result.state.tokens_seen)}
                             for e in evals])


def _score_weights(trials: pd.DataFrame, natural: str, rule: str) -> dict[str, float]:
    """Per-source weight of the selection score: held-out tokens (token-weighted rule) or equal (plain mean)."""
    rows = trials[trials["candidate"] == natural]
    if rule == "min_token_weighted_bpb":
        return {r.source: float(r.heldout_tokens) for r in rows.itertuples()}
    return {r.source: 1.0 for r in rows.itertuples()}


def _transfer(trials: pd.DataFrame, cfg: MixtureConfig, natural: str, names: list[str], small_width: int,
              large_width: int) -> dict[str, Any]:
    """Scores under the declared rule at both proxy sizes and their rank agreement (Kendall τ)."""
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
    """Grouped bars, one panel per proxy size: held-out bits per byte per source (groups) and candidate (bars)."""
    sizes = list(dict.fromkeys(trials["proxy"])) if "proxy" in trials else [None]
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        rows = trials if size is None else trials[trials["proxy"] == size]
        table = rows.pivot(index="source", columns="candidate", values="bits_per_byte")
        table.plot.bar(ax=ax, rot=0)
        ax.set_ylabel("held-out bits per byte")
        width = "" if size is None else f" (d_model {int(rows['d_model'].iloc[0])})"
        ax.set_title(f"Proxy held-out loss per source and candidate{width}")
    plt.tight_layout()
    plt.savefig(path, dpi=100)
    plt.close("all")

