"""The pipeline's stages in order, one line each: data flows one way, sources → … → gate → export
(docs/methods.md §13).

A new stage is a package under ``tasks/`` exporting a ``STAGE`` (``infra.stage.Stage``) plus one line here.
"""

from __future__ import annotations

from infra.stage import Stage
from tasks.ablation.definition import STAGE as quality_ablation
from tasks.branches.definition import STAGE as branches
from tasks.corpus.definition import QUALITY_STAGE as quality_model
from tasks.corpus.definition import STAGE as corpus
from tasks.cpt.definition import STAGE as cpt
from tasks.export.definition import STAGE as export
from tasks.gate.definition import STAGE as gate
from tasks.ladder.definition import STAGE as ladder
from tasks.main.definition import STAGE as main
from tasks.mixture.definition import STAGE as mixture
from tasks.sources.definition import STAGE as sources
from tasks.sweep.definition import STAGE as sweep
from tasks.tokenizer.definition import STAGE as tokenizer

STAGES: list[Stage] = [
    sources,
    quality_model,
    corpus,
    tokenizer,
    mixture,
    quality_ablation,
    sweep,
    ladder,
    main,
    branches,
    cpt,
    gate,
    export,
]


def register(stage: Stage, *, after: str) -> None:
    """Add ``stage`` to the pipeline right after the stage ``after`` (for stages outside this package, e.g. a
    plugin or a test; the built-in stages are the list above). Register before ``flows.pipeline`` is imported:
    the flow's typed parameters are built from the registry then.

    Raises:
        ValueError: a stage of that name is registered already, or an input is not an earlier stage.
    """
    names = stage_names()
    if stage.name in names:
        raise ValueError(f"a stage {stage.name!r} is registered already")
    position = names.index(get_stage(after).name) + 1
    missing = [name for name in stage.inputs if name not in names[:position]]
    if missing:
        raise ValueError(f"stage {stage.name!r} reads {missing}, which do not run before it")
    STAGES.insert(position, stage)


def stage_names() -> tuple[str, ...]:
    return tuple(s.name for s in STAGES)


def get_stage(name: str) -> Stage:
    """The registered stage called ``name``.

    Raises:
        KeyError: no such stage.
    """
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"no stage {name!r}; stages: {', '.join(stage_names())}")


def downstream(names: set[str]) -> set[str]:
    """The given stages and every stage that consumes them, directly or not."""
    closed = set(names)
    for stage in STAGES:
        if closed.intersection(stage.inputs):
            closed.add(stage.name)
    return closed
