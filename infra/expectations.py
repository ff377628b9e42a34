"""Great Expectations suites that guard the data at stage boundaries.

A failed suite raises ``DataError`` naming every failing expectation and what it observed, so the flow
stops before the next stage consumes bad data (docs/methods.md §13: "Artifacts, caching, lineage").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd

from infra.errors import DataError

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    success: bool
    results: list[dict[str, Any]]


def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def validate_frame(name: str, frame: pd.DataFrame, expectations: Sequence[Any]) -> SuiteResult:
    """Validate ``frame`` against ``expectations`` in an ephemeral GX context.

    Raises:
        DataError: when any expectation fails; the message names each failing expectation.
    """
    import great_expectations as gx

    context = _context()
    asset = context.data_sources.add_pandas(name).add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name=name)
    for expectation in expectations:
        suite.add_expectation(expectation)
    outcome = batch.validate(suite)
    results = [_summarise(r) for r in outcome.results]
    failed = [r for r in results if not r["success"]]
    if failed:
        detail = "; ".join(f"{r['expectation']}({r['kwargs']}) observed {r['observed']}" for r in failed)
        raise DataError(f"expectation suite '{name}' failed: {detail}")
    return SuiteResult(name, True, results)


def _summarise(result: Any) -> dict[str, Any]:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    observed = result.result.get("observed_value", result.result.get("unexpected_count"))
    if result.result.get("partial_unexpected_list"):
        observed = f"{observed} e.g. {result.result['partial_unexpected_list'][:3]}"
    return {"expectation": config.type, "kwargs": kwargs, "success": bool(result.success), "observed": observed}


BATCH_ROWS = 262_144  # rows per Great Expectations batch when a table is validated from its Parquet file

# A table to validate: a frame, a Parquet file, or the ordered Parquet parts of one dataset (read as one table).
Table = pd.DataFrame | Path | Sequence[Path]


def _files(table: Path | Sequence[Path]) -> list[str]:
    return [str(table)] if isinstance(table, (str, Path)) else [str(f) for f in table]


def _batches(table: Table, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The table itself, or its Parquet file(s) read ``BATCH_ROWS`` rows at a time (bounded memory)."""
    if isinstance(table, pd.DataFrame):
        yield table[columns]
        return
    import pyarrow.parquet as pq

    for path in _files(table):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield batch.to_pandas()


def _repeated(table: Table, column: str) -> tuple[int, list]:
    """How many values of ``column`` occur more than once, and a few of them, counted by DuckDB out of core."""
    import duckdb

    with duckdb.connect() as con:
        if isinstance(table, pd.DataFrame):
            con.register("t", table[[column]])
        else:
            con.register("t", con.read_parquet(_files(table), union_by_name=True))
        rows = con.execute(f'SELECT "{column}" FROM t GROUP BY ALL HAVING count(*) > 1 ORDER BY 1').fetchall()
    return len(rows), [r[0] for r in rows[:3]]


def _distinct(table: Table, column: str) -> set:
    import duckdb

    with duckdb.connect() as con:
        if isinstance(table, pd.DataFrame):
            con.register("t", table[[column]])
        else:
            con.register("t", con.read_parquet(_files(table), union_by_name=True))
        return {r[0] for r in con.execute(f'SELECT DISTINCT "{column}" FROM t').fetchall()}


def _validate_batches(name: str, table: Table, columns: list[str], expectations: Sequence[Any],
                      unique: str | None = None) -> SuiteResult:
    """``validate_frame`` on each batch of ``table`` (a frame, or a Parquet file read in batches); ``unique`` names
    a column whose values must be unique across the whole table, checked by DuckDB beside the batches.

    Raises:
        DataError: any expectation fails in any batch, the table is empty, or ``unique`` has repeated values.
    """
    results: list[dict[str, Any]] = []
    n_rows = 0
    for batch in _batches(table, columns):
        n_rows += len(batch)
        if len(batch):
            results += validate_frame(name, batch, expectations).results
    if not n_rows:
        raise DataError(f"expectation suite '{name}' failed: the table has no rows")
    if unique is not None:
        count, examples = _repeated(table, unique)
        if count:
            raise DataError(f"expectation suite '{name}' failed: expect_column_values_to_be_unique(column={unique!r}) "
                            f"observed {count} repeated values e.g. {examples}")
        results.append({"expectation": "expect_column_values_to_be_unique", "kwargs": {"column": unique},
                        "success": True, "observed": 0})
    return SuiteResult(name, True, results)


