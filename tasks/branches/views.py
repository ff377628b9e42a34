"""What the console summary and ``pretrain report`` show of the decay branches: per branch and source the held-out
bits per byte and its deltas to the branch point and to the main-mixture branch (docs/methods.md §6)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Heading, TableBlock, Text, rich_table
from infra.stage import ReportContext, SummaryContext

SHOWN = ["branch", "source", "tokens_seen", "bits_per_byte", "delta_bpb_vs_branch_point", "delta_bpb_vs_main_mixture"]


def branch_lines(record: dict[str, Any]) -> list[str]:
    """One line on where the branches come from: the trunk, the main run's decay start, shape and floor."""
    return [f"  decay branches from the stable phase of the main run (its decay follows step "
            f"{record['main_decay_start']:,} of {record['main_steps']:,}; shape {record['decay_shape']}, floor "
            f"{record['min_lr_ratio']:g} × peak; trunk {record['trunk_key']})"]


def summary(ctx: SummaryContext) -> list[Any]:
    """The branch table, or nothing when no branches were requested."""
    record = json.loads((ctx.path / "branches.json").read_text())
    if not record.get("requested"):
        return []
    table = pd.read_parquet(ctx.path / "branches.parquet")[SHOWN]
    return [rich_table("Decay branches: held-out bits per byte per source (Δ < 0: lower loss)", table),
            *branch_lines(record)]


def report(ctx: ReportContext) -> list[Block]:
    """The branch settings and the full branch table, with the main run's own bits per byte per source; nothing
    when no branches were requested."""
    record = json.loads((ctx.path / "branches.json").read_text())
    if not record.get("requested"):
        return []
    out: list[Block] = [Heading("Decay branches")]
    table = pd.read_parquet(ctx.path / "branches.parquet")
    out += [Text(branch_lines(record)[0].strip()), TableBlock("Held-out loss per branch and source", table[SHOWN])]
    if record.get("main_run"):
        main = pd.DataFrame([{"source": s, "bits_per_byte": v} for s, v in record["main_run"].items()])
        out.append(TableBlock(f"Main run after its full decay ({record['main_steps']:,} steps)", main))
    return out
