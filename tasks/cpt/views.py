"""What the console summary and ``pretrain report`` show of the continued-pretraining artifact: the candidates'
grid (replay, peak LR, general and domain loss in nats, cloze accuracy) and their text samples."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, rich_table
from infra.stage import ReportContext, SummaryContext
from tasks.train.samples import final_samples, read_samples, samples_block_frame, samples_table


def _context_frames(path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None:
    """A context extension's tables (docs/methods.md §15): the candidates with their forgetting and retrieval at
    the longest length, the loss by position bucket (one column per model), and retrieval accuracy by length (one
    column per model, accuracy with its interval); None for domain adaptation."""
    if not (path / "position_loss.parquet").exists():
        return None
    candidates = json.loads((path / "candidates.json").read_text())
    base = candidates["base"]
    grid = pd.DataFrame([{
        "candidate": name, "recipe": d.get("recipe"), "θ": f"{d.get('rope_theta', float('nan')):g}",
        "interp": f"{d.get('rope_scaling_factor', 1.0):g}", "replay": d.get("replay_fraction"),
        "realised": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
        "long nats": d["long_loss_nats"], "short nats": d["general_loss_nats"],
        "short Δ": d["general_loss_nats"] - base["general_loss_nats"], "cloze acc (sum)": d["cloze_accuracy"],
        f"retrieval@{d['retrieval_length']}": d["retrieval_accuracy"]} for name, d in candidates.items()])
    position = pd.read_parquet(path / "position_loss.parquet")
    position["bucket"] = position["bucket_start"].astype(str) + "–" + position["bucket_end"].astype(str)
    buckets = position.pivot_table(index=["bucket_start", "bucket"], columns="checkpoint", values="loss_nats",
                                   sort=False).reset_index(level=0, drop=True).reset_index()
    buckets = buckets.sort_values("bucket", key=lambda c: c.str.split("–").str[0].astype(int))
    retrieval = pd.read_parquet(path / "retrieval.parquet")
    overall = retrieval[retrieval["depth"].astype(str) == "all"].copy()
    overall["acc"] = overall.apply(lambda r: f"{r['accuracy']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]", axis=1)
    by_length = overall.pivot(index="length", columns="checkpoint", values="acc").reset_index()
    order = [c for c in candidates if c in by_length.columns]
    return grid, buckets[["bucket", *[c for c in candidates if c in buckets.columns]]], by_length[["length", *order]]


def supply_lines(path) -> list[str]:
    """A context extension's long stream per source (``context_supply.parquet``), and the candidates trained versus
    reused from the candidate cache when the artifact was built."""
    lines = []
    for r in pd.read_parquet(path / "context_supply.parquet").to_dict("records"):
        lines.append(f"  {r['source']} long stream ({r['construction']}): {r['long_documents']:,} of "
                     f"{r['documents']:,} documents longer than the {r['base_seq_len']}-token window, "
                     f"{r['long_token_share']:.0%} of its tokens; {r['beyond_window_tokens']:,} tokens "
                     f"({r['beyond_window_share']:.0%}) sit past position {r['base_seq_len']} of their own document "
                     f"in {r['target_seq_len']}-token rows")
    run = json.loads((path / "meta.json").read_text()).get("summary", {}) if (path / "meta.json").exists() else {}
    if "reused" in run:  # meta.json is the artifact's: a run that reuses the artifact shows how it was built
        lines.append(f"  when this artifact was built: {run['trained']} candidate(s) trained, {run['reused']} "
                     f"reused from the candidate cache (runs/cache/cpt), {run.get('scored', 0)} scored anew")
    return lines


def _recovery(entry: dict, candidates: dict, label: str) -> dict[str, Any]:
    """The recovery columns of one candidate table row (``label``: steps, then ``recovery_lr``, ``tokens_seen``),
    only when the grid has a recovery axis (``[cpt] recovery_steps``); the base's are empty."""
    if not any("recovery_steps" in d for d in candidates.values()):
        return {}
    return {label: entry.get("recovery_steps"), "recovery_lr": entry.get("recovery_lr"),
            "tokens_seen": entry.get("tokens_seen")}