def check_kept_corpus(kept: Table, sources: Sequence[str], languages: Sequence[str],
                      why_removed: dict[str, str] | None = None) -> SuiteResult:
    """Kept-corpus suite: every source non-empty, no empty text, only configured languages, unique ids.

    ``kept``: a frame, or the kept Parquet file or parts (validated in batches of ``BATCH_ROWS``, with the source and id
    checks over the whole file by DuckDB); it needs columns doc_id, source, language and n_chars (the text itself
    is not loaded). ``why_removed`` maps a source to its removal counts by rule, quoted when that source kept
    nothing.

    Raises:
        DataError: a source kept nothing, or an expectation fails.
    """
    import great_expectations as gx

    E = gx.expectations
    empty = sorted(set(sources) - _distinct(kept, "source"))
    if empty:
        why = "; ".join(f"{s}: {(why_removed or {}).get(s) or 'no documents read'}" for s in empty)
        raise DataError(f"expectation suite 'kept_corpus' failed: sources with no kept document: {empty} ({why}). "
                        "Fix the inputs (empty or unreadable files), relax the rule that removed them with "
                        "[corpus.source_overrides.<source>], or drop the source.")
    return _validate_batches("kept_corpus", kept, ["doc_id", "source", "language", "n_chars"], [
        E.ExpectColumnValuesToNotBeNull(column="n_chars"),
        E.ExpectColumnValuesToBeBetween(column="n_chars", min_value=1),
        E.ExpectColumnValuesToBeInSet(column="language", value_set=list(languages)),
        E.ExpectColumnValuesToBeUnique(column="doc_id"),
    ], unique="doc_id")


def check_ledger(per_source: pd.DataFrame, removals: Table) -> SuiteResult:
    """Removal-ledger suite: per source, documents in = kept + removed; one removal row per removed document,
    each naming its stage and rule.

    ``per_source``: columns source, docs_in, docs_out, removed (one row per source). ``removals``: a frame or the
    ledger's Parquet file or parts (validated in batches, ids checked for repeats over the whole file by DuckDB).

    Raises:
        DataError: an expectation fails.
    """
    import great_expectations as gx

    E = gx.expectations
    frame = per_source.assign(kept_plus_removed=per_source["docs_out"] + per_source["removed"])
    validate_frame("ledger_counts", frame[["source", "docs_in", "kept_plus_removed"]], [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnPairValuesToBeEqual(column_A="docs_in", column_B="kept_plus_removed"),
    ])
    if isinstance(removals, pd.DataFrame) and not len(removals):
        return validate_frame("removals", removals[["doc_id", "stage", "rule"]], [
            E.ExpectColumnValuesToBeUnique(column="doc_id")])
    if not isinstance(removals, pd.DataFrame):
        import pyarrow.parquet as pq

        if not sum(pq.ParquetFile(f).metadata.num_rows for f in _files(removals)):
            return SuiteResult("removals", True, [])
    return _validate_batches("removals", removals, ["doc_id", "stage", "rule"], [
        E.ExpectColumnValuesToBeUnique(column="doc_id"),
        E.ExpectColumnValuesToNotBeNull(column="stage"),
        E.ExpectColumnValuesToNotBeNull(column="rule"),
    ], unique="doc_id")


def check_shards(headers: pd.DataFrame, vocab_size: int) -> SuiteResult:
    """Token-shard suite: every (source, split) shard has tokens and bytes, one vocab size throughout, every token
    id below the vocab size, and the files hold exactly what the headers say.

    ``headers``: one row per shard with source, split, n_tokens, n_docs, n_bytes, vocab_size (from the headers) and
    tokens_in_file, offsets_in_file, max_token_id, eos_count (measured on the files; see
    :func:`tasks.train.shards.shard_facts`).
    """
    import great_expectations as gx

    E = gx.expectations
    return validate_frame(
        "token_shards",
        headers[["source", "split", "n_tokens", "n_docs", "n_bytes", "vocab_size", "tokens_in_file",
                 "offsets_in_file", "max_token_id", "eos_count"]],
        [
            E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1),
            E.ExpectColumnValuesToBeBetween(column="n_bytes", min_value=1),
            E.ExpectColumnValuesToBeInSet(column="vocab_size", value_set=[vocab_size]),
            E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "heldout"]),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="vocab_size", column_B="max_token_id"),
            E.ExpectColumnPairValuesToBeEqual(column_A="n_tokens", column_B="tokens_in_file"),
            E.ExpectColumnPairValuesToBeEqual(column_A="n_docs", column_B="offsets_in_file"),
            E.ExpectColumnPairValuesToBeEqual(column_A="n_docs", column_B="eos_count"),
        ],
    )
