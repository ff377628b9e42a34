"""The tokenizer stage shows progress in every phase that grows with the corpus: the held-out split and the held-out
decontamination each have a bar over documents that reaches its total, the fit and the packing theirs (the
efficiency reports are summed from the packing's encoding, so they need no bar of their own)."""

import json
import random
from pathlib import Path

import pandas as pd

from infra.runs import RunsLayout
from infra.stage import StageContext
from recording_progress import RecordingProgress
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.stage import run

PASSAGE = ("the backup script copies every database dump to the remote archive and then checks the checksum "
           "of each file before it deletes the local copy")


def _corpus(folder: Path) -> pd.DataFrame:
    rng = random.Random(0)
    words = {"en": "the cat sat on a mat and ran far away home".split(), "zh": list("我们的软件包虚拟机世界你好")}
    rows = []
    for source, language, n_docs in (("web_en", "en", 50), ("wiki_zh", "zh", 30)):
        for i in range(n_docs):
            text = " ".join(rng.choice(words[language]) for _ in range(40))
            if language == "en" and i % 5 == 0:  # a quoted passage: held-out and training copies share it
                text += " " + PASSAGE
            rows.append(dict(doc_id=f"{source}/{i}", source=source, family_id=f"{source}/{i}", text=text,
                             language=language, n_chars=len(text), n_bytes=len(text.encode())))
    folder.mkdir(parents=True)
    kept = pd.DataFrame(rows)
    (folder / "kept").mkdir(parents=True, exist_ok=True)
    kept.to_parquet(folder / "kept" / "part-00000.parquet", index=False)
    (folder / "manifest.json").write_text(json.dumps({"manifest_hash": "0" * 64}))
    return kept


def test_split_and_decontamination_have_bars_over_documents_that_reach_their_totals(tmp_path):
    kept = _corpus(tmp_path / "corpus")
    out = tmp_path / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    progress = RecordingProgress()
    ctx = StageContext(out=out, inputs={"corpus": tmp_path / "corpus"}, layout=RunsLayout(tmp_path), key="k",
                       experiment="t", progress=progress)
    summary = run(ctx, TokenizerConfig(vocab_size=300, sample_max_chars=6000, heldout_fraction=0.2,
                                       min_heldout_docs=2, decontam_ngram=13, decontam_common_docs=50))
    removed = summary["decontaminated_train_docs"]
    assert removed > 0  # the shared passage was found: the decontamination did real work under its bar

    split = progress.bar("tokenizer: held-out split")
    assert (split.total, split.finished) == (len(kept), True)
    decontam = progress.bar("tokenizer: held-out decontamination, 13-grams")
    assert (decontam.total, decontam.finished) == (len(kept), True)
    order = [b.description.split(" (")[0].split(",")[0] for b in progress.bars]
    assert order == ["tokenizer: held-out split", "tokenizer: held-out decontamination", "tokenizer: fitting BPE",
                     "tokenizer: packing shards"]
    assert all(b.finished for b in progress.bars)


def test_without_decontamination_there_is_no_decontamination_bar(tmp_path):
    _corpus(tmp_path / "corpus")
    out = tmp_path / "artifacts" / "tokenizer" / "k"
    out.mkdir(parents=True)
    progress = RecordingProgress()
    ctx = StageContext(out=out, inputs={"corpus": tmp_path / "corpus"}, layout=RunsLayout(tmp_path), key="k",
                       experiment="t", progress=progress)
    run(ctx, TokenizerConfig(vocab_size=300, sample_max_chars=6000, decontam_ngram=0))
    assert not [b for b in progress.bars if "decontamination" in b.description]
    assert progress.bar("tokenizer: held-out split").finished
