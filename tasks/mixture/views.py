"""What the console summary and ``pretrain report`` show of the mixture artifact: the chosen mixture, the rule,
the leading candidates' scores with their seed intervals, the margin to the runner-up with its interval and the
verdict (docs/methods.md §14), ineligible candidates and the ranking's transfer across proxy sizes."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext


def summary(ctx: SummaryContext) -> list[Any]:
    """The chosen mixture and rule, the leading candidates' scores ± seed interval, the margin to the runner-up
    (bits/byte) with its interval and the verdict (and the fallback when undetermined), ineligible candidates, the
    regression proposal, the transfer check and the proxies trained versus reused."""
    choice = json.loads((ctx.path / "choice.json").read_text())
    weights = ", ".join(f"{k} {v:.3f}" for k, v in choice["weights"].items())
    out: list[Any] = [f"[bold]Mixture:[/] {choice['name']} ({weights})\n  rule: {choice['rule']}"]
    leading = [r for r in choice.get("scores", []) if r.get("seeds", 0) > 1 or r["candidate"] in
               (choice.get("leader"), choice.get("runner_up"))]
    if "verdict" in choice and leading:
        out.append("  leading candidates (mean over seeds, bits/byte): "
                   + "; ".join(f"{r['candidate']} {score_text(r)}" for r in leading))
    if choice.get("runner_up"):
        out.append(f"  margin of {choice.get('leader', choice['name'])} to the runner-up {choice['runner_up']}: "
                   f"{margin_text(choice)}")
    if "verdict" in choice:
        out.append(f"  verdict: {verdict_text(choice)}")
    for row in choice.get("scores", []):
        if not row.get("eligible", True):
            out.append(f"  {row['candidate']}: ineligible ({row.get('reason', '')})")
    if choice.get("proposal"):
        proposed = ", ".join(f"{k} {v:.3f}" for k, v in choice["proposal"]["weights"].items())
        out.append(f"  regression proposal ({proposed}) fitted on the experiment seed's trials, verified by a proxy "
                   "run; it competed under the same rule")
    if choice.get("transfer"):
        t = choice["transfer"]
        flips = "the winner flips" if t["winner_flips"] else "same winner"
        out.append(f"  proxy sizes d_model {t['d_model']['proxy']} vs {t['d_model']['transfer']} (experiment seed "
                   f"only): Kendall τ {t['tau']:.2f} ({flips}; {len(t['flipped_pairs'])} pair(s) swap order)")
    run = json.loads((ctx.path / "meta.json").read_text()).get("summary", {})
    if "proxies_reused" in run:
        # meta.json is the artifact's: a run that reuses the artifact shows how it was built, and says so.
        out.append(f"  when this artifact was built: proxies trained {run['proxies_trained']}, reused from cache "
                   f"{run['proxies_reused']}")
    return out


def score_text(row: dict[str, Any]) -> str:
    """``1.2345 [1.2301, 1.2390] (3 seeds)``, or ``1.2345 (1 seed)`` without a seed interval."""
    seeds = int(row.get("seeds", 1) or 1)
    low, high = row.get("score_low", math.nan), row.get("score_high", math.nan)
    if seeds < 2 or not (_finite(low) and _finite(high)):
        return f"{row['score']:.4f} (1 seed)" if seeds < 2 else f"{row['score']:.4f} ({seeds} seeds)"
    return f"{row['score']:.4f} [{low:.4f}, {high:.4f}] ({seeds} seeds)"


def margin_text(choice: dict[str, Any]) -> str:
    """The margin (bits/byte) and, when there is one, its interval over seeds and held-out documents."""
    text = f"{choice['margin']:.4f} bits/byte"
    m = choice.get("margin_interval")
    if m:
        seeds = len(m["seeds"])
        over = f"{seeds} seed{'s' if seeds != 1 else ''} × {m['clusters']} held-out documents"
        if abs(m["estimate"] - choice["margin"]) > 1e-9:  # one of them has seeds the other lacks
            return (f"{text} (each on its own seeds); on the {seeds} seed{'s' if seeds != 1 else ''} both have "
                    f"{m['estimate']:+.4f}, {m['confidence']:.0%} interval [{m['low']:+.4f}, {m['high']:+.4f}] "
                    f"over {m['clusters']} held-out documents")
        text += f", {m['confidence']:.0%} interval [{m['low']:+.4f}, {m['high']:+.4f}] over {over}"
    return text


def verdict_text(choice: dict[str, Any]) -> str:
    """``decided (why)``, or ``undetermined (why); fallback; to resolve: …``."""
    text = f"{choice['verdict']} ({choice.get('verdict_reason', '')})"
    if choice["verdict"] == "undetermined":
        text += f"; {choice.get('fallback', '')}; to resolve: {choice.get('resolve', '')}"
    return text


def _interval_cell(row: dict[str, Any]) -> str:
    low, high = row.get("score_low"), row.get("score_high")
    if _finite(low) and _finite(high):
        return f"[{low:.4f}, {high:.4f}]"
    return "1 seed" if int(row.get("seeds", 1) or 1) < 2 else ""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def report(ctx: ReportContext) -> list[Block]:
    """The mixture decision: rule, chosen weights, runner-up and margin with its interval, the verdict (and the
    fallback), ineligible candidates, the transfer check, the candidates' table (score ± seed interval, seeds) and
    the score figure (written into ``ctx.plots_dir``)."""
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
    if "score_low" in scores:
        scores.insert(scores.columns.get_loc("score") + 1, "seed interval",
                      [_interval_cell(r) for r in scores.to_dict(orient="records")])
        scores = scores.drop(columns=[c for c in ("score_low", "score_high", "vs_leader", "vs_leader_low",
                                                  "vs_leader_high", "separable") if c in scores])
    out: list[Block] = [Heading("Mixture decision"), Text(f"Rule: {choice['rule']}."),
                        Text(f"**Chosen:** {choice['name']} (" + ", ".join(f"{s} {w:.3f}" for s, w in
                                                                            choice["weights"].items()) + ")")]
    if choice.get("runner_up"):
        out.append(Text(f"Leader {choice.get('leader', choice['name'])}; runner-up {choice['runner_up']} "
                        f"({choice['runner_up_score']:.4f}); margin {margin_text(choice)}."))
    if "verdict" in choice:
        out.append(Text(f"**Decision:** {verdict_text(choice)}."))
    for row in choice["scores"]:
        if not row.get("eligible", True):
            out.append(Text(f"Ineligible: {row['candidate']}, {row.get('reason', '')}"))
    if choice.get("transfer"):
        t = choice["transfer"]
        out.append(Text(f"Kendall τ (experiment seed only) between proxy sizes d_model {t['d_model']['proxy']} and "
                        f"{t['d_model']['transfer']}: {t['tau']:.3f} (p = {t['p_value']:.3g}); winner "
                        f"{'flips' if t['winner_flips'] else 'stays'}; {len(t['flipped_pairs'])} pair(s) swap order."))
    out.append(TableBlock("Candidates: score under the rule, eligibility, weights", scores))
    (figure,) = mixture_figures(path, ctx.plots_dir)
    out.append(Figure(figure, "Score per candidate; the chosen one in orange, ineligible ones hatched"))
    return out