def check_heldout(table: pd.DataFrame) -> SuiteResult:
    """Evaluation-table suite: finite, positive losses and bits per byte, tokens counted; where the rows carry
    ``manifest_hash`` (as published, ``MANIFEST_HASH_PATTERN``), a SHA-256 hex digest on every row."""
    import great_expectations as gx

    E = gx.expectations
    lineage = ["manifest_hash"] if "manifest_hash" in table.columns else []
    return validate_frame(
        "heldout_loss",
        table[["source", "loss_nats", "bits_per_byte", "tokens", *lineage]],
        [
            E.ExpectTableRowCountToBeBetween(min_value=1),
            E.ExpectColumnValuesToNotBeNull(column="loss_nats"),  # NaN counts as null; range checks skip nulls
            E.ExpectColumnValuesToNotBeNull(column="bits_per_byte"),
            E.ExpectColumnValuesToBeBetween(column="loss_nats", min_value=0.0, max_value=50.0),
            E.ExpectColumnValuesToBeBetween(column="bits_per_byte", min_value=0.0, max_value=100.0),
            E.ExpectColumnValuesToBeBetween(column="tokens", min_value=1),
            *[E.ExpectColumnValuesToMatchRegex(column=c, regex=MANIFEST_HASH_PATTERN) for c in lineage],
        ],
    )


MANIFEST_HASH_PATTERN = r"^[0-9a-f]{64}$"  # the corpus manifest's SHA-256 (tasks.corpus.stage.build_manifest)


def check_quality_ablation(table: pd.DataFrame) -> SuiteResult:
    """Quality-ablation suite: a row per evaluated source with finite, positive bits per byte for both arms, an
    interval that holds its estimate (or none, for a single held-out document, with no decided verdict), and a known
    verdict (``tasks.ablation.stage``)."""
    import great_expectations as gx

    E = gx.expectations
    no_interval = table["delta_low"].isna() & table["delta_high"].isna() & table["verdict"].isin(
        ["undetermined", "unchanged"])  # a single held-out document gives no interval
    frame = table.assign(low_ok=no_interval | (table["delta_low"] <= table["delta_bpb"] + 1e-12),
                         high_ok=no_interval | (table["delta_high"] >= table["delta_bpb"] - 1e-12))
    return validate_frame(
        "quality_ablation",
        frame[["source", "bpb_with", "bpb_without", "delta_bpb", "low_ok", "high_ok", "verdict", "heldout_docs"]],
        [
            E.ExpectTableRowCountToBeBetween(min_value=1),
            E.ExpectColumnValuesToBeUnique(column="source"),
            E.ExpectColumnValuesToNotBeNull(column="delta_bpb"),
            E.ExpectColumnValuesToBeBetween(column="bpb_with", min_value=0.0, max_value=100.0),
            E.ExpectColumnValuesToBeBetween(column="bpb_without", min_value=0.0, max_value=100.0),
            E.ExpectColumnValuesToBeInSet(column="low_ok", value_set=[True]),
            E.ExpectColumnValuesToBeInSet(column="high_ok", value_set=[True]),
            E.ExpectColumnValuesToBeInSet(column="verdict",
                                          value_set=["helped", "hurt", "undetermined", "unchanged"]),
            E.ExpectColumnValuesToBeBetween(column="heldout_docs", min_value=1),
        ],
    )