def cache_lines(path) -> list[str]:
    """Domain adaptation: the candidate phases trained versus reused from the candidate cache when the artifact was
    built (none for artifacts written before the cache)."""
    run = json.loads((path / "meta.json").read_text()).get("summary", {}) if (path / "meta.json").exists() else {}
    if "reused" not in run:
        return []
    return [f"  when this artifact was built: {run['trained']} candidate phase(s) trained, {run['reused']} reused from "
            "the candidate cache (runs/cache/cpt)"]


def summary(ctx: SummaryContext) -> list[Any]:
    """The CPT candidates table with, below it, how the artifact was built (a context extension: also the long
    stream, loss by position and retrieval by length) and the candidates' text samples. The section opens with the
    table's title, so nothing of it is printed above."""
    context = _context_frames(ctx.path)
    if context is not None:
        grid, buckets, retrieval = context
        chance = pd.read_parquet(ctx.path / "retrieval.parquet")["chance"].iloc[0]
        out = [rich_table("Context extension candidates (short = the base window, long = the target window)",
                          grid.round(4).fillna("-")), *supply_lines(ctx.path),
               rich_table("Held-out loss by token position (nats/token; base: RoPE unchanged past its window)",
                          buckets.round(4)),
               rich_table(f"Passkey retrieval by prompt length (accuracy [95% Wilson]; chance {chance:.2f})",
                          retrieval)]
    else:
        candidates = json.loads((ctx.path / "candidates.json").read_text())
        cands = pd.DataFrame([{"candidate": k, "replay": d.get("replay_fraction"),
                               "realised": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
                               **_recovery(d, candidates, "recovery"),
                               "general nats": d["general_loss_nats"], "domain nats": d["domain_loss_nats"],
                               "cloze acc (sum)": d["cloze_accuracy"]} for k, d in candidates.items()])
        out = [rich_table("CPT candidates", cands.fillna("-")), *cache_lines(ctx.path)]
    samples = read_samples(ctx.path)
    if samples is not None and len(samples):
        last = final_samples(samples).rename(columns={"run": "candidate"})
        out.append(samples_table(f"CPT samples at each candidate's last step ({last['decoding'].iloc[0]})", last,
                                 ["candidate", "prompt", "completion"]))
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The continued pretraining grid, base first (a context extension: its position and retrieval tables)."""
    context = _context_frames(ctx.path)
    if context is not None:
        grid, buckets, retrieval = context
        return [Heading("Context extension"),
                TableBlock("Candidates (base first): RoPE base θ, interpolation factor, loss at the target window "
                           "(long) and at the base window (short), retrieval at the longest length", grid.fillna("-")),
                TableBlock("Held-out loss by token position bucket, nats/token (position_loss.parquet has the "
                           "intervals)", buckets.round(4)),
                TableBlock("Passkey retrieval accuracy by prompt length [95% Wilson interval]", retrieval)]
    candidates = json.loads((ctx.path / "candidates.json").read_text())
    grid = pd.DataFrame([{"candidate": k, "replay_fraction": d.get("replay_fraction"),
                          "realised_replay": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
                          **_recovery(d, candidates, "recovery_steps"),
                          "general_loss_nats": d.get("general_loss_nats"),
                          "domain_loss_nats": d.get("domain_loss_nats"), "cloze_accuracy": d.get("cloze_accuracy")}
                         for k, d in candidates.items()])
    out = [Heading("Continued pretraining grid"), TableBlock("CPT candidates (base first)", grid.fillna("-"))]
    samples = read_samples(ctx.path)
    if samples is not None and len(samples):
        out.append(TableBlock(f"Samples of each candidate at its evaluation points ({samples['decoding'].iloc[0]}; "
                              "step 0 is the base; MLflow table samples.json)",
                              samples_block_frame(samples.rename(columns={"run": "candidate"}),
                                                  ["candidate", "step", "prompt", "completion"])))
    return out
