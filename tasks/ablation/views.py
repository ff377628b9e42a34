"""What the console summary and ``pretrain report`` show of the quality ablation: per source, bits per byte with
and without the classifier's removals, Δ with its interval, and the verdict."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text
from infra.stage import ReportContext, SummaryContext


def _record(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "ablation.json").read_text())


def interval_text(low: float, high: float, docs: int) -> str:
    """``[low, high]`` in bits/byte, or why there is none (a single held-out document)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return f"no interval ({docs} held-out document)"
    return f"[{low:+.4f}, {high:+.4f}]"


def _seed_sd(sd: float | None) -> str:
    if sd is None or math.isnan(sd):
        return "one seed: training noise not measured, so nothing is decided"
    return f"seed sd {sd:.4f}"


def _headline(record: dict[str, Any]) -> str:
    o = record["overall"]
    training = record.get("removed_docs_training", record["removed_docs"])
    untrained = record["removed_docs"] - training
    other = f"; {untrained:,} removed from sources the proxy does not train on" if untrained else ""
    return (f"{record['readded_docs']:,} of the {training:,} documents removed from the training sources put back "
            f"({record['decontaminated_docs']:,} left out by the held-out decontamination{other}); proxy of "
            f"{record['proxy']['tokens']:,} tokens per arm at {len(record['seeds'])} seed(s); over the training "
            f"sources Δ {o['delta_bpb']:+.4f} bits/byte ({_seed_sd(o['seed_sd'])}) "
            f"{interval_text(o['delta_low'], o['delta_high'], o['heldout_docs'])} over {o['heldout_docs']:,} held-out "
            f"documents: "
            f"{o['verdict']}")


def summary(ctx: SummaryContext) -> list[Any]:
    """One line for the whole ablation and one per source: Δ = bpb(without) − bpb(with) [interval] → verdict."""
    record = _record(ctx.path)
    if not record.get("requested"):
        return []
    table = pd.read_parquet(ctx.path / "ablation.parquet")
    out: list[Any] = ["[bold]Quality ablation[/] (Δ = without − with the classifier; > 0: it helped): "
                      + _headline(record)]
    for r in table.itertuples():
        trained = "" if r.in_training else " (not in the proxy's training mixture)"
        out.append(f"  {r.source}{trained}: {r.bpb_with:.4f} with, {r.bpb_without:.4f} without; "
                   f"Δ {r.delta_bpb:+.4f} "
                   f"{interval_text(r.delta_low, r.delta_high, r.heldout_docs)} → {r.verdict} ({r.readded_docs:,} "
                   f"document{'' if r.readded_docs == 1 else 's'} put back)")
    return out


def figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    """``ablation.png`` of a requested ablation (none otherwise)."""
    source = Path(artifact) / "ablation.png"
    if not source.exists():
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(source, out / "ablation.png"))]


def report(ctx: ReportContext) -> list[Block]:
    """The ablation's table and figure; nothing when it was not requested."""
    record = _record(ctx.path)
    if not record.get("requested"):
        return []
    table = pd.read_parquet(ctx.path / "ablation.parquet")
    shown = table[["source", "in_training", "readded_docs", "bpb_with", "bpb_without", "delta_bpb", "delta_low",
                   "delta_high", "seed_sd", "heldout_docs", "verdict"]].round(4)
    (figure,) = figures(ctx.path, ctx.plots_dir)
    return [Heading("Quality classifier ablation"),
            Text("The same proxy trained on the corpus with and without the classifier's removals (same weights, "
                 "budget and seeds); Δ = bits/byte without − with, averaged over the seeds, with a 95% interval "
                 "that resamples the seeds and the held-out documents. " + _headline(record) + "."),
            TableBlock("Per source", shown),
            Figure(figure, "Δ bits per byte per source with its interval (green: helped, red: hurt)")]
