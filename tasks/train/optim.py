"""AdamW with weight decay on weight matrices only (docs/methods.md §6)."""

from __future__ import annotations

import torch
from torch import nn

from tasks.train.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: 2-D weights (embeddings included) decayed by λ; norm gains and any 1-D tensor not.

    For the Lab-2 shape this puts 5,791,744 parameters in the decayed group and 3,328 in the other (docs/methods.md §2).
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decayed_matrices"},
        {"params": no_decay, "weight_decay": 0.0, "name": "norms"},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW(β1, β2, ε, λ from ``cfg``) starting at ``cfg.peak_lr``; the training loop sets the LR every step."""
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.peak_lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
    )
