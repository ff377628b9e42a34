"""Garbage collection of the artifact store: remove artifacts nothing refers to any more.

An artifact is referenced when an active (not deleted) MLflow run of any experiment carries its key in the tag
``artifact_key``, or when a registered model version's ``source`` lies inside it (the ``kept`` checkpoint of a
gate decision, a registered CPT candidate). Deleting runs in the MLflow UI is how a user lets go of results; this
then frees their space. Unfinished attempts (``.tmp-*`` folders) are removed too, unless younger than
``min_age_s`` (a run may be writing them now), and artifacts a run moved aside because they failed their checksums
(``.corrupt-*``, ``infra.artifacts.ArtifactStore.verify``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.artifacts import CORRUPT_PREFIX
from infra.runs import RunsLayout

TMP_MIN_AGE_S = 3600.0


@dataclass
class GcPlan:
    """What ``collect`` found: artifacts to remove (stage, key, path, bytes), kept ones, and unfinished folders."""

    remove: list[tuple[str, str, Path, int]] = field(default_factory=list)
    keep: list[tuple[str, str]] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(size for *_, size in self.remove) + sum(_size(p) for p in self.unfinished)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def referenced(layout: RunsLayout) -> tuple[set[str], list[Path]]:
    """(artifact keys tagged on active MLflow runs, registered model version sources as paths)."""
    if not layout.mlflow_db.exists():
        return set(), []
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri=layout.tracking_uri, registry_uri=layout.tracking_uri)
    keys: set[str] = set()
    experiments = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    for experiment in experiments:
        token = None
        while True:
            page = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                                      max_results=1000, page_token=token)
            keys |= {r.data.tags["artifact_key"] for r in page if "artifact_key" in r.data.tags}
            token = page.token
            if not token:
                break
    sources = [Path(v.source) for v in client.search_model_versions() if v.source and "://" not in v.source]
    return keys, sources


def collect(layout: RunsLayout, *, min_age_s: float = TMP_MIN_AGE_S) -> GcPlan:
    """Decide what ``gc`` would remove; removes nothing."""
    keys, sources = referenced(layout)
    plan = GcPlan()
    root = layout.artifacts
    now = time.time()
    for stage_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for path in sorted(stage_dir.iterdir()):
            if path.name.startswith(CORRUPT_PREFIX):  # moved aside by a run: never read again
                plan.unfinished.append(path)
                continue
            if path.name.startswith(".tmp-"):
                if now - path.stat().st_mtime >= min_age_s:
                    plan.unfinished.append(path)
                continue
            inside = any(s == path or path in s.parents for s in sources)
            if path.name in keys or inside:
                plan.keep.append((stage_dir.name, path.name))
            else:
                plan.remove.append((stage_dir.name, path.name, path, _size(path)))
    return plan


def apply(plan: GcPlan) -> None:
    """Remove what ``plan`` lists."""
    for *_, path, _ in plan.remove:
        shutil.rmtree(path, ignore_errors=True)
    for path in plan.unfinished:
        shutil.rmtree(path, ignore_errors=True)
