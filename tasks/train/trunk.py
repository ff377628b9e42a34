"""Stable-phase ("trunk") checkpoints of WSD main runs, shared by run lengths and decay branches (docs/methods.md §6).

Under warmup-stable-decay the state after step s ≤ D (D = the last stable step, ``RunBudget.decay_start``) depends on
the model, the warmup, the peak LR, the batch and the data order, and not on the run's total steps, its decay or
its evaluations (Hu et al. 2024; Hägele et al. 2024). Such states are kept as full checkpoints (weights, AdamW
moments, loader position, RNG) in ``<runs>/cache/stable/<trunk_key>/step_<s:08d>/``, where the trunk key hashes the
main run's result-changing config without ``budget.steps``, the decay, the floor and the evaluation settings, plus
the resolved peak LR and mixture weights, the tokenizer artifact and the training code. So:

- a WSD main run keeps the trunk at its branch steps and at its own D (``stable_steps``);
- a WSD main run whose budget grows resumes from the newest trunk checkpoint at or before its own D;
- a decay branch at s starts from the trunk checkpoint at s, trained (``extend_trunk``) from the newest earlier one
  when no run kept s.

A spike rewind reloads the run's newest scratch checkpoint, and a resumed run's scratch holds none from before its
resume point, so runs with spike events reproduce a trunk only as far as the rewinds land alike.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from infra.artifacts import artifact_key
from infra.errors import CheckpointError
from infra.runs import ensure_folder
from infra.section import key_dump
from tasks.train.checkpoint import COMPLETION, Checkpointer
from tasks.train.loop import TrainState
from tasks.train.packing import PackingConfig
from tasks.train.sections import MainConfig

log = logging.getLogger(__name__)

# Fields that act only after D, or not on the weights at all.
NOT_IN_TRUNK = ("steps", "decay_fraction", "decay_shape", "eval_every", "eval_tokens")


def trunk_config(cfg: MainConfig, *, packing: PackingConfig, seed: int, peak_lr: float,
                 weights: dict[str, float]) -> dict[str, Any]:
    """What the stable phase of ``cfg``'s main run depends on: the main section's key fields without
    ``NOT_IN_TRUNK`` budget fields, the floor and the branches, plus packing, seed, the resolved peak LR and the
    mixture weights actually trained on (sources of weight 0 left out, as the loader leaves them out)."""
    main = key_dump(cfg)
    budget = {k: v for k, v in main.pop("budget").items() if k not in NOT_IN_TRUNK}
    # Kept milestones and last-K averages change no weights (ema_decay stays: trunk checkpoints hold the EMA).
    for name in ("min_lr_ratio", "peak_lr", "branches", "milestone_every", "milestones", "average_last"):
        main.pop(name, None)
    return {"main": {**main, "budget": budget}, "packing": key_dump(packing), "seed": int(seed),
            "peak_lr": float(peak_lr), "weights": {s: round(float(w), 9) for s, w in sorted(weights.items()) if w > 0}}


def trunk_key(config: dict[str, Any], tokenizer_key: str, code: str) -> str:
    """sha256[:16] of ``trunk_config``, the tokenizer artifact's key and ``code``, the version of the code that
    trains the trunk (the main stage's import closure, which holds this module)."""
    return artifact_key("stable-trunk", config, {"tokenizer": tokenizer_key}, code)


def trunk_folder(runs_root: Path, key: str) -> Path:
    return Path(runs_root) / "cache" / "stable" / key


def stable_steps(cfg: MainConfig) -> list[int]:
    """Steps at which a WSD main run keeps trunk checkpoints: its branch steps and its last stable step D (≥ 1);
    none under cosine."""
    if cfg.budget.schedule != "wsd":
        return []
    end = cfg.budget.decay_start
    wanted = set(cfg.branches.at_steps if cfg.branches is not None else ()) | {end}
    return sorted(s for s in wanted if 1 <= s <= end)


def trunk_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the complete checkpoints in ``folder``, oldest first."""
    found = []
    for directory in Path(folder).glob("step_*"):
        if directory.name.startswith(".") or not (directory / COMPLETION).is_file():
            continue
        try:
            found.append((int(json.loads((directory / "state.json").read_text())["step"]), directory))
        except (OSError, ValueError, KeyError):
            continue  # unreadable: verify_checkpoint would refuse it too
    return sorted(found)


def resume_trunk(folder: Path, checkpointer: Checkpointer, model, optimizer, sampler, *,
                 max_step: int) -> dict[str, Any] | None:
    """Load the newest usable trunk checkpoint at step ≤ ``max_step`` into ``model``, ``optimizer`` and ``sampler``
    (RNG restored); an unusable one (corrupt, or a layout this world size cannot read) is skipped with a logged
    warning. Returns ``Checkpointer.load``'s dict plus "directory", or None."""
    for step, directory in reversed(trunk_checkpoints(folder)):
        if step > max_step:
            continue
        try:
            saved = checkpointer.load(directory, model=model, optimizer=optimizer)
        except CheckpointError as err:
            if checkpointer.main_process:
                log.warning("skipping unusable stable checkpoint %s: %s", directory, err)
            continue
        sampler.load_state_dict(saved["sampler_state"])
        return {**saved, "directory": directory}
    return None


class StableSaver:
    """Training callback: after each step in ``steps``, a full checkpoint of the run into the trunk folder
    (collective on several processes, like every ``Checkpointer`` save), with the run's ``companions`` (e.g. its
    EMA, ``Checkpointer``)."""

    def __init__(self, folder: Path, steps: list[int], *, model, optimizer, sampler, accelerator: Any = None,
                 extra: dict | None = None, companions: dict[str, Any] | None = None):
        self.folder, self.steps = Path(folder), set(steps)
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.checkpointer = Checkpointer(self.folder, accelerator=accelerator, extra=extra, keep_last=None,
                                         companions=companions)
        self.saved: list[int] = []

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        if state.step not in self.steps:
            return
        ensure_folder(self.folder)  # a file in the way is one RunsFolderError naming it
        self.checkpointer.save(self.folder / f"step_{state.step:08d}", model=self.model, optimizer=self.optimizer,
                               state=state, sampler_state=self.sampler.state_dict())
        self.saved.append(state.step)


def extend_trunk(folder: Path, steps: list[int], *, cfg: MainConfig, corpus: Any, weights: dict[str, float],
                 peak_lr: float, packing: PackingConfig, seed: int, extra: dict, scratch: Path,
                 accelerator: Any = None) -> dict[int, Path]:
    """Trunk checkpoints at every step of ``steps`` (each in the stable phase of ``cfg``): the kept ones as they
    are; the others trained on one process, in increasing order, from the newest kept checkpoint before them (else
    from initialisation, as the main run starts) with the main run's warmup, peak and loader, and kept. Returns
    step → directory.

    The schedule is ``wsd`` with no decay over the trained span (``decay_steps = 0``), the LR of every stable step of
    every WSD run with this warmup and peak, so the result equals the main run's state at that step. Spike rewinds
    go to scratch checkpoints under ``scratch`` at the main run's ``checkpoint_every``.

    Raises:
        CheckpointError: a kept checkpoint fails its checks; whatever training raises (DataError, ...).
    """
    from tasks.train.config import OptimConfig
    from tasks.train.intervals import checkpoint_schedule
    from tasks.train.loop import local_accelerator
    from tasks.train.optim import build_optimizer
    from tasks.train.parallel import parallelize
    from tasks.train.runner import build_model, make_sampler, run_training, seed_everything

    kept = dict(trunk_checkpoints(folder))
    accelerator = local_accelerator() if accelerator is None else accelerator
    for target in sorted(set(steps) - set(kept)):  # each one continues from the newest kept before it
        seed_everything(seed)
        model_cfg = cfg.model.build(corpus.vocab_size)
        model = parallelize(build_model(model_cfg, seed), accelerator, "ddp",
                            activation_checkpointing=cfg.distributed.activation_checkpointing)
        optimizer = build_optimizer(model, OptimConfig(peak_lr=peak_lr, warmup_steps=cfg.budget.warmup_steps,
                                                       **cfg.budget.adamw.model_dump()))
        sampler = make_sampler(corpus, weights, seq_len=model_cfg.seq_len, batch_size=cfg.budget.batch_size,
                               seed=seed, packing=packing)
        checkpointer = Checkpointer(Path(scratch) / f"trunk_{target:08d}", accelerator=accelerator, extra=extra,
                                    keep_last=cfg.keep_checkpoints)
        saved = resume_trunk(folder, checkpointer, model, optimizer, sampler, max_step=target)
        saver = StableSaver(folder, [target], model=model, optimizer=optimizer, sampler=sampler,
                            accelerator=accelerator, extra=extra)
        budget = cfg.budget.model_copy(update={"steps": target, "eval_every": 0})
        run_training(model, sampler, peak_lr=peak_lr, budget=budget, seed=seed, callbacks=[checkpointer, saver],
                     state=saved["state"] if saved is not None else None, optimizer=optimizer,
                     checkpoint_every=checkpoint_schedule(cfg.checkpoint_every, cfg.mtbf_hours),
                     stability=cfg.stability,
                     rewind=lambda: checkpointer.rewind(model, optimizer), accelerator=accelerator,
                     min_lr_ratio=cfg.min_lr_ratio, decay_steps=0)
        kept = dict(trunk_checkpoints(folder))
    return {s: kept[s] for s in steps}
