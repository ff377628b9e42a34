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


def set_adamw(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> None:
    """Give ``optimizer``'s AdamW groups (``param_groups``) ``cfg``'s β1, β2, ε and, on the decayed group, its λ (the
    ``norms`` group keeps 0). A checkpoint's ``load_state_dict`` restores the settings the groups were saved with;
    after it, this makes the run's own config the one that acts. Groups without Adam betas are left alone."""
    for group in optimizer.param_groups:
        if "betas" not in group:
            continue
        group["betas"], group["eps"] = (cfg.beta1, cfg.beta2), cfg.eps
        if group.get("name") == "decayed_matrices":
            group["weight_decay"] = cfg.weight_decay
        elif group.get("name") == "norms":
            group["weight_decay"] = 0.0
