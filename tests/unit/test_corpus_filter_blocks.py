"""The per-document filter blocks give the same survivors, removal rows and funnel rows, value for value and dtype for
dtype, as the stage functions they replaced.

The expected frames in tests/fixtures/filter_blocks/ were written by the earlier ``filter_documents`` (one function
per stage) from a slice of the smoke sources' documents (tests/fixtures/smoke, read by the sources stage) and the
hand-made cases of ``edge_docs``: NUL bytes, a lone surrogate (through the build's sanitising shard writer), a page
of scripts only, mojibake, zero-width text, PII, short unhinted text, a missing content, Arabic. The slice holds up
to two documents per removal rule of each source and a few kept ones. The frames also hold what the installed
extraction, repair and language-ID libraries return: an upgrade that changes those needs them written again
(``python tests/unit/test_corpus_filter_blocks.py``, after checking that the differences are the library's).
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.config import load_config
from tasks.corpus.config import CorpusConfig
from tasks.corpus.filters import (DOC_STEPS, INPUT_COLUMNS, Ledger, Verdicts, blocks_for, filter_documents,
                                  run_blocks, sanitise)
from tasks.corpus.quality import Reason

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
EXPECTED = FIX / "filter_blocks"
BAD = FIX / "bad_input"
RAIL = ("The old railway line that once carried coal from the valley has become a quiet path for walkers and "
        "cyclists. Along the way there are iron bridges, a tunnel lit by small lamps, and a station building that "
        "now serves tea. Local volunteers clear fallen branches after storms and repair the wooden benches with "
        "timber they have saved, and on weekends families come with bicycles and picnic baskets.")
PII = ("The support team keeps a short log of every incident that reaches the help desk, and last night the server "
       "at 192.168.0.1 stopped answering requests for about ten minutes. Customers who want to follow up can write "
       "to a.b@example.org or call +44 20 7946 0958, and they will receive an answer within two working days.")


def smoke_corpus() -> CorpusConfig:
    return load_config(ROOT / "configs" / "smoke.toml").corpus


def slice_docs() -> pd.DataFrame:
    """The smoke slice (``INPUT_COLUMNS``, string dtypes as read from Parquet)."""
    return pd.read_parquet(EXPECTED / "input.parquet")


def edge_docs(surrogate: bool = False) -> pd.DataFrame:
    """Hand-made cases in an object-dtype frame; ``surrogate`` adds a text with a lone surrogate, which only the
    build's own path can take (it sanitises before anything else: an Arrow string column cannot hold one)."""
    rows = [
        ("nul", RAIL.replace(" the ", " the\x00 ", 3), "text", "en"),
        ("scripts", (BAD / "only_scripts.html").read_text(), "html", "en"),
        ("article", f"<html><body><nav>Home | About | Shop</nav><article><p>{PII}</p><p>{RAIL}</p></article>"
                    "<footer>Copyright 2024</footer></body></html>", "html", None),
        ("mojibake", (BAD / "mojibake" / "a_mojibake.txt").read_text(), "text", "en"),
        ("zero_width", "\u200b\u200c \n\t\ufeff", "text", "en"),
        ("short", "Hi there", "text", None),
        ("missing", None, "text", "en"),
        ("arabic", (BAD / "rtl_arabic.txt").read_text(), "text", None),
        ("chinese", (BAD / "chinese_no_spaces.txt").read_text(), "text", "zh"),
        ("pii", PII + " " + RAIL, "text", "en"),
    ] + ([("surrogate", RAIL + " \ud800", "text", None)] if surrogate else [])
    return pd.DataFrame([dict(doc_id=f"edge/{name}", source="edge", language_hint=hint, content=content,
                              content_type=kind) for name, content, kind, hint in rows], dtype=object)


