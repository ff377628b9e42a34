"""The tokenizer stage's face: key, run, expectations on the shards, publish."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.stage import Stage, StageContext, lazy


def run_tokenizer(ctx: StageContext, cfg: Any) -> dict[str, Any]:
    from tasks.tokenizer.stage import run

    return run(ctx, cfg.tokenizer, general=cfg.general_sources, domain=list(cfg.cpt.domain_sources))


def key_pretrained(cfg: Any) -> dict[str, Any]:
    """The content of a pretrained tokenizer's files (SHA-256 by file name) in the key: another tokenizer at the
    same path recomputes the stage, and a moved copy of the same one is reused. Nothing when BPE is fitted."""
    if not cfg.tokenizer.pretrained:
        return {}
    from tasks.train.pretrained_tokenizer import files_digest

    return {"tokenizer_pretrained": files_digest(cfg.tokenizer.pretrained)}


def key_tokenizer(cfg: Any) -> dict[str, Any]:
    """:func:`key_pretrained`, and when BPE is fitted on the default sample (``fit_weights`` empty) the sources it
    draws from: the general ones, and the ``[cpt]`` domain sources when ``fit_domain_share`` > 0
    (``tasks.tokenizer.composition``). The main and CPT budgets and the mixture candidates stay out, so changing
    them never refits the tokenizer."""
    tok = cfg.tokenizer
    if tok.pretrained or tok.fit_weights:
        return key_pretrained(cfg)
    return {"fit_sources": {"general": sorted(cfg.general_sources),
                            **({"domain": sorted(cfg.cpt.domain_sources)} if tok.fit_domain_share else {})}}


def check_shards(out: Path, cfg: Any) -> None:
    """Great Expectations on the token shards themselves (ids below the vocabulary, counts as the headers say) and
    on the per-source table (``sources.parquet``: its token and document counts are the headers')."""
    import pandas as pd

    from infra.expectations import check_shards as expect
    from infra.expectations import check_source_tokens
    from tasks.train.shards import shard_facts

    meta = json.loads((out / "tokenizer.meta.json").read_text())
    headers = pd.read_parquet(out / "shards.parquet")
    facts = pd.DataFrame([shard_facts(out / "shards" / r.source / r.split) for r in headers.itertuples()])
    expect(pd.concat([headers[["source", "split"]], facts], axis=1), meta["padded_vocab_size"])
    check_source_tokens(pd.read_parquet(out / "sources.parquet"), headers)


STAGE = Stage(name="tokenizer", inputs=("corpus",), code="tasks.tokenizer", run=run_tokenizer,
              sections=("tokenizer",), key_extra=key_tokenizer, validate=check_shards,
              publish=lazy("tasks.tokenizer.publish:publish"),
              summary=lazy("tasks.tokenizer.views:summary"), report=lazy("tasks.tokenizer.views:report"))
