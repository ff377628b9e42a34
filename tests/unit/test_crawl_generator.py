"""The synthetic crawl of the corpus scale benchmark (benchmarks/crawl.py) and a tiny run of the benchmark itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks import corpus_scale, crawl  # noqa: E402
from tasks.corpus.config import CorpusConfig  # noqa: E402
from tasks.corpus.extract import extract_html, tidy  # noqa: E402
from tasks.corpus.filters import INPUT_COLUMNS  # noqa: E402
from tasks.corpus.minhash import jaccard, shingles  # noqa: E402
from tasks.corpus.quality import CHARACTER_LANGUAGES  # noqa: E402

SPEC = crawl.CrawlSpec(docs=600, seed=3, batch_rows=128, file_docs=256, verify_pairs=40)


@pytest.fixture(scope="module")
def pool():
    return crawl.load_pool("fixtures")


@pytest.fixture(scope="module")
def generated(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("crawl")
    report = crawl.generate(SPEC, pool, out)
    return out, report


def _docs(out: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in crawl.doc_files(out)], ignore_index=True)


def _text(content: str, content_type: str) -> str:
    """What the build shingles: the main text of HTML, tidied."""
    return tidy(extract_html(content) or "") if content_type == "html" else tidy(content)


def _jaccard(a: pd.Series, b: pd.Series, nd) -> float:
    by_chars = a.language_hint in CHARACTER_LANGUAGES
    return jaccard(shingles(_text(a.content, a.content_type), nd.shingle_size, by_chars),
                   shingles(_text(b.content, b.content_type), nd.shingle_size, by_chars))


def test_same_seed_same_crawl_other_seed_other_crawl(pool, generated, tmp_path):
    out, _ = generated
    again = crawl.generate(SPEC, pool, tmp_path / "again")
    crawl.generate(crawl.CrawlSpec(**{**SPEC.__dict__, "seed": 4}), pool, tmp_path / "other")
    first, second, third = _docs(out), _docs(tmp_path / "again"), _docs(tmp_path / "other")
    pd.testing.assert_frame_equal(first, second)
    assert again["content_bytes"] == generated[1]["content_bytes"]
    assert (first.content != third.content).mean() > 0.9


_GENERATE = """
import json, sys
from pathlib import Path
sys.path.append(sys.argv[1])
from benchmarks import crawl
snapshot = Path(sys.argv[3]) if len(sys.argv) > 3 else None
pool = crawl.load_pool("fixtures", snapshot_dir=snapshot)
crawl.generate(crawl.CrawlSpec(docs=300, seed=5, batch_rows=128, verify_pairs=10), pool, Path(sys.argv[2]))
print(json.dumps({"digest": pool.digest, "origin": pool.origin}))
"""


def _generate_in_a_process(out: Path, hash_seed: str, snapshot: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    args = [sys.executable, "-c", _GENERATE, str(ROOT), str(out)] + ([str(snapshot)] if snapshot else [])
    proc = subprocess.run(args, env=env, cwd=out.parent, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _crawl_bytes(out: Path) -> dict[str, bytes]:
    """Every file of a crawl but its report (which holds timings), by name."""
    return {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*.parquet"))}


def test_pool_digest_and_crawl_bytes_are_the_same_in_separate_processes(tmp_path):
    """Two interpreters with different str hash seeds (set iteration order, dict-of-set orders) make the same
    text pool and write the same crawl, byte for byte: a crawl folder is reusable from any process."""
    first = _generate_in_a_process(tmp_path / "a", "1")
    second = _generate_in_a_process(tmp_path / "b", "2")
    assert first == second and first["origin"] == "fixtures"
    assert first["digest"] == crawl.load_pool("fixtures").digest  # and the same in this process
    a, b = _crawl_bytes(tmp_path / "a"), _crawl_bytes(tmp_path / "b")
    assert len(a) >= 2 and a == b
    report = json.loads((tmp_path / "a" / "crawl.json").read_text())
    assert report["pool_digest"] == first["digest"]


def test_a_text_snapshot_makes_the_pool_independent_of_the_sources(tmp_path, monkeypatch):
    snapshot = tmp_path / "crawls"
    made = crawl.load_pool("fixtures", snapshot_dir=snapshot)
    assert (snapshot / "text-fixtures.parquet").is_file()
    assert made.digest == crawl.load_pool("fixtures").digest  # the snapshot holds the text the sources give

    def no_sources(*args, **kwargs):
        raise AssertionError("the sources were read again")

    monkeypatch.setattr(crawl, "real_documents", no_sources)
    again = crawl.load_pool("fixtures", snapshot_dir=snapshot)
    assert again.digest == made.digest and again.origin == "fixtures"
    assert crawl.load_pool("auto", tmp_path / "no-runs", snapshot_dir=snapshot).digest == made.digest
    # Another process (another hash seed) reads the same snapshot and writes the same crawl.
    monkeypatch.undo()
    first = _generate_in_a_process(tmp_path / "a", "3", snapshot)
    second = _generate_in_a_process(tmp_path / "b", "4", snapshot)
    assert first["digest"] == second["digest"] == made.digest
    assert _crawl_bytes(tmp_path / "a") == _crawl_bytes(tmp_path / "b")


def test_writes_the_declared_counts_in_the_build_schema(generated):
    out, report = generated
    docs = _docs(out)
    labels = pd.read_parquet(out / "labels.parquet")
    assert list(docs.columns) == INPUT_COLUMNS
    assert len(docs) == SPEC.docs == report["docs"] and docs.doc_id.is_unique
    assert list(labels.doc_id) == list(docs.doc_id)
    counts = labels.kind.value_counts().to_dict()
    assert counts["near"] == round(SPEC.docs * SPEC.near_share) == report["written"]["near"]
    assert counts["exact"] == round(SPEC.docs * SPEC.exact_share) == report["written"]["exact"]
    assert counts["original"] == SPEC.docs - counts["near"] - counts["exact"]
    # Row groups of batch_rows documents, files of file_docs.
    files = [pq.ParquetFile(f).metadata for f in crawl.doc_files(out)]
    assert [f.num_rows for f in files] == [256, 256, 88]
    assert [f.row_group(i).num_rows for f in files for i in range(f.num_row_groups)] == [128] * 4 + [88]
    assert set(docs.content_type) == {"html", "text"} and docs.source.nunique() >= 4
    assert set(docs.language_hint) == {"en", "zh"}
    assert report["content_bytes"] == sum(len(c.encode()) for c in docs.content)
    # Exact copies are their origin byte for byte, of the same source, later in corpus order.
    by_id = docs.set_index("doc_id")
    exact = labels[labels.kind == "exact"]
    assert (by_id.content[exact.doc_id].to_numpy() == by_id.content[exact.origin_id].to_numpy()).all()
    assert (by_id.source[exact.doc_id].to_numpy() == by_id.source[exact.origin_id].to_numpy()).all()
    position = pd.Series(range(len(docs)), index=docs.doc_id)
    derived = labels[labels.kind != "original"]
    assert (position[derived.origin_id].to_numpy() < position[derived.doc_id].to_numpy()).all()
    assert set(labels.kind[labels.doc_id.isin(derived.origin_id)]) == {"original"}
    assert report["measured"]["exact_share"] == pytest.approx(counts["exact"] / SPEC.docs)


def test_near_duplicates_are_near_and_unrelated_documents_are_not(generated):
    out, report = generated
    nd = CorpusConfig().near_dedup
    docs = _docs(out).set_index("doc_id", drop=False)
    labels = pd.read_parquet(out / "labels.parquet")
    near = labels[labels.kind == "near"].iloc[:60]
    sims = [_jaccard(docs.loc[row.doc_id], docs.loc[row.origin_id], nd) for row in near.itertuples()]
    above = sum(s >= nd.jaccard_threshold for s in sims) / len(sims)
    assert above >= 0.9, sorted(sims)[:10]
    assert (docs.content[near.doc_id].to_numpy() != docs.content[near.origin_id].to_numpy()).all()
    originals = labels[labels.kind == "original"].doc_id.tolist()
    unrelated = []
    for a, b in zip(originals[:80], originals[1:81]):
        if docs.source[a] == docs.source[b]:
            unrelated.append(_jaccard(docs.loc[a], docs.loc[b], nd))
    assert len(unrelated) >= 10 and max(unrelated) < 0.5
    # The generator's own measurement of its sample agrees.
    measured = report["measured"]
    assert measured["near_pairs"] == SPEC.verify_pairs and measured["near_above_threshold"] >= 0.9
    assert measured["near_share"] == pytest.approx(SPEC.near_share * measured["near_above_threshold"])
    assert measured["unrelated_above_threshold"] == 0.0


def test_spec_refuses_bad_shares():
    with pytest.raises(ValueError, match="near_share"):
        crawl.CrawlSpec(docs=10, near_share=1.5).check()
    with pytest.raises(ValueError, match="exceeds 1"):
        crawl.CrawlSpec(docs=10, near_share=0.7, exact_share=0.4).check()


def test_harness_end_to_end_on_300_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(corpus_scale.CODE_ENV, str(ROOT))
    out = tmp_path / "scale.json"
    result = corpus_scale.run(["--sizes", "300", "--text", "fixtures", "--workers", "2", "--shard-docs", "100",
                               "--calibrate-docs", "0", "--verify-pairs", "20", "--work-dir", str(tmp_path),
                               "--memory-limit", "48MB", "--worker-ratio", "1", "--out", str(out)])
    (row,) = result["builds"]
    assert row["engine"] == "processes" and row["docs"] == 300 and row["timeline"]["build_module"].startswith(
        str(ROOT))
    assert 0 < row["wall_s"] < 60 and row["docs_per_s"] == pytest.approx(300 / row["wall_s"])
    assert row["mb_per_s_per_core"] == pytest.approx(row["content_bytes"] / 1e6 / row["wall_s"] / row["cores"])
    roles = {p["role"] for p in row["processes"]}
    assert {"main", "worker"} <= roles
    assert 50 < row["main_peak_mb"] < 4000 and 20 < row["largest_worker_mb"] < 4000
    workers = [p for p in row["processes"] if p["role"] == "worker" and p["shard_calls"]]
    assert len({p["pid"] for p in workers}) >= 2  # two workers shared the three shards of a pass
    passes = row["passes"]
    for name in ("filter", "key"):
        assert passes[name]["kind"] == "parallel" and passes[name]["calls"] == 3 and passes[name]["busy_core_s"] > 0
    assert passes["split"]["kind"] == "serial"
    assert sum(p["seconds"] for p in passes.values()) == pytest.approx(row["wall_s"], rel=0.01)
    outputs = row["outputs"]
    assert 0 < outputs["kept"] < 300 and outputs["kept"] + sum(outputs["removed_by_stage"].values()) == 300
    assert outputs["fate_by_kind"]["exact"].get("dedup_exact", 0) > 0
    assert sum(n for fate in outputs["fate_by_kind"].values() for n in fate.values()) == 300
    kept_fates = {f for fate in outputs["fate_by_kind"].values() for f in fate if f.startswith("kept")}
    assert kept_fates <= {"kept", "kept_origin_filtered", "kept_boilerplate_cut"} and "kept" in kept_fates
    ext = result["extrapolation"]["processes"]["mixed"]
    assert ext["machines"][1]["total_h"] > ext["machines"][64]["total_h"] > 0
    ratio = result["worker_ratio"]  # the same crawl again with 1 worker and with 2, not among the builds
    assert ratio["docs"] == 300 and [len(ratio["walls_s"][n]) for n in (1, 2)] == [1, 1]
    assert ratio["ratio"] == pytest.approx(ratio["walls_s"][1][0] / ratio["walls_s"][2][0])
    saved = json.loads(out.read_text())
    assert saved["builds"][0]["docs"] == 300 and saved["memory_limit"] == "48MB"


def test_serial_parts_extrapolate_as_fixed_plus_per_document_over_two_sizes():
    def fig(docs: int) -> dict:
        return {"docs": docs, "content_bytes": docs * 1000, "passes": {
            "filter": {"kind": "parallel", "seconds": docs / 500, "busy_core_s": docs / 250},
            "decide": {"kind": "serial", "seconds": 0.5 + 2e-6 * docs, "busy_core_s": 0.0},
            "noise": {"kind": "serial", "seconds": 0.3 - 1e-7 * docs, "busy_core_s": 0.0}}}

    ext = corpus_scale.extrapolate({"text": [fig(20_000), fig(50_000)]}, {}, [1, 64], 2, {})["text"]
    docs_tb = 1e12 / 1000
    assert ext["rates"]["decide"]["us_per_doc"] == pytest.approx(2.0)
    assert ext["rates"]["decide"]["seconds_1tb"] == pytest.approx(0.5 + 2e-6 * docs_tb)
    assert ext["rates"]["noise"]["seconds_1tb"] == pytest.approx(0.3 - 1e-7 * 20_000)  # falling: a constant
    serial_h = (0.5 + 2e-6 * docs_tb + 0.298) / 3600
    assert ext["machines"][64]["serial_h"] == pytest.approx(serial_h)
    parallel_h = 1e12 / 1e6 / (1000 * 250 / 1e6 * 64 * 2) / 3600
    assert ext["machines"][64]["parallel_h"] == pytest.approx(parallel_h)
    one = corpus_scale.extrapolate({"text": [fig(20_000)]}, {}, [64], 2, {})["text"]  # one size: charged per byte
    assert one["rates"]["decide"]["seconds_1tb"] == pytest.approx(docs_tb * (0.5 + 2e-6 * 20_000) / 20_000)