def check_cloze(table: pd.DataFrame) -> SuiteResult:
    """Cloze-results suite (``evals.cloze.score_cloze`` rows, a CPT artifact's ``cloze.parquet``): at least one
    item, one row per (checkpoint, item), a non-positive finite log-probability of the answer, and under every
    scoring the frame carries (``sum``: ``predicted``/``correct``; ``per_token``, ``per_byte``: their
    ``predicted_<scoring>``/``correct_<scoring>``) a chosen option index ≥ 0 and correctness equal to
    chosen = answer."""
    import great_expectations as gx

    E = gx.expectations
    missing = sorted({"item_id", "answer", "predicted", "correct", "logprob_answer"} - set(table.columns))
    if missing:
        raise DataError(f"expectation suite 'cloze_results' failed: columns {missing} are missing (got "
                        f"{list(table.columns)}); score the items with evals.cloze.score_cloze")
    suffixes = [""] + [f"_{s}" for s in ("per_token", "per_byte") if f"correct_{s}" in table.columns]
    frame = table.assign(**{f"consistent{x}": (table[f"predicted{x}"] == table["answer"]) == table[f"correct{x}"]
                            for x in suffixes})
    keys = ["checkpoint", "item_id"] if "checkpoint" in table.columns else ["item_id"]
    columns = [*keys, "logprob_answer"] + [c for x in suffixes for c in (f"predicted{x}", f"consistent{x}")]
    expectations = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectCompoundColumnsToBeUnique(column_list=keys) if len(keys) > 1 else
        E.ExpectColumnValuesToBeUnique(column="item_id"),
        E.ExpectColumnValuesToNotBeNull(column="logprob_answer"),
        E.ExpectColumnValuesToBeBetween(column="logprob_answer", min_value=-1e6, max_value=0.0),
    ]
    for x in suffixes:
        expectations += [E.ExpectColumnValuesToNotBeNull(column=f"predicted{x}"),
                         E.ExpectColumnValuesToBeBetween(column=f"predicted{x}", min_value=0),
                         E.ExpectColumnValuesToBeInSet(column=f"consistent{x}", value_set=[True])]
    return validate_frame("cloze_results", frame[columns], expectations)


def check_manifest_hash(table: pd.DataFrame, name: str, expected: str | None = None) -> SuiteResult:
    """Lineage suite of a published table (``heldout_loss``, ``cloze_results``, ``gate_decisions``,
    ``decay_branches``, ``tokenizer_sources``): a ``manifest_hash`` column whose every value is a SHA-256 hex
    digest, one value throughout (one corpus per artifact), equal to ``expected`` when given.

    Raises:
        DataError: the column is missing, or an expectation fails.
    """
    import great_expectations as gx

    E = gx.expectations
    if "manifest_hash" not in table.columns:
        raise DataError(f"expectation suite '{name}_lineage' failed: no manifest_hash column (got "
                        f"{list(table.columns)})")
    return validate_frame(f"{name}_lineage", table[["manifest_hash"]], [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnValuesToNotBeNull(column="manifest_hash"),
        E.ExpectColumnValuesToMatchRegex(column="manifest_hash", regex=MANIFEST_HASH_PATTERN),
        E.ExpectColumnUniqueValueCountToBeBetween(column="manifest_hash", min_value=1, max_value=1),
        *([E.ExpectColumnValuesToBeInSet(column="manifest_hash", value_set=[expected])] if expected else []),
    ])


def check_source_tokens(sources: pd.DataFrame, headers: pd.DataFrame) -> SuiteResult:
    """Per-source token suite of a tokenizer artifact (``sources.parquet``, DuckDB ``tokenizer_sources``): one row
    per source of the shards, ``tokens = train_tokens + heldout_tokens``, each split's tokens and documents equal to
    its shard header's (``headers``: ``shards.parquet``), every source with tokens, and fit-sample shares in
    [0, 1] (NA for a pretrained tokenizer).

    Raises:
        DataError: an expectation fails.
    """
    import great_expectations as gx

    E = gx.expectations
    wide = headers.pivot_table(index="source", columns="split", values=["n_tokens", "n_docs"], aggfunc="sum",
                               fill_value=0)
    wide.columns = [f"header_{split}_{value.removeprefix('n_')}" for value, split in wide.columns]
    frame = sources.merge(wide.reset_index(), on="source", how="outer", indicator=True)
    counted = ["tokens", "train_tokens", "heldout_tokens", "train_docs", "heldout_docs"]
    header = [f"header_{c}" for c in counted[1:]]
    frame = frame.assign(**{c: frame[c].astype("float64") if c in frame else 0.0 for c in counted + header})
    frame = frame.assign(in_both=frame["_merge"] == "both",
                         train_plus_heldout=frame["train_tokens"] + frame["heldout_tokens"],
                         fit_share=frame["fit_share"].astype("float64"))
    return validate_frame("tokenizer_sources", frame[["source", "in_both", "train_plus_heldout", "fit_share",
                                                      *counted, *header]], [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnValuesToBeUnique(column="source"),
        E.ExpectColumnValuesToBeInSet(column="in_both", value_set=[True]),
        E.ExpectColumnValuesToBeBetween(column="tokens", min_value=1),
        E.ExpectColumnPairValuesToBeEqual(column_A="tokens", column_B="train_plus_heldout"),
        *[E.ExpectColumnPairValuesToBeEqual(column_A=c, column_B=f"header_{c}") for c in counted[1:]],
        E.ExpectColumnValuesToBeBetween(column="fit_share", min_value=0.0, max_value=1.0),
    ])
