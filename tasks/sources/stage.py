"""Sources stage: read every configured source into one Parquet file of raw documents per source.

Outputs: ``docs/<source>.parquet`` (doc_id, source, path, language_hint, content, content_type, licence,
snapshot; written as read, in bounded row groups: ``tasks.sources.read.RowWriter``), ``rejects.parquet`` (inputs
that could not become documents, with a reason, every source's in config order) and
``sources.json`` (per source: kind, package, snapshot, licence, role, docs read, rejects; with a ``url_field``, the
count of its values that are not URLs, ``url_invalid``, and a few of them; for a Debian source the pinned
``version`` and the ``release`` fetched: version, architecture, .deb SHA256).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd

from infra.stage import StageContext
from tasks.sources.config import SourceConfig
from tasks.sources.deb import DebPackage, DebRelease, fetch_deb, resolve_debs
from tasks.sources.read import REJECT_SCHEMA, RowWriter, read_source


def run(ctx: StageContext, sources: Mapping[str, SourceConfig],
        releases: Mapping[str, DebRelease] | None = None) -> dict[str, Any]:
    """Read all sources; returns per-source document counts.

    ``releases`` gives, per Debian source name, the exact release to fetch (the one in the artifact key); Debian
    sources missing from it are resolved now (``resolve_debs``).

    Raises:
        SourceError: as ``read_source`` and ``resolve_debs``.
    """
    (ctx.out / "docs").mkdir()
    releases = dict(releases or {})
    missing = {name: (cfg.package, cfg.version) for name, cfg in sources.items()
               if cfg.kind == "deb" and name not in releases}
    if missing:
        resolved = resolve_debs(missing.values(), update_lists=True)
        releases.update({name: resolved[want] for name, want in missing.items()})
    packages = fetch_packages(ctx, [releases[name] for name, cfg in sources.items() if cfg.kind == "deb"])
    described = {}
    with (ctx.progress.task("sources: reading", len(sources)) as advance,
          RowWriter(ctx.out / "rejects.parquet", REJECT_SCHEMA) as rejects):
        for name, cfg in sources.items():
            advance(0, doing=f"reading {name}")
            release = releases.get(name)
            read = read_source(cfg, ctx.layout.source_cache, ctx.out / "docs" / f"{name}.parquet", rejects,
                               release=release, package=packages.get(release) if release is not None else None)
            described[name] = {
                "kind": cfg.kind, "package": cfg.package, "role": cfg.role, "language": cfg.language,
                "snapshot": read.snapshot, "licence": read.licence,
                "docs_read": read.num_docs, "rejects": read.num_rejects, "skipped": dict(read.skipped),
            }
            if cfg.url_field:  # values of the field that are not URLs, read as no URL
                described[name]["url_invalid"] = read.url_invalid
                described[name]["url_invalid_examples"] = list(read.url_invalid_examples)
            if cfg.kind == "deb":
                described[name]["version"] = cfg.version
                described[name]["release"] = releases[name].key_fields()
            advance(1)
    (ctx.out / "sources.json").write_text(json.dumps(described, indent=2))
    return {"docs_read": {k: v["docs_read"] for k, v in described.items()}}


def fetch_packages(ctx: StageContext, releases: list[DebRelease]) -> dict[DebRelease, DebPackage]:
    """Download (or reuse from the source cache) and unpack each distinct release, one progress step per package,
    before any source is read: downloads are the slow part on a fresh machine, and get a bar of their own.

    Raises:
        SourceError: as ``fetch_deb``.
    """
    distinct = list(dict.fromkeys(releases))
    packages: dict[DebRelease, DebPackage] = {}
    if not distinct:
        return packages
    with ctx.progress.task(f"sources: fetching {len(distinct)} Debian package(s)", len(distinct)) as advance:
        for release in distinct:
            advance(0, doing=f"fetching {release.package}")
            packages[release] = fetch_deb(release.package, ctx.layout.source_cache, release=release)
            advance(1)
    return packages


def load_docs(path) -> pd.DataFrame:
    """All raw documents of a sources artifact, concatenated in config order."""
    described = json.loads((path / "sources.json").read_text())
    return pd.concat([pd.read_parquet(path / "docs" / f"{name}.parquet") for name in described], ignore_index=True)
