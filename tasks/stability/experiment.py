"""The stability experiment (docs/methods.md §6 (learning-rate stability grid)): a learning-rate sweep crossed with cumulative interventions.

Each cell trains the same small model from the same seed on the same batches for ``steps`` optimiser steps. The
interventions are applied cumulatively in the order given: ``bare`` (no warmup, no clipping, no z-loss, no QK-norm),
then ``+warmup``, ``+clipping``, ``+z_loss``, ``+qk_norm``. Per cell it records final CE (mean of the last 10
steps), worst CE (after the first 10 steps), max |attention logit| (the probe, every ``probe_every`` steps), mean log
Z at the end, and the largest pre-clip gradient norm. A run whose loss turns non-finite is kept as ``diverged``.

docs/methods.md §6 reference (stability grid, 1,328,256 parameters, 150 steps): at lr 0.03 the bare run's max |attention logit| is
about 972 against about 12 with QK-norm; warmup, clipping and z-loss alone do not bound it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from infra.errors import DataError
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.stability.config import INTERVENTIONS, StabilityExperimentConfig  # noqa: F401
from tasks.train.config import OptimConfig
from tasks.train.loop import seed_everything, train

COLUMNS = ["lr", "interventions", "final_ce", "worst_ce", "max_attention_logit", "mean_log_z", "max_grad_norm",
           "diverged", "steps_done"]


def run_grid(cfg: StabilityExperimentConfig, make_sampler: Callable[[int], object], vocab_size: int, seed: int,
             on_cell: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """Train every (lr, cumulative interventions) cell; one row per cell with ``COLUMNS``.

    ``make_sampler(seed)`` returns a fresh loader, so every cell sees the same batches.

    Raises:
        DataError: ``interventions`` does not start with ``bare``.
    """
    if cfg.interventions[0] != "bare":
        raise DataError(f"stability.interventions must start with 'bare', got {cfg.interventions}")
    rows = []
    for lr in cfg.lrs:
        for k in range(len(cfg.interventions)):
            on = set(cfg.interventions[1:k + 1])
            row = _cell(cfg, lr, on, make_sampler(seed), vocab_size, seed)
            row["interventions"] = "bare" if not on else "+".join(i for i in cfg.interventions if i in on)
            rows.append(row)
            if on_cell:
                on_cell(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(cfg: StabilityExperimentConfig, lr: float, on: set[str], sampler, vocab_size: int, seed: int) -> dict:
    model_cfg = ModelConfig(**cfg.model, vocab_size=vocab_size, seq_len=cfg.seq_len, qk_norm="qk_norm" in on)
    seed_everything(seed)
    model = Decoder(model_cfg)
    optim = OptimConfig(peak_lr=lr, warmup_steps=cfg.warmup_steps if "warmup" in on else 0, min_lr_ratio=0.1,
                        grad_clip=cfg.grad_clip if "clipping" in on else 1e12,
                        z_loss=cfg.z_loss if "z_loss" in on else 0.0)
    diverged, metrics = False, []

    class Collect:
        def on_step_end(self, state, step_metrics):
            metrics.append(step_metrics)

    try:
        train(model, sampler, optim, total_steps=cfg.steps, seed=seed, instrument_every=cfg.probe_every,
              callbacks=[Collect()])
    except DataError:  # non-finite loss: the run diverged; what it logged before stays
        diverged = True
    ce = np.array([m["loss_nats"] for m in metrics], dtype=float)
    probes = [m["max_attention_logit"] for m in metrics if "max_attention_logit" in m]
    return {"lr": lr, "final_ce": float(ce[-10:].mean()) if len(ce) and not diverged else float("nan"),
            "worst_ce": float(ce[10:].max()) if len(ce) > 10 else float("nan"),
            "max_attention_logit": float(max(probes)) if probes else float("nan"),
            "mean_log_z": float(metrics[-1]["mean_log_z"]) if metrics else float("nan"),
            "max_grad_norm": float(max(m["grad_norm_preclip"] for m in metrics)) if metrics else float("nan"),
            "diverged": diverged, "steps_done": len(metrics)}


def sensitivity_plot(table: pd.DataFrame, path) -> None:
    """Final CE and max |attention logit| against peak LR (log x), one line per intervention set, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, g in table.groupby("interventions", sort=False):
        axes[0].plot(g["lr"], g["final_ce"], marker="o", label=name)
        axes[1].plot(g["lr"], g["max_attention_logit"], marker="o", label=name)
    for ax, label in zip(axes, ("final CE (nats/token)", "max |attention logit|")):
        ax.set_xscale("log")
        ax.set_xlabel("peak LR")
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
