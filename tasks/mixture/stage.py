"""Mixture stage: one proxy model per candidate mixture, scored by held-out loss per general source.

Outputs: ``trials.parquet`` (candidate, source, weight, loss_nats, bits_per_byte, heldout_tokens, proxy_tokens),
``choice.json`` (the chosen mixture, the rule declared in the config, the margin to the runner-up) and
``mixture_loss.png`` (per-source loss per candidate). The epochs each source gets in the main run depend on
the main run's budget, so the main stage reports them; the mixture's key stays free of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from infra.stage import StageContext  # noqa: E402
from tasks.mixture.candidates import resolve_candidates  # noqa: E402
from tasks.mixture.config import MixtureConfig  # noqa: E402
from tasks.mixture.select import select_mixture  # noqa: E402
from tasks.tokenizer.stage import TokenizedCorpus  # noqa: E402
from tasks.train.runner import build_model, evaluate_sources, make_sampler, run_training  # noqa: E402
from tasks.train.sections import ProxyConfig  # noqa: E402
from tasks.tokenizer.config import PackingConfig  # noqa: E402


def run(ctx: StageContext, cfg: MixtureConfig, proxy: ProxyConfig, *, general: list[str],
        packing: PackingConfig = PackingConfig()) -> dict[str, Any]:
    """Train and score one proxy per candidate, then apply the declared selection rule."""
    corpus = TokenizedCorpus(ctx.inputs["tokenizer"])
    sizes = corpus.train_sizes(general)
    candidates = resolve_candidates(cfg, sizes)
    model_cfg = proxy.model.build(corpus.vocab_size)
    rows = []
    with ctx.progress.task("mixture: proxy per candidate", len(candidates)) as advance:
        for index, cand in enumerate(candidates):
            model = build_model(model_cfg, ctx.seed)
            sampler = make_sampler(corpus, cand.weights, seq_len=model_cfg.seq_len,
                                   batch_size=proxy.budget.batch_size, seed=ctx.seed, packing=packing)
            result = run_training(model, sampler, peak_lr=proxy.peak_lr, budget=proxy.budget, seed=ctx.seed)
            evals = evaluate_sources(model, corpus, general, seq_len=model_cfg.seq_len,
                                     eval_tokens=proxy.budget.eval_tokens)
            for e in evals:
                rows.append({"candidate": cand.name, "source": e.source, "weight": cand.weights.get(e.source, 0.0),
                             "loss_nats": e.loss.loss_nats, "bits_per_byte": e.bits_per_byte,
                             "heldout_tokens": int(e.loss.n_tokens), "proxy_tokens": int(result.state.tokens_seen)})
            ctx.log_metrics({f"{cand.name}.{e.source}.bits_per_byte": e.bits_per_byte for e in evals}, index)
            advance(1)
    trials = pd.DataFrame(rows)
    natural = next(c.name for c in candidates if c.alpha == 1.0 or c.name == "natural")
    choice = select_mixture(trials, cfg, natural=natural)
    chosen = next(c for c in candidates if c.name == choice.name)
    trials["chosen"] = trials["candidate"] == choice.name
    trials.to_parquet(ctx.out / "trials.parquet", index=False)
    record = {
        "name": choice.name, "weights": chosen.weights, "score": choice.score, "runner_up": choice.runner_up,
        "runner_up_score": choice.runner_up_score, "margin": choice.margin, "rule": choice.rule_text,
        "natural": natural, "scores": choice.scores.to_dict(orient="records"),
    }
    (ctx.out / "choice.json").write_text(json.dumps(record, indent=2, default=str))
    plot_trials(trials, ctx.out / "mixture_loss.png")
    return {"chosen": choice.name, "weights": chosen.weights, "margin": choice.margin}


def plot_trials(trials: pd.DataFrame, path: Path) -> None:
    """Grouped bars: held-out bits per byte per source (groups) and candidate (bars)."""
    table = trials.pivot(index="source", columns="candidate", values="bits_per_byte")
    ax = table.plot.bar(figsize=(7, 4), rot=0)
    ax.set_ylabel("held-out bits per byte")
    ax.set_title("Proxy held-out loss per source and candidate mixture")
    plt.tight_layout()
    plt.savefig(path, dpi=100)
    plt.close("all")


def load_choice(path: Path) -> dict[str, Any]:
    return json.loads((path / "choice.json").read_text())
