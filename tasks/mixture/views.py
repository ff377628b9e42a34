"""What the console summary and ``pretrain report`` show of the mixture artifact: the chosen mixture, the rule,
the runner-up, ineligible candidates and the ranking's transfer across proxy sizes."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext


def summary(ctx: SummaryContext) -> list[Any]:
    """The chosen mixture and rule, the margin to the runner-up (bits/byte), ineligible candidates, the regression
    proposal, the transfer check and the proxies trained versus reused."""
    choice = json.loads((ctx.path / "choice.json").read_text())
    weights = ", ".join(f"{k} {v:.3f}" for k, v in choice["weights"].items())
    out: list[Any] = [f"[bold]Mixture:[/] {choice['name']} ({weights})\n  rule: {choice['rule']}"]
    if choice.get("runner_up"):
        out.append(f"  margin to the runner-up {choice['runner_up']}: {choice['margin']:.4f} bits/byte")
    for row in choice.get("scores", []):
        if not row.get("eligible", True):
            out.append(f"  {row['candidate']}: ineligible ({row.get('reason', '')})")
    if choice.get("proposal"):
        proposed = ", ".join(f"{k} {v:.3f}" for k, v in choice["proposal"]["weights"].items())
        out.append(f"  regression proposal ({proposed}) verified by a proxy run; it competed under the same rule")
    if choice.get("transfer"):
        t = choice["transfer"]
        flips = "the winner flips" if t["winner_flips"] else "same winner"
        out.append(f"  proxy sizes d_model {t['d_model']['proxy']} vs {t['d_model']['transfer']}: Kendall τ "
                   f"{t['tau']:.2f} ({flips}; {len(t['flipped_pairs'])} pair(s) swap order)")
    run = json.loads((ctx.path / "meta.json").read_text()).get("summary", {})
    if "proxies_reused" in run:
        # meta.json is the artifact's: a run that reuses the artifact shows how it was built, and says so.
        out.append(f"  when this artifact was built: proxies trained {run['proxies_trained']}, reused from cache "
                   f"{run['proxies_reused']}")
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The mixture decision: rule, chosen weights, runner-up and margin, ineligible candidates, the transfer
    check, the candidates' table and the score figure (written into ``ctx.plots_dir``)."""
    from tasks.mixture.plots import mixture_figures

    path = ctx.path
    choice = json.loads((path / "choice.json").read_text())
    trials = pd.read_parquet(path / "trials.parquet")
    at_proxy = trials[trials["proxy"] == "proxy"] if "proxy" in trials else trials
    weights = at_proxy.pivot_table(index="candidate", columns="source", values="weight", aggfunc="first")
    scores = pd.DataFrame(choice["scores"]).merge(weights.round(3).reset_index(), on="candidate", how="left")
    scores.insert(1, "chosen", scores["candidate"].eq(choice["name"]).map({True: "yes", False: ""}))
    if "eligible" in scores:
        scores["eligible"] = scores["eligible"].map({True: "yes", False: "no"})
    out: list[Block] = [Heading("Mixture decision"), Text(f"Rule: {choice['rule']}."),
                        Text(f"**Chosen:** {choice['name']} (" + ", ".join(f"{s} {w:.3f}" for s, w in
                                                                            choice["weights"].items()) + ")")]
    if choice.get("runner_up"):
        out.append(Text(f"Runner-up {choice['runner_up']} ({choice['runner_up_score']:.4f}); margin "
                        f"{choice['margin']:.4f}."))
    for row in choice["scores"]:
        if not row.get("eligible", True):
            out.append(Text(f"Ineligible: {row['candidate']}, {row.get('reason', '')}"))
    if choice.get("transfer"):
        t = choice["transfer"]
        out.append(Text(f"Kendall τ between proxy sizes d_model {t['d_model']['proxy']} and "
                        f"{t['d_model']['transfer']}: {t['tau']:.3f} (p = {t['p_value']:.3g}); winner "
                        f"{'flips' if t['winner_flips'] else 'stays'}; {len(t['flipped_pairs'])} pair(s) swap order."))
    out.append(TableBlock("Candidates: score under the rule, eligibility, weights", scores))
    (figure,) = mixture_figures(path, ctx.plots_dir)
    out.append(Figure(figure, "Score per candidate; the chosen one in orange, ineligible ones hatched"))
    return out
