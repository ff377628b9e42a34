"""The tokenizer stage streams the kept corpus part by part: its artifact (splits, removals, tokenizer, shards,
reports) is the same whatever the corpus's part sizes, the documents per encode call and the workers encoding them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from infra.runs import RunsLayout
from infra.shard_map import process_map
from infra.stage import StageContext
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.stage import run

PASSAGE = ("the backup script copies every database dump to the remote archive and then checks the checksum "
           "of each file before it deletes the local copy")


def _documents() -> pd.DataFrame:
    rng = random.Random(0)
    words = {"en": "the cat sat on a mat and ran far away home".split(), "zh": list("我们的软件包虚拟机世界你好")}
    rows = []
    for source, language, n_docs in (("web_en", "en", 70), ("wiki_zh", "zh", 40), ("docs", "en", 30)):
        for i in range(n_docs):
            text = " ".join(rng.choice(words[language]) for _ in range(rng.randrange(0, 60)))
            if language == "en" and i % 6 == 0:  # a quoted passage: held-out and training copies share it
                text += " " + PASSAGE
            family = f"{source}/{i // 3}" if i % 4 == 0 else f"{source}/{i}"  # some families of several documents
            rows.append(dict(doc_id=f"{source}/{i}", source=source, family_id=family, text=text, language=language,
                             n_chars=len(text), n_bytes=len(text.encode())))
    return pd.DataFrame(rows).sample(frac=1.0, random_state=1).reset_index(drop=True)  # sources interleaved


def _corpus(folder: Path, docs: pd.DataFrame, sizes: list[int]) -> Path:
    (folder / "kept").mkdir(parents=True)
    start, p = 0, 0
    while start < len(docs):
        size = sizes[p % len(sizes)]
        docs.iloc[start:start + size].to_parquet(folder / "kept" / f"part-{p:05d}.parquet", index=False)
        start, p = start + size, p + 1
    (folder / "manifest.json").write_text(json.dumps({"manifest_hash": "0" * 64}))
    return folder


def _two_processes(execution, on_done=None, **_):
    def run_calls(fn, calls, label):
        results = process_map(2)(fn, calls, label)
        for _ in results:
            if on_done:
                on_done()
        return results
    return run_calls


def _artifact(root: Path, docs: pd.DataFrame, sizes: list[int], part_docs: int, workers: int) -> Path:
    corpus = _corpus(root / "corpus", docs, sizes)
    out = root / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    extra = {"shard_map_for": _two_processes} if workers == 2 else {}
    ctx = StageContext(out=out, inputs={"corpus": corpus}, layout=RunsLayout(root), key="k", experiment="t", **extra)
    cfg = TokenizerConfig(vocab_size=300, sample_max_chars=4000, heldout_fraction=0.2, min_heldout_docs=3,
                          decontam_common_docs=4, execution={"part_docs": part_docs})
    summary = run(ctx, cfg)
    assert summary["decontaminated_train_docs"] > 0
    assert not (root / "scratch" / "tokenizer" / "k" / "stream").exists()  # the per-document files are cleaned up
    return out


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    return _artifact(tmp_path_factory.mktemp("whole"), _documents(), [10_000], 10_000, 1)


@pytest.mark.parametrize("sizes, part_docs, workers", [([1, 50, 7], 10_000, 1), ([23], 4, 1), ([40, 3], 6, 2)])
def test_the_artifact_does_not_depend_on_parts_call_size_or_workers(whole, tmp_path, sizes, part_docs, workers):
    other = _artifact(tmp_path, _documents(), sizes, part_docs, workers)
    names = sorted(p.relative_to(whole) for p in whole.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file())
    for name in names:
        if name.suffix == ".parquet":
            pd.testing.assert_frame_equal(pd.read_parquet(whole / name), pd.read_parquet(other / name))
        else:
            assert (whole / name).read_bytes() == (other / name).read_bytes(), name


def test_splits_keep_families_together_and_removed_documents_are_nowhere_else(whole):
    splits = pd.read_parquet(whole / "splits.parquet")
    removals = pd.read_parquet(whole / "removals.parquet")
    assert (splits.groupby("family_id")["split"].nunique() == 1).all()
    assert not set(removals["doc_id"]) & set(splits["doc_id"])
    assert len(splits) + len(removals) == len(_documents())
    headers = pd.read_parquet(whole / "shards.parquet").set_index(["source", "split"])
    assert headers["n_docs"].to_dict() == splits.groupby(["source", "split"]).size().to_dict()
    report = pd.read_parquet(whole / "report.parquet")
    by_source = report[report["group_by"] == "source"].set_index(["group", "split"])
    tokens = headers["n_tokens"] - headers["n_docs"]  # the report counts no EOS
    assert by_source["n_tokens"].to_dict() == {(s, sp): int(n) for (s, sp), n in tokens.items()}
