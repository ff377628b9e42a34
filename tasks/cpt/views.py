"""What the console summary and ``pretrain report`` show of the continued-pretraining artifact: the candidates'
grid (replay, peak LR, general and domain loss in nats, cloze accuracy) and their text samples."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, rich_table
from infra.stage import ReportContext, SummaryContext
from tasks.train.samples import final_samples, read_samples, samples_block_frame, samples_table


def summary(ctx: SummaryContext) -> list[Any]:
    """The CPT candidates table."""
    candidates = json.loads((ctx.path / "candidates.json").read_text())
    cands = pd.DataFrame([{"candidate": k, "replay": d.get("replay_fraction"), "realised": d.get("realised_replay_fraction"),
                           "peak_lr": d.get("peak_lr"), "general nats": d["general_loss_nats"],
                           "domain nats": d["domain_loss_nats"], "cloze acc": d["cloze_accuracy"]}
                          for k, d in candidates.items()])
    out = [rich_table("CPT candidates", cands.fillna("-"))]
    samples = read_samples(ctx.path)
    if samples is not None and len(samples):
        last = final_samples(samples).rename(columns={"run": "candidate"})
        out.append(samples_table(f"CPT samples at each candidate's last step ({last['decoding'].iloc[0]})", last,
                                 ["candidate", "prompt", "completion"]))
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The continued pretraining grid, base first."""
    candidates = json.loads((ctx.path / "candidates.json").read_text())
    grid = pd.DataFrame([{"candidate": k, "replay_fraction": d.get("replay_fraction"),
                          "realised_replay": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
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
