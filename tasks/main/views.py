"""What the console summary and ``pretrain report`` show of the main run's artifact: held-out loss per source,
the resume point, the WSD schedule and its stable checkpoints, where the peak LR came from, epochs per source, and
the text samples."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from infra.report_blocks import Block, Figure, Heading, TableBlock, Text, fmt_value, rich_table
from infra.stage import ReportContext, SummaryContext
from tasks.train.epochs import epoch_warnings
from tasks.train.samples import final_samples, read_samples, samples_block_frame, samples_table


def main_run_lines(run: dict[str, Any], max_epochs: float) -> list[str]:
    """The main run's resume point, its WSD schedule (decay start, length, shape, floor, the stable checkpoints it
    kept; docs/methods.md §6) and epochs per source (w·D/U, docs/methods.md §8), with a warning (rich markup) for each
    source repeated more than ``max_epochs`` times.

    Args:
        run: the artifact's ``run.json``.
        max_epochs: the config's ``mixture.max_epochs``.
    """
    out = []
    if run.get("resumed_from_step"):
        where = ("the stable-phase checkpoint of a WSD run with another budget" if run.get("resumed_from") == "stable"
                 else "scratch checkpoint")
        out.append(f"  resumed from step {run['resumed_from_step']:,} of {run['steps']:,} ({where})")
    if run.get("schedule") == "wsd":
        out.append(f"  {wsd_line(run)}")
    if run.get("kept_weights"):  # tasks.train.milestones: each nameable as main@<name>
        out.append(f"  kept weights (main@<name>): {', '.join(run['kept_weights'])}")
    source = run.get("peak_lr_source", {})
    if source.get("from") == "sweep" and source.get("d_model"):
        out.append(f"  peak LR {run['peak_lr']:.2e} from the sweep at d_model {source['d_model']} (the swept width "
                   f"nearest the main model's {source['main_d_model']})")
    main_epochs = run.get("epochs", {})
    if main_epochs:
        out.append("  epochs per source: " + ", ".join(f"{s} {e:.2f}" for s, e in main_epochs.items()))
    for warning in epoch_warnings(main_epochs, max_epochs):
        out.append(f"  [yellow]warning:[/] {warning}")
    return out


def wsd_line(run: dict[str, Any]) -> str:
    """One line on a WSD run's schedule (docs/methods.md §6) from its ``run.json``: the peak held to the decay start,
    the decay length, shape and floor, and the stable checkpoints this run kept."""
    kept = ", ".join(f"{s:,}" for s in run.get("stable_checkpoints", [])) or "none this run"
    return (f"schedule WSD: peak to step {run['decay_start']:,}, then {run['decay_steps']:,} decay steps "
            f"({run['decay_shape']}) to {run['min_lr_ratio']:g} × peak; stable checkpoints kept at steps {kept} "
            f"(trunk {run['trunk_key']})")


def summary(ctx: SummaryContext) -> list[Any]:
    """The held-out loss table per source, then ``main_run_lines``, then the samples of the last evaluation point."""
    heldout = pd.read_parquet(ctx.path / "heldout.parquet")[["source", "tokens", "loss_nats", "bits_per_byte"]]
    out = [rich_table("Main run held-out loss per source", heldout)]
    if (ctx.path / "averaged_heldout.parquet").is_file():  # [main] ema_decay / average_last
        averaged = pd.read_parquet(ctx.path / "averaged_heldout.parquet")
        out.append(rich_table("Averaged weights held-out loss per source",
                              averaged[["checkpoint", "source", "tokens", "loss_nats", "bits_per_byte"]]))
    out += main_run_lines(json.loads((ctx.path / "run.json").read_text()), ctx.max_epochs)
    samples = read_samples(ctx.path)
    if samples is not None and len(samples):
        last = final_samples(samples)
        out.append(samples_table(f"Main run samples at step {int(last['step'].iloc[0]):,} "
                                 f"({last['decoding'].iloc[0]})", last, ["prompt", "completion"]))
    return out


def report(ctx: ReportContext) -> list[Block]:
    """The main run: steps, tokens, peak LR, final loss and processes; the loss and LR curves from
    ``ctx.history`` (written into ``ctx.plots_dir``); held-out loss per source; epochs per source."""
    from tasks.main.plots import main_figures

    path = ctx.path
    run = json.loads((path / "run.json").read_text())
    out: list[Block] = [Heading("Main run"), Text(
        f"{run['steps']:,} steps, tokens_seen {run['tokens_seen']:,}, peak_lr {run['peak_lr']:.3e}, mixture "
        f"{run['mixture']}, final training loss {fmt_value(run.get('final_loss_nats'), '{:.4f}')} nats/token, "
        f"{run.get('world_size', 1)} process(es) ({run.get('strategy', 'single')}).")]
    if run.get("schedule") == "wsd":
        out.append(Text(wsd_line(run) + "."))
    run_id = json.loads((path / "meta.json").read_text()).get("mlflow_run_id", "")
    history = ctx.history if ctx.history is not None else pd.DataFrame()
    figures = main_figures(path, ctx.plots_dir, history)
    if figures:
        out.append(Figure(figures[0], f"Training loss and learning rate per step (MLflow run {run_id})"))
    else:
        out.append(Text(f"No loss or lr history found for MLflow run `{run_id or '?'}` in {ctx.layout.mlflow_db}."))
    heldout = pd.read_parquet(path / "heldout.parquet")
    out.append(TableBlock("Held-out loss per source", heldout[[c for c in ("source", "tokens", "loss_nats",
                                                                          "bits_per_byte") if c in heldout]]))
    if run.get("epochs"):
        out.append(Text("Epochs per source: " + ", ".join(f"{s} {e:.2f}" for s, e in run["epochs"].items())))
    samples = read_samples(path)
    if samples is not None and len(samples):
        out.append(TableBlock(f"Samples at each evaluation point ({samples['decoding'].iloc[0]}; MLflow table "
                              "samples.json)", samples_block_frame(samples, ["step", "prompt", "completion"])))
    return out
