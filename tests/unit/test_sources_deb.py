"""Debian sources: the package version is resolved before the sources key is computed and is part of it, a pin is
checked against the apt package lists and goes into the download, and local sources are keyed by their bytes.

The apt tools are stood in for by small scripts on PATH (deterministic, whatever the live archive holds); the
.debs they hand out are real ones built with dpkg-deb. One test reads the machine's real apt lists, if any."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.config import parse_config
from flows.status import stage_statuses
from infra.artifacts import ArtifactStore, canonical_json
from infra.errors import ConfigError, SourceError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.sources import deb
from tasks.sources.config import SourceConfig, check_version
from tasks.sources.deb import DebRelease, fetch_deb, resolve_deb

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "demo-doc"
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")

FAKE_APT_CACHE = """#!{python}
import json, sys
records = json.load(open({records!r}))
args = [a for a in sys.argv[1:] if a != "--"]
assert args[0] == "show", args
all_versions = "--no-all-versions" not in args
for query in [a for a in args[1:] if not a.startswith("-")]:
    name, _, version = query.partition("=")
    mine = [r for r in records if r["Package"] == name and (not version or r["Version"] == version)]
    for r in (mine if all_versions or version else mine[:1]):  # the first record stands for the candidate
        print("\\n".join(f"{{k}}: {{v}}" for k, v in r.items()) + "\\n")
