"""The pipeline's stages in order, one line each: data flows one way, sources → … → gate → export
(docs/methods.md §13).

A new stage is a package under ``tasks/`` exporting a ``STAGE`` (``infra.stage.Stage``) plus one line here.
"""

from __future__ import annotations

from collections.abc import Iterable

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


def check_stage_options(refresh: Iterable[str] = (), until: str | None = None) -> None:
    """Check ``--refresh`` and ``--until`` stage names (before any heavy import, so a typo fails at once).

    Raises:
        ConfigError: an unknown name (with a did-you-mean and the stage list), or a refreshed stage after
            ``until``.
    """
    from infra.errors import ConfigError
    from infra.section import did_you_mean

    names = stage_names()
    unknown = sorted(set(refresh) - set(names))
    if unknown:
        raise ConfigError(f"--refresh {unknown}: unknown stage; {did_you_mean(unknown[0], list(names))}"
                          f"choose from {list(names)}")
    if until is not None and until not in names:
        raise ConfigError(f"--until {until!r}: unknown stage; {did_you_mean(until, list(names))}choose from "
                          f"{list(names)}")
    if until is not None and set(refresh) - set(names[: names.index(until) + 1]):
        late = sorted(set(refresh) - set(names[: names.index(until) + 1]))
        raise ConfigError(f"--refresh {late} comes after --until {until}, so it would not run; drop one of them")


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
