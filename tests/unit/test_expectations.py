"""Stage-boundary suites name what failed."""

import pandas as pd
import pytest

from infra.errors import DataError
from infra.expectations import check_heldout, check_kept_corpus, check_ledger


def _kept(**overrides) -> pd.DataFrame:
    frame = pd.DataFrame({"doc_id": ["a/1", "b/1"], "source": ["a", "b"], "language": ["en", "zh"],
                          "n_chars": [9, 4]})
    return frame.assign(**overrides)


def test_kept_corpus_passes_and_names_an_empty_source():
    assert check_kept_corpus(_kept(), ["a", "b"], ["en", "zh"]).success
    with pytest.raises(DataError, match=r"no kept document: \['c'\]"):
        check_kept_corpus(_kept(), ["a", "b", "c"], ["en", "zh"])


def test_kept_corpus_names_the_failing_expectation():
    with pytest.raises(DataError, match="expect_column_values_to_be_in_set"):
        check_kept_corpus(_kept(language=["en", "fr"]), ["a", "b"], ["en", "zh"])
    with pytest.raises(DataError, match="expect_column_values_to_be_between"):
        check_kept_corpus(_kept(n_chars=[0, 1]), ["a", "b"], ["en", "zh"])


def test_ledger_suite_fails_on_unreconciled_counts_and_empty_batches():
    per_source = pd.DataFrame({"source": ["a", "b"], "docs_in": [5, 3], "docs_out": [3, 3], "removed": [2, 0]})
    removals = pd.DataFrame({"doc_id": ["a/1", "a/2"], "stage": ["quality", "langid"], "rule": ["x", "y"]})
    assert check_ledger(per_source, removals).success
    with pytest.raises(DataError, match="expect_column_pair_values_to_be_equal"):
        check_ledger(per_source.assign(docs_in=[6, 3]), removals)
    with pytest.raises(DataError, match="expect_table_row_count_to_be_between"):
        check_ledger(per_source.iloc[:0], removals)
    with pytest.raises(DataError, match="expect_column_values_to_be_unique"):
        check_ledger(per_source, pd.concat([removals, removals]))


def test_heldout_rejects_non_finite_loss():
    table = pd.DataFrame({"source": ["a"], "loss_nats": [float("nan")], "bits_per_byte": [1.0], "tokens": [10]})
    with pytest.raises(DataError, match="loss_nats"):
        check_heldout(table)


def test_empty_source_message_quotes_its_removal_rules():
    with pytest.raises(DataError, match=r"c: removed by dedup.boilerplate ×30.*d: no documents read"):
        check_kept_corpus(_kept(), ["a", "b", "c", "d"], ["en", "zh"], {"c": "removed by dedup.boilerplate ×30"})


def test_kept_and_ledger_files_are_validated_in_batches_with_ids_checked_across_them(tmp_path, monkeypatch):
    import infra.expectations as expectations

    monkeypatch.setattr(expectations, "BATCH_ROWS", 2)
    kept = pd.DataFrame({"doc_id": ["x1", "x2", "x3", "x4", "x5"], "source": ["a", "b", "a", "b", "a"],
                         "language": ["en"] * 5, "n_chars": [3, 4, 5, 6, 7]})
    kept.to_parquet(tmp_path / "kept.parquet", row_group_size=2)
    result = check_kept_corpus(tmp_path / "kept.parquet", ["a", "b"], ["en"])
    assert result.success and sum(r["expectation"] == "expect_column_values_to_be_in_set" for r in result.results) == 3
    # A repeat in another batch is invisible to each batch alone; the file-wide check catches it.
    kept.assign(doc_id=["x1", "x2", "x3", "x4", "x1"]).to_parquet(tmp_path / "dup.parquet", row_group_size=2)
    with pytest.raises(DataError, match="unique.*1 repeated values e.g. \\['x1'\\]"):
        check_kept_corpus(tmp_path / "dup.parquet", ["a", "b"], ["en"])
    kept.assign(language=["en", "en", "en", "en", "fr"]).to_parquet(tmp_path / "fr.parquet", row_group_size=2)
    with pytest.raises(DataError, match="in_set"):
        check_kept_corpus(tmp_path / "fr.parquet", ["a", "b"], ["en"])
    removals = pd.DataFrame({"doc_id": ["r1", "r2", "r3", "r1"], "stage": ["s"] * 4, "rule": ["q"] * 4})
    removals.to_parquet(tmp_path / "removals.parquet", row_group_size=2)
    per_source = pd.DataFrame({"source": ["a"], "docs_in": [9], "docs_out": [5], "removed": [4]})
    with pytest.raises(DataError, match="removals.*repeated"):
        check_ledger(per_source, tmp_path / "removals.parquet")
    removals.iloc[:3].to_parquet(tmp_path / "ok.parquet", row_group_size=2)
    assert check_ledger(per_source.assign(docs_in=8, removed=3), tmp_path / "ok.parquet").success
