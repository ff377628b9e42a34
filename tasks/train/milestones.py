"""The weights a main-run artifact keeps besides its final checkpoint, and how commands name them.

Layout inside the artifact folder (``runs/artifacts/main/<key>/``)::

    checkpoint/                 the final full-state checkpoint (with ema.safetensors when [main] ema_decay > 0)
    milestones/step_XXXXXXXX/   weights at each declared milestone step ([main] milestone_every, milestones)
    ema/                        the EMA of the weights at the end ([main] ema_decay; tasks.train.averaging)
    average/                    the mean of the last K milestone weights ([main] average_last = K)

Each of the last three is a weights-only checkpoint (``tasks.train.checkpoint.save_weights``: model.safetensors,
state.json, checksums.json), verified like the final one before anything reads it.

Names (``main@<name>`` in ``[cpt] base_checkpoint`` and ``pretrain eval``; ``<artifact folder>@<name>`` in every
command that reads a checkpoint): ``final``, ``step_XXXXXXXX`` (any zero padding), ``ema``, ``average`` (also
``average_last<K>``), and under WSD ``stable_step_XXXXXXXX``, the stable-phase checkpoints the run kept in
``<runs>/cache/stable/<trunk_key>/`` (``tasks.train.trunk``; the decay branches start from them).

Milestones are written into the run's scratch folder as training passes their steps and moved into the artifact
when the run completes. A resumed run replays from its newest checkpoint, so the milestones after it are written
again with the same weights (resumption is exact, tests/unit/test_train_stage.py), and those before it are already
in scratch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError
from tasks.train.checkpoint import COMPLETION, save_weights, verify_checkpoint
from tasks.train.loop import TrainState

MILESTONES, EMA_DIR, AVERAGE_DIR = "milestones", "ema", "average"
_STEP = re.compile(r"^(stable_)?step_?0*(\d+)$")


def milestone_name(step: int) -> str:
    return f"step_{step:08d}"


class MilestoneSaver:
    """Training callback: after each step in ``steps``, the weights-only checkpoint of ``model`` at
    ``folder/step_XXXXXXXX`` (replaced atomically; a resumed run rewrites the ones it replays).

    Several processes: collective; the full weights are gathered to rank 0 on the CPU, which writes them.
    """

    def __init__(self, folder: Path, steps: list[int], *, model: Any, accelerator: Any = None,
                 extra: dict | None = None):
        self.folder, self.steps = Path(folder), set(steps)
        self.model, self.accelerator, self.extra = model, accelerator, dict(extra or {})
        self.saved: list[int] = []

    def on_step_end(self, state: TrainState, metrics: dict) -> None:
        if state.step not in self.steps:
            return
        from tasks.train.parallel import unwrap

        plain, main = unwrap(self.model), True
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            from models.decoder import Decoder

            full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            main = self.accelerator.is_main_process
            if main:
                plain = Decoder(unwrap(self.model).cfg)
                plain.load_state_dict(full)
        if main:
            self.folder.mkdir(parents=True, exist_ok=True)
            save_weights(self.folder / milestone_name(state.step), model=plain, state=state,
                         extra={**self.extra, "kept_as": "milestone"})
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()
        self.saved.append(state.step)


def collect_milestones(scratch_folder: Path, out: Path, steps: list[int]) -> list[int]:
    """Move the verified milestone checkpoints of ``steps`` from ``scratch_folder`` into ``out/milestones/``.

    Raises:
        CheckpointError: a milestone is missing or fails its checks (the message names the step).
    """
    target = Path(out) / MILESTONES
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
        source = Path(scratch_folder) / milestone_name(step)
        try:
            verify_checkpoint(source)
        except CheckpointError as err:
            raise CheckpointError(f"milestone step {step}: {err}") from err
        destination = target / milestone_name(step)
        shutil.rmtree(destination, ignore_errors=True)
        os.replace(source, destination)
    return list(steps)


def save_averaged(out: Path, name: str, model: Any, state: TrainState, extra: dict) -> Path:
    """``model`` (plain, with ``cfg``) as the weights-only checkpoint ``out/<name>/``."""
    return save_weights(Path(out) / name, model=model, state=state, extra={**extra, "kept_as": name})


def _runs_root(artifact: Path) -> Path | None:
    return next((p.parent for p in Path(artifact).resolve().parents if p.name == "artifacts"), None)


def available_checkpoints(artifact: Path, runs_root: Path | None = None) -> dict[str, Path]:
    """Name → directory of every checkpoint the main artifact ``artifact`` holds (module docstring), complete ones
    only; ``runs_root``: the runs folder for ``stable_step_*`` (default: the one holding the artifact)."""
    artifact = Path(artifact)
    found: dict[str, Path] = {}
    if (artifact / "checkpoint" / COMPLETION).is_file():
        found["final"] = artifact / "checkpoint"
    for directory in sorted((artifact / MILESTONES).glob("step_*")):
        if (directory / COMPLETION).is_file():
            found[directory.name] = directory
    run = json.loads((artifact / "run.json").read_text()) if (artifact / "run.json").is_file() else {}
    if (artifact / EMA_DIR / COMPLETION).is_file():
        found["ema"] = artifact / EMA_DIR
    if (artifact / AVERAGE_DIR / COMPLETION).is_file():
        found["average"] = artifact / AVERAGE_DIR
        if run.get("average_last"):
            found[f"average_last{run['average_last']}"] = artifact / AVERAGE_DIR
    root = runs_root if runs_root is not None else _runs_root(artifact)
    if run.get("trunk_key") and root is not None:
        trunk = Path(root) / "cache" / "stable" / run["trunk_key"]
        for step in run.get("stable_checkpoints", []):
            directory = trunk / milestone_name(int(step))
            if (directory / COMPLETION).is_file():
                found[f"stable_{milestone_name(int(step))}"] = directory
    return found


def named_checkpoint(artifact: Path, name: str, runs_root: Path | None = None) -> Path:
    """The directory of checkpoint ``name`` of the main artifact ``artifact`` (names: module docstring; a step may
    be written with any zero padding: ``step_400`` = ``step_00000400``).

    Raises:
        CheckpointError: ``artifact`` is not a main-run artifact, or it has no checkpoint of that name (the
            message lists the names it has).
    """
    artifact = Path(artifact)
    if not (artifact / "checkpoint").is_dir():
        raise CheckpointError(f"{artifact} is not a main-run artifact (it has no checkpoint/); name one as "
                              "runs/artifacts/main/<key>@<name>")
    found = available_checkpoints(artifact, runs_root)
    wanted = name.strip()
    match = _STEP.match(wanted)
    if match:
        wanted = ("stable_" if match.group(1) else "") + milestone_name(int(match.group(2)))
    if wanted not in found:
        raise CheckpointError(f"main artifact {artifact} has no checkpoint named {name!r}; available: "
                              f"{', '.join(found) or 'none'} (milestones need [main] milestone_every or milestones, "
                              "ema [main] ema_decay, average [main] average_last)")
    return found[wanted]


def split_name(spec: str | Path) -> tuple[str, str] | None:
    """(artifact part, name) of ``<artifact>@<name>``, or None when the last path component has no ``@``."""
    text = str(spec)
    head, sep, name = text.rpartition("@")
    if not sep or "/" in name or not name:
        return None
    return head, name


def resolve_named(spec: str | Path, *, main_artifact: Path | None = None, runs_root: Path | None = None) -> Path:
    """The checkpoint directory ``spec`` names: ``<artifact folder>@<name>``, or ``main@<name>`` for
    ``main_artifact`` (else, in ``runs_root``, its only main artifact). A ``spec`` without ``@`` is returned as a
    path.

    Raises:
        CheckpointError: an unknown name (the available ones listed), or ``main@`` with no single main artifact to
            read it from (the candidates listed).
    """
    parts = split_name(spec)
    if parts is None or Path(spec).exists():  # a folder whose name holds an @ is itself
        return Path(spec)
    head, name = parts
    if head == "main" and not Path(head).is_dir():
        if main_artifact is None:
            main_artifact = _only_main_artifact(runs_root)
        return named_checkpoint(main_artifact, name, runs_root)
    return named_checkpoint(Path(head), name, _runs_root(Path(head)) or runs_root)


def _only_main_artifact(runs_root: Path | None) -> Path:
    folder = Path(runs_root) / "artifacts" / "main" if runs_root is not None else None
    found = sorted(p for p in folder.iterdir() if (p / "checkpoint").is_dir() and not p.name.startswith(".")) \
        if folder is not None and folder.is_dir() else []
    if len(found) != 1:
        raise CheckpointError(f"main@<name> needs one main artifact to read it from; {folder} holds "
                              f"{[p.name for p in found] or 'none'}: name it as runs/artifacts/main/<key>@<name>, "
                              "or give the experiment config (pretrain eval main@<name> CONFIG)")
    return found[0]


def keep_averaged(out: Path, *, model: Any, state: TrainState, extra: dict, ema: Any = None,
                  average_steps: list[int] = ()) -> dict[str, Path]:
    """Write the averaged models of a finished run into the artifact ``out`` (call after ``collect_milestones``):
    ``ema/`` from ``ema`` (a ``tasks.train.averaging.EMA``), and ``average/``, the uniform mean
    (``tasks.train.averaging.uniform_average``) of the weights at ``average_steps``: the milestones' from
    ``out/milestones/``, the final step's from ``model`` (plain, holding the final weights). Returns name →
    directory.

    Raises:
        CheckpointError: a milestone to average is missing or fails its checks.
    """
    from tasks.train.averaging import averaged_parameters, uniform_average, with_weights
    from tasks.train.checkpoint import load_model

    written: dict[str, Path] = {}
    if ema is not None:
        written[EMA_DIR] = save_averaged(out, EMA_DIR, ema.model_copy(), state, {**extra, "ema_decay": ema.decay})
    if average_steps:
        def weights():
            for step in average_steps:
                directory = Path(out) / MILESTONES / milestone_name(step)
                if step == state.step and not directory.is_dir():
                    yield averaged_parameters(model)
                else:
                    yield averaged_parameters(load_model(directory))
        mean = uniform_average(weights())
        written[AVERAGE_DIR] = save_averaged(out, AVERAGE_DIR, with_weights(model, mean), state,
                                             {**extra, "averaged_steps": list(average_steps)})
    return written
