"""What a stage's plain function receives: where to write, what it reads, and how to report.

Stage functions (``tasks/*/stage.py``) take a ``StageContext`` and return a JSON-able summary. They never
import Prefect or MLflow: the orchestration layer (``flows/``) builds the context with callbacks bound to
the stage's MLflow run and a rich progress display.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from infra.parallel import ShardMap, sequential_map
from infra.runs import RunsLayout, ensure_folder
from infra.threads import ThreadPolicy

MetricsFn = Callable[[Mapping[str, float], int], None]
ChildFn = Callable[[str, Mapping[str, Any], list[Mapping[str, float]]], None]


class Progress:
    """Progress reporting interface; the default does nothing (tests, library use)."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        yield lambda advance=1: None


@dataclass
class StageContext:
    """Everything a stage function needs.

    Attributes:
        out: temporary directory to write outputs into (renamed into the artifact store on success).
        inputs: upstream artifact directories by stage name.
        layout: the runs folder (source cache, Optuna storage, resumable scratch space).
        key: this stage's artifact key (names scratch checkpoints and Optuna studies).
        key_config: the config the key was computed from (``StageDef.key_config``), with anything resolved for it
            (the sources' Debian releases); empty outside the pipeline.
        experiment: the experiment name.
        seed: the experiment seed.
        torch_threads: intra-op CPU threads of this process.
        threads: the thread policy the run chose (``infra.threads``), which a launcher splits among its workers;
            None: ``torch_threads`` from the experiment config.
        log_metrics: metrics at an explicit step to this stage's MLflow run (step unit stated by the caller).
        log_child: one nested MLflow run under this stage (name, params, metric rows each with a "step").
        progress: progress bars.
        shard_map_for: ``(task_runner, workers) → shard map`` running shard functions in parallel (Prefect task
            runners in the pipeline; a sequential loop by default).
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
    progress: Progress = field(default_factory=Progress)
    shard_map_for: Callable[[str, int], ShardMap] = field(default=lambda kind, workers: sequential_map)

    @property
    def scratch(self) -> Path:
        """Per-key scratch folder that survives a crash (resumable checkpoints); removed by the caller on success.
        Raises ``RunsFolderError`` when a file is in its way."""
        return ensure_folder(self.layout.root / "scratch" / self.out.parent.name / self.key)
