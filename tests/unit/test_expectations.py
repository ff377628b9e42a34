"""Stage-boundary suites name what failed."""

import pandas as pd
import pytest

from infra.errors import DataError
from infra.expectations import check_heldout, check_kept_corpus


def _kept(**overrides) -> pd.DataFrame:
    frame = pd.DataFrame({"doc_id": ["a/1", "b/1"], "source": ["a", "b"], "language": ["en", "zh"],
                          "text": ["some text", "一些文字"]})
    return frame.assign(**overrides)


def test_kept_corpus_passes_and_names_an_empty_source():
    assert check_kept_corpus(_kept(), ["a", "b"], ["en", "zh"]).success
    with pytest.raises(DataError, match=r"no kept document: \['c'\]"):
        check_kept_corpus(_kept(), ["a", "b", "c"], ["en", "zh"])


def test_kept_corpus_names_the_failing_expectation():
    with pytest.raises(DataError, match="expect_column_values_to_be_in_set"):
        check_kept_corpus(_kept(language=["en", "fr"]), ["a", "b"], ["en", "zh"])
    with pytest.raises(DataError, match="expect_column_value_lengths_to_be_between"):
        check_kept_corpus(_kept(text=["", "x"]), ["a", "b"], ["en", "zh"])


def test_heldout_rejects_non_finite_loss():
    table = pd.DataFrame({"source": ["a"], "loss_nats": [float("nan")], "bits_per_byte": [1.0], "tokens": [10]})
    with pytest.raises(DataError, match="loss_nats"):
        check_heldout(table)
