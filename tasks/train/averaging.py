"""Weight averaging of a training run: an exponential moving average of the weights (EMA) and the uniform average
of the last K saved checkpoints.

EMA: averaging of the iterates (Polyak & Juditsky 1992, who average them uniformly) with exponential weights,
so the memory stays fixed as the run grows. After every applied optimiser step i,

    ŵ_i = β · ŵ_{i−1} + (1 − β) · w_i,   ŵ_0 = w_0,

so after n steps ŵ_n = Σ_{i=1..n} (1 − β) β^{n−i} w_i + β^n w_0: a weighted mean of the iterates whose weights sum
to 1 and decay by β per step (about 1 / (1 − β) steps of memory). It is kept in float32 whatever the training
precision, because (1 − β) · w is below the bf16 resolution of ŵ for β close to 1.

Last-K average (Izmailov et al. 2018, SWA: a uniform mean of iterates along the trajectory; Sanyal et al. 2023,
LAWA: the mean of the last K checkpoints, spaced apart, during training): w̄ = (1/K) Σ_k w_{s_k} over the K newest
saved checkpoints s_1 < … < s_K. Summed in float64, stored in float32.

Both are extra models beside the final weights; neither changes the training trajectory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from tasks.train.loop import TrainState


def ema_update(average: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor], decay: float) -> None:
    """One EMA step in place: ŵ ← β·ŵ + (1−β)·w for every name of ``average`` (float32 tensors; ``weights`` of any
    float dtype and the same shapes, cast to float32 first).

    Raises:
        ValueError: ``decay`` outside [0, 1), or a name of ``average`` missing from ``weights``.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"ema decay β = {decay} must lie in [0, 1) (β = 1 would never move the average)")
    missing = [name for name in average if name not in weights]
    if missing:
        raise ValueError(f"weights lack {missing[:3]} of the averaged parameters")
    with torch.no_grad():
        for name, avg in average.items():
            avg.mul_(decay).add_(weights[name].detach().to(avg.dtype), alpha=1.0 - decay)


def uniform_average(state_dicts: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean (1/K) Σ_k w_k of K ≥ 1 state dicts with the same names and shapes: summed in float64
    one state dict at a time (memory: one float64 copy), returned in float32.

    Raises:
        ValueError: no state dict, or state dicts whose names or shapes differ (the message names the first).
    """
    total: dict[str, torch.Tensor] | None = None
    count = 0
    for sd in state_dicts:
        if total is None:
            total = {k: v.detach().to("cpu", torch.float64, copy=True) for k, v in sd.items()}
        else:
            if sd.keys() != total.keys():
                raise ValueError(f"state dict {count} has names {sorted(set(sd) ^ set(total))[:3]} the first lacks "
                                 "or has: only checkpoints of one model can be averaged")
            for k, v in sd.items():
                if v.shape != total[k].shape:
                    raise ValueError(f"{k}: shape {tuple(v.shape)} in state dict {count}, "
                                     f"{tuple(total[k].shape)} in the first")
                total[k].add_(v.detach().to("cpu", torch.float64))
        count += 1
    if total is None:
        raise ValueError("uniform_average needs at least one state dict")
    return {k: (v / count).to(torch.float32) for k, v in total.items()}


def averaged_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors weight averaging keeps: ``model``'s named parameters (a tied embedding once), as float32 copies
    on their device."""
    from tasks.train.parallel import unwrap

    return {name: p.detach().to(torch.float32, copy=True) for name, p in unwrap(model).named_parameters()}


def with_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """A plain float32 copy of ``model`` (unwrapped, on the CPU, with its ``cfg``) whose parameters are ``weights``
    (names as ``averaged_parameters``); buffers are the model's own.

    Raises:
        ValueError: ``weights`` misses a parameter or has one the model lacks.
    """
    import copy

    from tasks.train.parallel import unwrap

    core = unwrap(model)
    plain = copy.deepcopy(core).to("cpu", torch.float32)
    names = dict(plain.named_parameters())
    if names.keys() != weights.keys():
        raise ValueError(f"averaged weights and model differ in {sorted(set(names) ^ set(weights))[:3]}")
    with torch.no_grad():
        for name, p in names.items():
            p.copy_(weights[name].to("cpu", torch.float32))
    return plain


class EMA:
    """Training callback: the EMA ŵ of ``model``'s parameters with decay ``decay`` (module docstring), updated after
    every applied optimiser step (``on_step_end``; skipped and rewound steps are not iterates).

    ŵ starts as the parameters at construction (w_0 of a fresh run; a resumed run loads its saved ŵ over them
    through ``load_state_dict``). As a ``Checkpointer`` companion it is saved in every checkpoint and restored on
    resume and rewind, so an interrupted run ends with the EMA of an uninterrupted one.

    Raises:
        ValueError: ``decay`` outside [0, 1).
    """

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay = {decay} must lie in [0, 1)")
        self.model, self.decay = model, float(decay)
        self.average = averaged_parameters(model)
        self.updates = 0  # steps averaged by this process (not saved: the checkpoint's step says how many)

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        from tasks.train.parallel import unwrap

        ema_update(self.average, dict(unwrap(self.model).named_parameters()), self.decay)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.average

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy saved averages in place (same names, shapes; float32).

        Raises:
            KeyError: names differ (``Checkpointer`` reports it as a CheckpointError).
        """
        if tensors.keys() != self.average.keys():
            raise KeyError(f"saved EMA names differ from the model's parameters: "
                           f"{sorted(set(tensors) ^ set(self.average))[:3]}")
        with torch.no_grad():
            for name, avg in self.average.items():
                avg.copy_(tensors[name].to(avg.device, avg.dtype))

    def model_copy(self) -> nn.Module:
        """A plain float32 CPU copy of the model holding ŵ (for saving and scoring)."""
        return with_weights(self.model, self.average)
