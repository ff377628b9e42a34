"""The corpus stage's face: key (settings plus a digest of the evaluation texts), run, expectations, publish."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def eval_items(cfg: Any) -> list:
    """Every evaluation text the platform reports on, for decontamination: the gate's cloze items (context plus
    correct option) and the files in ``corpus.decontamination.eval_files``."""
    from evals.cloze import cloze_files, load_cloze_items
    from evals.contamination import EvalItem, load_eval_files

    cloze = [EvalItem(f"cloze:{path.name}", item.item_id, item.context + item.options[item.answer])
             for path in cloze_files(cfg.gate.cloze_paths) for item in load_cloze_items(path)]
    return cloze + load_eval_files(cfg.corpus.decontamination.eval_files)


def _checked_items(cfg: Any) -> list:
    return eval_items(cfg) if cfg.corpus.decontamination.enabled else []


def key_eval_items(cfg: Any) -> dict[str, str]:
    """A digest of every evaluation text the corpus is checked against, and one of the URL blocklist files."""
    items = _checked_items(cfg)
    digest = hashlib.sha256(json.dumps([[i.set_name, i.item_id, i.text] for i in items]).encode()).hexdigest()[:16]
    return {"eval_items": digest, "url_blocklist_files": cfg.corpus.urls.files_digest()}


def run_corpus(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.corpus.stage import run

    return run(ctx, cfg.corpus, eval_items=_checked_items(cfg))


def check_corpus(out: Path, cfg: Any) -> None:
    """Great Expectations on the kept table (sources, languages) and the ledger (in = kept + removed), read from
    their Parquet files in batches (DuckDB aggregates the rest), so a corpus of any size is checked in bounded
    memory."""
    import duckdb

    from infra.expectations import check_kept_corpus, check_ledger
    from tasks.corpus.stage import manifest_rows

    languages = cfg.corpus.languages + (["unknown"] if cfg.corpus.unknown_language == "keep" else [])
    with duckdb.connect() as con:
        counts = con.execute("SELECT source, rule, count(*) AS n FROM read_parquet(?) GROUP BY source, rule "
                             "ORDER BY source, n DESC, rule", [str(out / "removals.parquet")]).fetchall()
    why: dict[str, list[str]] = {}
    removed: dict[str, int] = {}
    for source, rule, n in counts:
        why.setdefault(str(source), []).append(f"{rule} ×{n}")
        removed[str(source)] = removed.get(str(source), 0) + int(n)
    check_kept_corpus(out / "kept.parquet", list(cfg.sources), languages,
                      {src: "removed by " + ", ".join(rules[:4]) for src, rules in why.items()})
    rows = manifest_rows(json.loads((out / "manifest.json").read_text()))
    check_ledger(rows.assign(removed=[removed.get(s, 0) for s in rows["source"]]), out / "removals.parquet")


STAGE = Stage(name="corpus", inputs=("sources",), code="tasks.corpus", run=run_corpus,
              sections=("corpus",), key_extra=key_eval_items, validate=check_corpus, publish=lazy("tasks.corpus.publish:publish"),
              figures=lazy("tasks.corpus.plots:corpus_figures"),
              summary=lazy("tasks.corpus.views:summary"), report=lazy("tasks.corpus.views:report"))
