"""What the console summary and ``pretrain report`` show of the continued-pretraining artifact: the candidates'
grid (replay, peak LR, general and domain loss in nats, cloze accuracy)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, rich_table
from infra.stage import ReportContext, SummaryContext


def summary(ctx: SummaryContext) -> list[Any]:
    """The CPT candidates table."""
    candidates = json.loads((ctx.path / "candidates.json").read_text())
    cands = pd.DataFrame([{"candidate": k, "replay": d.get("replay_fraction"), "realised": d.get("realised_replay_fraction"),
                           "peak_lr": d.get("peak_lr"), "general nats": d["general_loss_nats"],
                           "domain nats": d["domain_loss_nats"], "cloze acc": d["cloze_accuracy"]}
                          for k, d in candidates.items()])
    return [rich_table("CPT candidates", cands.fillna("-"))]


def report(ctx: ReportContext) -> list[Block]:
    """The continued pretraining grid, base first."""
    candidates = json.loads((ctx.path / "candidates.json").read_text())
    grid = pd.DataFrame([{"candidate": k, "replay_fraction": d.get("replay_fraction"),
                          "realised_replay": d.get("realised_replay_fraction"), "peak_lr": d.get("peak_lr"),
                          "general_loss_nats": d.get("general_loss_nats"),
                          "domain_loss_nats": d.get("domain_loss_nats"), "cloze_accuracy": d.get("cloze_accuracy")}
                         for k, d in candidates.items()])
    return [Heading("Continued pretraining grid"), TableBlock("CPT candidates (base first)", grid.fillna("-"))]