"""

FAKE_APT_GET = """#!{python}
import os, shutil, sys
with open({log!r}, "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "download":
    name, _, version = sys.argv[2].partition("=")
    src = os.path.join({debs!r}, f"{{name}}_{{version}}_all.deb")
    if not version or not os.path.exists(src):
        sys.exit("E: Can't find a source to download version " + repr(version) + " of " + repr(name))
    shutil.copy(src, os.path.basename(src))
"""


def _build_deb(where: Path, version: str, body: str) -> Path:
    tree = where / f"tree-{version}"
    doc = tree / "usr" / "share" / "doc" / PACKAGE
    doc.mkdir(parents=True)
    (doc / "index.html").write_text(f"<html><body><p>{body}</p></body></html>")
    (doc / "copyright").write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
                                   "Files: *\nLicense: CC0-1.0\n")
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN" / "control").write_text(f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\n"
                                             "Maintainer: Nobody <nobody@example.org>\nDescription: test package\n")
    out = where / f"{PACKAGE}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """apt-cache and apt-get stand-ins: the lists hold demo-doc 1.0-2 (candidate) and 1.0-1; returns the log of
    apt-get command lines."""
    debs, bin_dir = tmp_path / "archive", tmp_path / "bin"
    debs.mkdir()
    bin_dir.mkdir()
    records = []
    for version, body in (("1.0-2", "second release"), ("1.0-1", "first release")):
        path = _build_deb(debs, version, body)
        records.append({"Package": PACKAGE, "Version": version, "Architecture": "all",
                        "SHA256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (tmp_path / "records.json").write_text(json.dumps(records))
    log = tmp_path / "apt-get.log"
    log.write_text("")
    for name, script in (("apt-cache", FAKE_APT_CACHE), ("apt-get", FAKE_APT_GET)):
        tool = bin_dir / name
        tool.write_text(script.format(python=sys.executable, records=str(tmp_path / "records.json"),
                                      log=str(log), debs=str(debs)))
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "example_Packages").write_text("")  # apt-get update is never needed
    monkeypatch.setattr(deb, "APT_LISTS", lists)
    return SimpleNamespace(log=log, records=records)


@pytest.mark.parametrize("version", ["3.11.2-6+deb12u8", "1:1.99.1-7.3", "2.98", "1.0~rc1-1", "0:1.2-3-4"])
def test_debian_versions_are_accepted(version):
    assert check_version(version) == version
    assert SourceConfig(name="s", kind="deb", package="fortunes", version=version, include=["*"]).version == version


@pytest.mark.parametrize("version", ["", "-1", "1.0-", "a1.0", "1:2:3", "1.0 -1", "1.0;rm", "--force", "x:1.0"])
def test_malformed_versions_are_refused(version):
    with pytest.raises(ConfigError, match="not a Debian package version"):
        SourceConfig(name="s", kind="deb", package="fortunes", version=version, include=["*"])


def test_version_is_only_for_debian_sources():
    with pytest.raises(ConfigError, match="only for kind='deb'"):
        SourceConfig(name="s", kind="local", version="1.0-1", include=["*"])


def _demo_like(**python_doc) -> dict:
    """The smoke config with one Debian source in place of a local one (paths made absolute)."""
    raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
    for src in raw["sources"].values():
        src["include"] = [str(ROOT / p) for p in src["include"]]
    raw["gate"]["cloze_items"] = [str(ROOT / p) for p in raw["gate"]["cloze_items"]]
    name = next(n for n, s in raw["sources"].items() if s.get("role") == "domain")
    raw["sources"][name] = {"kind": "deb", "package": "python3.11-doc", "role": "domain", "format": "html",
                            "language": "en", "include": ["usr/share/doc/python3.11/html/**/*.html"], **python_doc}
    return raw


def _resolver(version: str):
    def resolve(wanted, *, update_lists=False):
        return {(p, v): DebRelease(p, v or version, "all", (v or version).encode().hex().ljust(64, "0")[:64])
                for p, v in wanted}
    return resolve


def test_a_moved_archive_is_a_new_sources_key_that_status_names(tmp_path, monkeypatch):
    raw = _demo_like()
    domain = next(n for n, s in raw["sources"].items() if s["kind"] == "deb")
    cfg, layout = parse_config(raw), RunsLayout(tmp_path / "runs")
    monkeypatch.setattr(deb, "resolve_debs", _resolver("3.11.2-6+deb12u8"))
    before = stage_statuses(cfg, layout)
    from flows.registry import get_stage
    from infra.artifacts import code_version_closure

    sources = get_stage("sources")
    config = sources.key_config(cfg)
    assert config["sources"][domain]["resolved"]["version"] == "3.11.2-6+deb12u8"
    store = ArtifactStore(layout.artifacts)
    store.commit("sources", before[0].key, store.begin("sources", before[0].key),
                 {"config": json.loads(canonical_json(config)), "input_keys": {},
                  "code_version": code_version_closure(sources.code)})

    monkeypatch.setattr(deb, "resolve_debs", _resolver("3.11.2-6+deb12u9"))
    after = stage_statuses(cfg, layout)
    assert all(a.key != b.key for a, b in zip(before, after))  # every downstream key moves with it
    assert not after[0].cached and after[0].nearest == before[0].key
    assert after[0].reasons == [f"sources: python3.11-doc 3.11.2-6+deb12u8 → 3.11.2-6+deb12u9 (source {domain})"]

    # Pinning the version already fetched keeps the key (and the cached artifact).
    pinned = parse_config(_demo_like(version="3.11.2-6+deb12u8"))
    assert stage_statuses(pinned, layout)[0].key == before[0].key and stage_statuses(pinned, layout)[0].cached


@needs_dpkg
def test_resolution_reads_the_candidate_and_checks_a_pin_against_the_lists(fake_apt):
    assert resolve_deb(PACKAGE) == DebRelease(PACKAGE, "1.0-2", "all", fake_apt.records[0]["SHA256"])
    assert resolve_deb(PACKAGE, "1.0-1").sha256 == fake_apt.records[1]["SHA256"]
    with pytest.raises(SourceError, match=r"demo-doc version 0\.9-1 is not in the apt package lists \(they have: "
                                          r"1\.0-2, 1\.0-1\)"):
        resolve_deb(PACKAGE, "0.9-1")
    with pytest.raises(SourceError, match="apt-cache knows no package 'other-doc'"):
        resolve_deb("other-doc")
    assert fake_apt.log.read_text() == ""  # resolving downloads nothing


@needs_dpkg
def test_a_pinned_version_is_what_apt_get_downloads_and_a_cached_deb_is_reused(fake_apt, tmp_path):
    cache = tmp_path / "cache"
    pkg = fetch_deb(PACKAGE, cache, "1.0-1")
    assert fake_apt.log.read_text().splitlines() == [f"download {PACKAGE}=1.0-1"]
    assert pkg.version == "1.0-1" and pkg.release.sha256 == fake_apt.records[1]["SHA256"]
    assert "first release" in (pkg.root / "usr/share/doc" / PACKAGE / "index.html").read_text()
    assert pkg.licence == "CC0-1.0"

    assert fetch_deb(PACKAGE, cache, "1.0-1").deb_path == pkg.deb_path  # same release: no second download
    candidate = fetch_deb(PACKAGE, cache)  # unpinned: the candidate, downloaded pinned, beside the first
    assert candidate.version == "1.0-2" and "second release" in (candidate.root / "usr/share/doc" / PACKAGE /
                                                                 "index.html").read_text()
    assert fake_apt.log.read_text().splitlines() == [f"download {PACKAGE}=1.0-1", f"download {PACKAGE}=1.0-2"]

    pkg.deb_path.write_bytes(b"truncated")  # a damaged cached file is not the release: fetched again
    assert fetch_deb(PACKAGE, cache, "1.0-1").version == "1.0-1"
    assert fake_apt.log.read_text().splitlines()[-1] == f"download {PACKAGE}=1.0-1"


@needs_dpkg
def test_the_sources_stage_fetches_the_release_its_key_names(fake_apt, tmp_path):
    from recording_progress import RecordingProgress
    from tasks.sources.definition import run_sources as _run_sources

    src = SourceConfig(name="doc", kind="deb", package=PACKAGE, include=["usr/share/doc/demo-doc/*.html"])
    # A second source from the same package: one download serves both.
    same = SourceConfig(name="doc2", kind="deb", package=PACKAGE, include=["usr/share/doc/demo-doc/*.html"])
    out = tmp_path / "out"
    out.mkdir()
    # The key was computed when the lists still had 1.0-1 as the candidate; they now say 1.0-2.
    resolved = {"version": "1.0-1", "architecture": "all", "sha256": fake_apt.records[1]["SHA256"]}
    key_config = {"sources": {name: {**cfg.model_dump(exclude={"version"}), "resolved": resolved}
                              for name, cfg in (("doc", src), ("doc2", same))}}
    progress = RecordingProgress()
    ctx = StageContext(out=out, inputs={}, layout=RunsLayout(tmp_path / "runs"), key="k", experiment="t",
                       key_config=key_config, progress=progress)
    _run_sources(ctx, SimpleNamespace(sources={"doc": src, "doc2": same}))
    described = json.loads((out / "sources.json").read_text())
    assert described["doc"]["snapshot"] == "1.0-1" and described["doc"]["release"] == resolved
    assert described["doc2"]["docs_read"] == described["doc"]["docs_read"] == 1
    assert fake_apt.log.read_text().splitlines() == [f"download {PACKAGE}=1.0-1"]
    # The download has a bar of its own, one step per package, done before reading starts.
    fetching, reading = progress.bars
    assert fetching.description == "sources: fetching 1 Debian package(s)"
    assert (fetching.total, fetching.finished) == (1, True)
    assert (reading.description, reading.total, reading.finished) == ("sources: reading", 2, True)


def test_local_sources_are_keyed_by_their_bytes_not_their_mtime(tmp_path):
    from tasks.sources.definition import key_sources

    page = tmp_path / "a.txt"
    page.write_text("first text")
    cfg = SimpleNamespace(sources={"loc": SourceConfig(name="loc", kind="local", include=[str(tmp_path / "*.txt")])})
    first = key_sources(cfg)["sources"]
    stat = page.stat()
    page.write_text("other text")  # same size, and the mtime put back as cp -p or rsync -a would
    os.utime(page, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert key_sources(cfg)["sources"] != first
    page.write_text("first text")
    os.utime(page, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, new mtime: same key
    assert key_sources(cfg)["sources"] == first


@pytest.mark.skipif(shutil.which("apt-cache") is None or not any(deb.APT_LISTS.glob("*_Packages*")),
                    reason="no apt-cache or no apt package lists on this machine")
def test_real_apt_lists_resolve_python_doc():
    try:
        release = resolve_deb("python3.11-doc")
    except SourceError as err:
        pytest.skip(f"the apt lists here do not carry python3.11-doc: {err}")
    assert check_version(release.version) and release.architecture == "all" and len(release.sha256) == 64
    assert resolve_deb("python3.11-doc", release.version) == release
    with pytest.raises(SourceError, match=rf"python3\.11-doc version 0\.0-0 .*{re.escape(release.version)}"):
        resolve_deb("python3.11-doc", "0.0-0")


@needs_dpkg
@pytest.mark.e2e
def test_a_run_names_the_source_whose_candidate_moved_since_the_last_run(fake_apt, tmp_path):
    """`pretrain run` twice, an apt-get update between them moving the candidate of a Debian source: the second
    run prints one line naming the source, both versions and the pin that keeps the old one, before it recomputes."""
    text = (ROOT / "configs/smoke.toml").read_text()
    local = 'kind = "local"\ninclude = ["tests/fixtures/smoke/python_doc/*.html"]'
    assert local in text
    config = tmp_path / "moved.toml"
    config.write_text(text.replace(local, f'kind = "deb"\npackage = "{PACKAGE}"\n'
                                          f'include = ["usr/share/doc/{PACKAGE}/*.html"]'))
    records = tmp_path / "records.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PRETRAIN_TRACKING_URI")}

    def run() -> str:
        proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config), "--until", "sources",
                               "--runs-dir", str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    first = run()  # the candidate is 1.0-2 (the first record)
    assert "moved from" not in first
    records.write_text(json.dumps(fake_apt.records[::-1]))  # the lists now say 1.0-1
    second = run()
    notices = [line for line in second.splitlines() if "moved from" in line]
    assert notices == ["sources: python_doc moved from 1.0-2 to 1.0-1 since the last run; sources and every stage "
                       'after it are recomputed (pin it with version = "1.0-2" in [sources.python_doc] to keep the '
                       "old one)"], second[-3000:]
    assert second.index(notices[0]) < second.index("sources: started")
    # (That the record then says 1.0-1, so a third run is silent, is tests/unit/test_source_versions.py's.)