def _as_built(docs: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """What the corpus build hands ``filter_documents``: sanitised, written as a Parquet shard, read back."""
    path = folder / "shard.parquet"
    sanitise(docs[INPUT_COLUMNS]).to_parquet(path, index=False)
    return pd.read_parquet(path)


def variants(folder: Path) -> dict[str, tuple[pd.DataFrame, CorpusConfig]]:
    """Name → (documents, corpus config) of every case compared."""
    smoke = smoke_corpus()
    both = pd.concat([slice_docs().astype(object), edge_docs()], ignore_index=True)
    return {
        "smoke": (slice_docs(), smoke),
        "built": (_as_built(pd.concat([both, edge_docs(surrogate=True).tail(1)], ignore_index=True), folder), smoke),
        "edges_c4": (edge_docs(), smoke.model_copy(update={"c4": smoke.c4.model_copy(update={"enabled": True}),
                                                            "pii": False, "unicode_repair": False})),
        "keep_unknown": (both, smoke.model_copy(update={"unknown_language": "keep", "langid_min_chars": 400})),
        "empty": (slice_docs().iloc[:0], smoke),
    }


def run(docs: pd.DataFrame, cfg: CorpusConfig) -> dict[str, pd.DataFrame]:
    ledger = Ledger()
    survivors = filter_documents(docs, cfg, ledger)
    removals, funnel = ledger.frames()
    return {"survivors": survivors, "removals": removals, "funnel": funnel}


@pytest.mark.parametrize("name", ["smoke", "built", "edges_c4", "keep_unknown", "empty"])
def test_blocks_reproduce_the_stage_functions_bit_for_bit(name, tmp_path):
    docs, cfg = variants(tmp_path)[name]
    for part, got in run(docs, cfg).items():
        if part == "funnel":  # the url step came later: with no URL rules it passes every document on
            url = got[got.stage == "url"]
            assert (url.docs_in == url.docs_out).all() and (url.chars_in == url.chars_out).all(), name
            got = got[got.stage != "url"].reset_index(drop=True)
        if part == "survivors":  # survivors carry their URL (null here) for the quality audit's hosts
            assert got.url.isna().all(), name
            got = got.drop(columns="url")
        # Through Parquet, as the build writes them: the files must hold the same bytes' worth of values and types.
        path = tmp_path / f"{part}.parquet"
        got.to_parquet(path)
        expected = pd.read_parquet(EXPECTED / f"{name}.{part}.parquet")
        back = pd.read_parquet(path)
        assert list(back.dtypes.astype(str)) == list(expected.dtypes.astype(str)), (name, part)
        assert back.equals(expected), (name, part)
        assert list(got.columns) == list(expected.columns)


def test_every_step_is_counted_in_order_and_every_removal_names_its_step(tmp_path):
    docs, cfg = variants(tmp_path)["keep_unknown"]
    out = run(docs, cfg)
    funnel, removals = out["funnel"], out["removals"]
    assert funnel.groupby("source", sort=False)["stage"].apply(list).map(lambda s: s == DOC_STEPS).all()
    assert set(removals["stage"]) <= set(DOC_STEPS)
    for source, rows in funnel.groupby("source"):
        # Each step starts from what the previous one kept; the last one keeps the survivors.
        assert (rows["docs_in"].to_numpy()[1:] == rows["docs_out"].to_numpy()[:-1]).all()
        removed = removals[removals["source"] == source]
        assert rows["docs_in"].iloc[0] - rows["docs_out"].iloc[-1] == len(removed)
        assert rows["docs_out"].iloc[-1] == int(np.sum(out["survivors"]["source"] == source))


class _Shout:
    """A block that both transforms (upper-cases ``text``) and removes (texts with "coal")."""

    name = "shout"

    def apply(self, frame):
        return Verdicts(reasons=[Reason("shout.coal", 1.0, 0.0, "mentions coal") if "coal" in t else None
                                 for t in frame.text],
                        columns={"text": [t.upper() for t in frame.text]})


def test_a_new_block_runs_in_the_same_loop_with_its_own_ledger_rows():
    docs = pd.DataFrame([dict(doc_id=f"d/{i}", source="d", language_hint="en", content=text, content_type="text",
                              fixes="", pii_replacements=0, lines_dropped=0)
                         for i, text in enumerate([RAIL, PII, "short"])])
    ledger = Ledger()
    out = run_blocks(docs, [*blocks_for(CorpusConfig(gopher={"min_words": 5}))[1:3], _Shout()], ledger)
    removals, funnel = ledger.frames()
    assert out.doc_id.tolist() == ["d/1", "d/2"] and out.text.tolist() == [PII.upper(), "SHORT"]
    assert removals[["doc_id", "stage", "rule"]].values.tolist() == [["d/0", "shout", "shout.coal"]]
    assert funnel[["stage", "docs_in", "docs_out"]].values.tolist() == [["sanitise", 3, 3], ["extract", 3, 3],
                                                                        ["shout", 3, 2]]  # url not run here
    assert funnel.chars_out.iloc[-1] == len(PII) + len("short")


def test_a_block_that_answers_for_the_wrong_number_of_rows_is_refused():
    class Short:
        name = "short"

        def apply(self, frame):
            return Verdicts(reasons=[None] * (len(frame) - 1))

    docs = pd.DataFrame([dict(doc_id="d/0", source="d", text="a"), dict(doc_id="d/1", source="d", text="b")])
    with pytest.raises(ValueError, match="block 'short' returned 1 reasons for 2 rows"):
        run_blocks(docs, [Short()], Ledger())


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for case, (case_docs, case_cfg) in variants(Path(tmp)).items():
            for part, frame in run(case_docs, case_cfg).items():
                frame.to_parquet(EXPECTED / f"{case}.{part}.parquet", compression="zstd")
