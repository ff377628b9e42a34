"""What a quality-model artifact puts into MLflow and the console: the classifier's held-out accuracy, ROC AUC
with its 95% interval, spread of the scores, Brier score and reliability diagram, how many examples came from
where, and how training balanced the classes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from infra.stage import PublishContext, Published, SummaryContext
from tasks.corpus.quality_stage import METRICS

HEADLINE = ("accuracy", "roc_auc", "brier")


def _metrics(artifact: Path) -> dict[str, Any]:
    return json.loads((Path(artifact) / METRICS).read_text())


def publish(ctx: PublishContext) -> Published:
    metrics = _metrics(ctx.artifact.path)
    if not metrics.get("enabled"):
        return Published(tags={"quality_model": "disabled"})
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    balancing = metrics.get("balancing") or {}
    return Published(metrics={k: v for k, v in numbers.items() if math.isfinite(v)},
                     params={"kind": metrics["kind"], **{f"examples.{k}": v for k, v in metrics["origins"].items()},
                             **{f"balancing.{k}": v for k, v in balancing.items()}},
                     files=[METRICS, "examples.parquet", metrics["model_file"]])


def figures(artifact: Path, out: Path, history: Any = None) -> list[Path]:
    """``reliability.png`` of an enabled model (none for a disabled one)."""
    source = Path(artifact) / "reliability.png"
    if not source.exists():
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(source, out / "reliability.png"))]


def summary(ctx: SummaryContext) -> list[Any]:
    metrics = _metrics(ctx.path)
    if not metrics.get("enabled"):
        return []
    shown = ", ".join(f"{name.replace('_', ' ')} {metrics[name]:.3f}" for name in HEADLINE if name in metrics)
    low, high = metrics.get("roc_auc_low"), metrics.get("roc_auc_high")
    if low is not None and high is not None and low == low:
        shown += f" (ROC AUC 95% interval {low:.3f}–{high:.3f}), score std {metrics.get('score_std', math.nan):.3f}"
    if metrics.get("metrics_note"):
        shown += f" ({metrics['metrics_note']})"
    origins = ", ".join(f"{k} {v:,}" for k, v in metrics["origins"].items())
    used = {k: int(metrics.get(k, 0)) for k in ("n_train_pos", "n_heldout_pos", "n_train_neg", "n_heldout_neg")}
    out: list[Any] = [f"[bold]Quality model[/] ({metrics['kind']}): held-out {shown}; examples available {origins}; "
                      f"used {used['n_train_pos']:,} + {used['n_heldout_pos']:,} positive and {used['n_train_neg']:,} + "
                      f"{used['n_heldout_neg']:,} negative (train + held out)"]
    balancing = metrics.get("balancing") or {}
    if balancing.get("method") in ("sample_weight", "oversample"):
        out[0] += (f"; classes balanced by {balancing['method'].replace('_', ' ')} (weight per example "
                   f"{balancing['weight_pos']:.3g} positive, {balancing['weight_neg']:.3g} negative)")
    elif balancing:
        out[0] += f"; classes not balanced ({balancing.get('reason', 'class_balance = none')})"
    out += [f"[yellow]quality model warning:[/] {w}" for w in metrics.get("warnings", [])]
    return out
