"""What a stage's plain function receives: where to write, what it reads, and how to report.

Stage functions (``tasks/*/stage.py``) take a ``StageContext`` and return a JSON-able summary. They never
import Prefect or MLflow: the orchestration layer (``flows/``) builds the context with callbacks bound to
the stage's MLflow run and a rich progress display.
"""

from __future__ import annotations

import importlib
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from infra.atomic import atomic_file
from infra.shard_map import ShardMap, sequential_map_for
from infra.runs import RunsLayout, ensure_folder
from infra.threads import ThreadPolicy

if TYPE_CHECKING:
    import pandas as pd

    from infra.report_blocks import Block
    from infra.warehouse import Warehouse

MetricsFn = Callable[[Mapping[str, float], int], None]
ChildFn = Callable[[str, Mapping[str, Any], list[Mapping[str, float]]], None]


class ProgressReporter:
    """Progress reporting interface; the default does nothing (tests, library use)."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        """A bar of ``total`` units (None: unknown); yields ``advance(n=1, doing=None)``, which counts ``n`` more units
        done and, given ``doing``, says what the bar is busy with now (``advance(0, doing="reading handbook_en")``;
        "" clears it)."""
        yield lambda n=1, doing=None: None

    def say(self, line: str) -> None:
        """A line for the user (a stage's start or end, a resume note); printed as is."""
        print(line, flush=True)

    def activity(self, what: str | None) -> None:
        """What runs now without a bar of its own (None: nothing); a reporter may name it while it lasts."""


@dataclass
class StageContext:
    """Everything a stage function needs.

    Attributes:
        out: temporary directory to write outputs into (renamed into the artifact store on success).
        inputs: upstream artifact directories by stage name.
        layout: the runs folder (source cache, Optuna storage, resumable scratch space).
        key: this stage's artifact key (names scratch checkpoints and Optuna studies).
        key_config: the config the key was computed from (``Stage.key_config``), with anything resolved for it
            (the sources' Debian releases); empty outside the pipeline.
        experiment: the experiment name.
        seed: the experiment seed.
        torch_threads: intra-op CPU threads of this process.
        threads: the thread policy the run chose (``infra.threads``), which a launcher splits among its workers;
            None: ``torch_threads`` from the experiment config.
        log_metrics: metrics at an explicit step to this stage's MLflow run (step unit stated by the caller).
        log_child: one nested MLflow run under this stage (name, params, metric rows each with a "step").
        progress: progress bars.
        refresh: the user named this stage with ``--refresh``: it reads nothing back from its caches under
            ``runs/cache/`` (proxies, candidates, rungs, branches, a WSD run's stable phase, the sweep's study) but
            trains afresh and overwrites them (``reuses``, ``wrote``); its own resumable scratch is still read after
            a kill. False for a stage recomputed only because it is downstream of a refreshed one: its cache entries
            are keyed by content, so one whose key matches is the same result.
        shard_map_for: ``(execution, on_done=None) → shard map`` for an ``infra.execution.ExecutionConfig``,
            running shard functions where its engine says (Prefect tasks or Ray tasks in the pipeline; a loop in
            this process by default); ``on_done()`` is called after each finished call (progress bars).
    """

    out: Path
    inputs: dict[str, Path]
    layout: RunsLayout
    key: str
    experiment: str
    key_config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    torch_threads: int = 2
    threads: ThreadPolicy | None = None
    log_metrics: MetricsFn = field(default=lambda metrics, step: None)
    log_child: ChildFn = field(default=lambda name, params, rows: None)
    progress: ProgressReporter = field(default_factory=ProgressReporter)
    refresh: bool = False
    shard_map_for: Callable[..., ShardMap] = field(default=sequential_map_for)

    @property
    def scratch(self) -> Path:
        """Per-key scratch folder that survives a crash (resumable checkpoints, journals); the pipeline removes it
        once the artifact is committed, never the stage (a kill between the two must still find it).
        Raises ``RunsFolderError`` when a file is in its way."""
        return ensure_folder(scratch_folder(self.layout.root, self.out.parent.name, self.key))

    def reuses(self, entry: str, present: bool) -> bool:
        """Whether to read back the cache entry ``entry`` (its content key) that is ``present`` in the stage's cache:
        always, unless the stage is refreshed; then only an entry this attempt, or an interrupted attempt at the same
        artifact key, trained (``wrote``), so that rerunning the same ``--refresh`` command resumes."""
        return present and (not self.refresh or entry in self._refreshed())

    def wrote(self, entry: str) -> None:
        """Note that the stage trained the cache entry ``entry`` anew (kept in its scratch under ``--refresh``)."""
        if self.refresh:
            with atomic_file(self.scratch / REFRESHED, "w") as f:
                json.dump(sorted(self._refreshed() | {entry}), f)

    def _refreshed(self) -> set[str]:
        path = scratch_folder(self.layout.root, self.out.parent.name, self.key) / REFRESHED
        return set(json.loads(path.read_text())) if path.is_file() else set()


REFRESHED = "refreshed_entries.json"  # in a refreshed stage's scratch: the cache entries it has trained anew


def scratch_folder(runs: Path, stage: str, key: str) -> Path:
    """``<runs>/scratch/<stage>/<key>``: where a stage keeps what lets a killed attempt resume."""
    return Path(runs) / "scratch" / stage / key


# --------------------------------------------------------------------------- a stage's face
#
# Each stage package exports one ``Stage`` (``tasks/<stage>/definition.py``); ``flows/registry.py`` lists them in
# order. The orchestration layer is generic: it computes keys from ``Stage.key_config``, runs ``Stage.run`` in a
# temporary directory, checks it with ``Stage.validate``, commits it, and writes what ``Stage.publish`` returns.


@dataclass(frozen=True)
class Dataset:
    """An MLflow dataset input of the stage run: ``name`` with content ``digest``, read from ``path``."""

    name: str
    digest: str
    path: Path
    context: str
    profile: Mapping[str, Any]


@dataclass(frozen=True)
class TableUpdate:
    """``UPDATE table SET column = value ... WHERE column = value AND ...`` on rows another artifact wrote."""

    table: str
    set: Mapping[str, Any]
    where: Mapping[str, Any]


@dataclass(frozen=True)
class Registration:
    """A model version to register (``source``: a checkpoint folder); with ``alias`` the alias is pointed at it and
    the stage run is tagged with the version."""

    model: str
    source: str
    identity: Mapping[str, str]
    tags: Mapping[str, str] = field(default_factory=dict)
    alias: str | None = None


@dataclass
class Published:
    """What a stage's artifact puts into the warehouse and the tracker; the orchestration layer writes it.

    Attributes:
        tables: DuckDB table → rows, replacing that table's rows of this artifact key.
        updates: changes to rows of other artifacts (e.g. token counts filled into the corpus manifest).
        metrics: MLflow metrics at step 0 (names are made MLflow-safe).
        series: (metric, value, step) points; the stage's ``step_unit`` says what step counts.
        params, tags: of the stage run.
        parent_tags, parent_metrics: of the pipeline's parent run (headline figures).
        files: artifact file names logged by the run that produced the artifact (not by cached runs).
        mlflow_tables: MLflow tables (``MlflowClient.log_table``) by artifact file name (``.json``), logged like
            ``files``.
        datasets: MLflow dataset inputs.
        registrations: model versions to register.
    """

    tables: dict[str, Any] = field(default_factory=dict)
    updates: list[TableUpdate] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    series: list[tuple[str, float, int]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, Any] = field(default_factory=dict)
    parent_tags: dict[str, Any] = field(default_factory=dict)
    parent_metrics: dict[str, float] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    mlflow_tables: dict[str, Any] = field(default_factory=dict)
    datasets: list[Dataset] = field(default_factory=list)
    registrations: list[Registration] = field(default_factory=list)


@dataclass(frozen=True)
class PublishContext:
    """What ``Stage.publish`` reads: the artifact (``path``, ``key``, ``meta``), its input artifacts by stage, the
    experiment config, whether this run reused it, and whether the tracker is a remote server."""

    artifact: Any  # infra.artifacts.Artifact
    inputs: Mapping[str, Any]
    cfg: Any
    cached: bool
    remote_tracker: bool = False


@dataclass(frozen=True)
class SummaryContext:
    """What ``Stage.summary`` reads for the end-of-run console summary.

    Attributes:
        path: this stage's artifact folder.
        paths: the artifact folder of every stage the run produced or reused, by stage name.
        layout: the runs folder.
        max_epochs: the config's ``mixture.max_epochs``; sources repeated more often than this get a warning.
        cfg: the experiment config; None when the caller has only the run's result.
    """

    path: Path
    paths: Mapping[str, Path]
    layout: RunsLayout
    max_epochs: float = 4.0
    cfg: Any = None


@dataclass(frozen=True)
class ReportContext:
    """What ``Stage.report`` reads for ``pretrain report``.

    Attributes:
        path: this stage's artifact folder.
        paths: the complete artifact folder of every stage the config's keys name, by stage name.
        layout: the runs folder (artifact store, MLflow store).
        warehouse: the DuckDB warehouse (``infra.warehouse.Warehouse``), read only.
        plots_dir: folder the section writes its figures into (it exists).
        cfg: the experiment config.
        history: the training curves the stage run logged (``step`` plus one column per metric; empty when none
            were found) when the stage ``wants_history``; None otherwise.
    """

    path: Path
    paths: Mapping[str, Path]
    layout: RunsLayout
    warehouse: Warehouse
    plots_dir: Path
    cfg: Any = None
    history: pd.DataFrame | None = None


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` as a callable that imports its module on the first call, so a stage's
    definition stays cheap to import (``pretrain status`` loads every definition). The stage's code version covers
    its whole package (``Stage.code``), so a module named only here still keys the stage."""
    module, _, name = target.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = target
    return call


def _no_check(out: Path, cfg: Any) -> None:
    return None


def _nothing(ctx: PublishContext) -> Published:
    return Published()


def _no_figures(artifact: Path, out: Path, history: Any) -> list[Path]:
    return []


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: everything the orchestration layer needs to know of it.

    Attributes:
        name: the stage name (artifact folder, MLflow run, DuckDB ``stage``).
        inputs: the stages whose artifacts it reads.
        code: its package; the code version hashes the import closure of every module in it.
        run: ``(ctx, experiment config) -> summary`` writing the artifact into ``ctx.out``.
        sections: experiment config sections whose result-changing fields (``infra.section.key_dump``) the key
            hashes.
        seeded: the experiment seed is in the key.
        key_extra: more key entries computed from the config (what sources resolve to, digests of files read).
        validate: ``(out, experiment config)`` expectations on the finished outputs; raises ``DataError``.
        publish: ``PublishContext -> Published``.
        figures: ``(artifact folder, out folder, training history or None) -> PNG paths`` (MLflow ``plots/`` and
            the report show the same files).
        wants_history: ``figures`` draws the stage run's logged training curves.
        step_unit: what the ``step`` of the stage run's metrics counts.
        summary: ``SummaryContext -> rich renderables`` (strings with rich markup, ``infra.report_blocks.rich_table``
            tables) printed in order after ``pretrain run``; None: the stage has no summary section.
        report: ``ReportContext -> blocks`` (``infra.report_blocks``) of the stage's section in ``pretrain report``;
            None: the stage has no report section.
    """

    name: str
    inputs: tuple[str, ...]
    code: str
    run: Callable[[StageContext, Any], Mapping[str, Any]]
    sections: tuple[str, ...] = ()
    seeded: bool = False
    key_extra: Callable[[Any], Mapping[str, Any]] | None = None
    validate: Callable[[Path, Any], None] = _no_check
    publish: Callable[[PublishContext], Published] = _nothing
    figures: Callable[[Path, Path, Any], list[Path]] = _no_figures
    wants_history: bool = False
    step_unit: str = "none"
    summary: Callable[[SummaryContext], list[Any]] | None = None
    report: Callable[[ReportContext], list[Block]] | None = None

    def key_config(self, cfg: Any) -> dict[str, Any]:
        """The config part of this stage's key: its sections' result-changing fields, the seed, and extras."""
        from infra.section import key_dump

        config: dict[str, Any] = {name: key_dump(getattr(cfg, name)) for name in self.sections}
        if self.seeded:
            config["seed"] = cfg.seed
        if self.key_extra is not None:
            config.update(self.key_extra(cfg))
        return config
