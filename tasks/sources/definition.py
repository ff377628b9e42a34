"""The sources stage's face: key (config plus what each source resolves to), run."""

from __future__ import annotations

from typing import Any

from infra.section import key_dump
from infra.stage import Stage, StageContext


def key_sources(cfg: Any) -> dict[str, Any]:
    """Source configs plus what determines their content, so a key names one content only.

    Debian sources: the release the apt package lists resolve now (version, architecture, .deb SHA256; offline,
    ``tasks.sources.deb.resolve_debs``) instead of the pin, so a moved archive is a new key and pinning the version
    already used keeps the key. Local files: a digest of each file read's relative path, size and bytes
    (metadata such as mtimes can stay the same while bytes change, as with ``cp -p`` or ``touch -r``).
    """
    from tasks.sources import deb
    from tasks.sources.read import local_files, local_files_digest

    releases = deb.resolve_debs((s.package, s.version) for s in cfg.sources.values() if s.kind == "deb")
    keyed = {}
    for name, src in cfg.sources.items():
        keyed[name] = key_dump(src)
        if src.kind == "deb":
            keyed[name]["resolved"] = releases[(src.package, src.version)].key_fields()
        else:
            keyed[name]["files"] = local_files_digest(local_files(src)[0])
    return {"sources": keyed}


def run_sources(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    """Fetch the Debian releases the key was computed from (``ctx.key_config``), never ones resolved again later;
    without a key config (library use) they are resolved now."""
    from tasks.sources.deb import DebRelease
    from tasks.sources.stage import run

    keyed = (ctx.key_config or {}).get("sources", {})
    releases = {name: DebRelease(package=src.package, **keyed[name]["resolved"])
                for name, src in cfg.sources.items() if src.kind == "deb" and "resolved" in keyed.get(name, {})}
    return run(ctx, cfg.sources, releases=releases)


STAGE = Stage(name="sources", inputs=(), code="tasks.sources", run=run_sources, key_extra=key_sources)
