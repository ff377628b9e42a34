"""Which sources the tokenizer's fit sample draws from and by how much, and the tokens per source after packing.

The fit sample's default weights (docs/methods.md §8: "a sample of the final mixture (training split only)"), used
when ``[tokenizer] fit_weights`` is empty:

    w_g = (1 − δ) · c_g / Σ_{h ∈ G} c_h     for each general source g ∈ G (c: training characters)
    w_d = δ / |D|                           for each domain source d ∈ D = ``[cpt] domain_sources``

with δ = ``[tokenizer] fit_domain_share`` (default 0: domain text is not sampled). The general part is the natural
mixture of the general sources, the mixture ablation's reference candidate (α = 1): the mixture the main run trains
on is chosen after the tokenizer exists, from proxies that all use this tokenizer, so the one mixture known before
that choice is the reference. Characters stand in for tokens, which do not exist before the tokenizer. The
domain sources split δ equally, as the CPT stream splits its domain share (docs/methods.md §11 replay weights).

Per-source table (``sources.parquet``, DuckDB ``tokenizer_sources``): columns ``SOURCE_COLUMNS``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from infra.errors import ConfigError

RULE_DECLARED = "declared"              # [tokenizer] fit_weights as given
RULE_GENERAL = "general_natural"        # the general sources at their natural shares
RULE_GENERAL_DOMAIN = "general_natural+domain_share"  # ... and [cpt] domain sources sharing fit_domain_share

SOURCE_COLUMNS = ["source", "role", "train_docs", "train_tokens", "heldout_docs", "heldout_tokens", "tokens",
                  "train_bytes", "heldout_bytes", "train_chars", "fit_weight", "fit_chars", "fit_share",
                  "natural_token_share", "tokenizer_hash", "manifest_hash"]


def default_fit_weights(train_chars: Mapping[str, int], general: Sequence[str] | None, domain: Sequence[str] = (),
                        domain_share: float = 0.0) -> dict[str, float]:
    """The fit sample's weights by the rule of the module docstring, summing to 1, sorted by source.

    Args:
        train_chars: training characters per source (sources without training text may be absent or 0).
        general: the general sources (``sources.<name>.role = "general"``); None: every source of ``train_chars``.
        domain: ``[cpt] domain_sources``, sampled only when ``domain_share`` > 0.
        domain_share: δ in [0, 1), the fit sample's share of domain text.

    Raises:
        ConfigError: no general source has training text; ``domain_share`` > 0 with no domain sources, or with a
            domain source that has no training text; ``domain_share`` outside [0, 1).
    """
    if not 0.0 <= domain_share < 1.0:
        raise ConfigError(f"tokenizer.fit_domain_share = {domain_share}: must lie in [0, 1)")
    pool = sorted(train_chars) if general is None else sorted(general)
    chars = {s: int(train_chars.get(s, 0)) for s in pool if train_chars.get(s, 0) > 0}
    if not chars:
        raise ConfigError(f"none of the general sources {pool} has training text to fit the tokenizer on: give "
                          "[tokenizer] fit_weights, or check the corpus funnel")
    total = sum(chars.values())
    weights = {s: (1.0 - domain_share) * n / total for s, n in chars.items()}
    if domain_share > 0:
        if not domain:
            raise ConfigError(f"tokenizer.fit_domain_share = {domain_share} needs [cpt] domain_sources to sample; "
                              "name them there, or set fit_domain_share = 0")
        empty = sorted(d for d in domain if not train_chars.get(d))
        if empty:
            raise ConfigError(f"tokenizer.fit_domain_share: the [cpt] domain sources {empty} have no training "
                              "documents; sources with training text: " + str(sorted(train_chars)))
        weights |= {d: weights.get(d, 0.0) + domain_share / len(set(domain)) for d in sorted(set(domain))}
    return dict(sorted(weights.items()))


def source_counts(headers: pd.DataFrame, meta: Mapping[str, Any], roles: Mapping[str, str] | None = None,
                  train_chars: Mapping[str, int] | None = None) -> pd.DataFrame:
    """One row per source of a tokenizer artifact (``SOURCE_COLUMNS``).

    Tokens are those of the shards (one EOS after every document included), per split and summed
    (``tokens = train_tokens + heldout_tokens``). ``fit_weight`` is the fit sample's target weight (0: not
    sampled), ``fit_chars`` the characters it drew and ``fit_share`` their share of the sample; all three are NA
    for an adopted pretrained tokenizer. ``natural_token_share`` is the source's share of the general sources'
    training tokens, the weight of the mixture ablation's natural candidate (NA for a source that is not general).

    Args:
        headers: ``shards.parquet`` (source, split, n_tokens, n_docs, n_bytes).
        meta: ``tokenizer.meta.json`` (tokenizer_hash, manifest_hash, fit_weights, fit_sample_chars, fit_roles,
            fit_train_chars when the artifact has them).
        roles: source → "general" / "domain"; default ``meta["fit_roles"]``, else "" (unknown).
        train_chars: training characters per source; default ``meta["fit_train_chars"]``, else NA.
    """
    roles = dict(roles if roles is not None else meta.get("fit_roles", {}))
    train_chars = dict(train_chars if train_chars is not None else meta.get("fit_train_chars", {}))
    fitted = "fit_weights" in meta
    weights, drawn = meta.get("fit_weights", {}), meta.get("fit_sample_chars", {})
    drawn_total = sum(drawn.values())
    wide = headers.pivot_table(index="source", columns="split", values=["n_tokens", "n_docs", "n_bytes"],
                               aggfunc="sum", fill_value=0)
    rows = []
    for source in sorted(wide.index):
        def get(value: str, split: str) -> int:
            return int(wide.loc[source, (value, split)]) if (value, split) in wide.columns else 0

        rows.append({
            "source": source, "role": roles.get(source, ""),
            "train_docs": get("n_docs", "train"), "train_tokens": get("n_tokens", "train"),
            "heldout_docs": get("n_docs", "heldout"), "heldout_tokens": get("n_tokens", "heldout"),
            "tokens": get("n_tokens", "train") + get("n_tokens", "heldout"),
            "train_bytes": get("n_bytes", "train"), "heldout_bytes": get("n_bytes", "heldout"),
            "train_chars": train_chars.get(source, pd.NA),
            "fit_weight": float(weights.get(source, 0.0)) if fitted else pd.NA,
            "fit_chars": int(drawn.get(source, 0)) if fitted else pd.NA,
            "fit_share": drawn.get(source, 0) / drawn_total if fitted and drawn_total else pd.NA,
            "tokenizer_hash": meta.get("tokenizer_hash", ""), "manifest_hash": meta.get("manifest_hash", ""),
        })
    frame = pd.DataFrame(rows, columns=[c for c in SOURCE_COLUMNS if c != "natural_token_share"])
    general = frame["role"] == "general" if (frame["role"] != "").any() else pd.Series(True, index=frame.index)
    general_tokens = frame.loc[general, "train_tokens"].sum()
    frame["natural_token_share"] = (frame["train_tokens"] / general_tokens).where(general) if general_tokens else pd.NA
    return frame.astype({"train_chars": "Int64", "fit_weight": "Float64", "fit_chars": "Int64",
                         "fit_share": "Float64", "natural_token_share": "Float64"})[SOURCE_COLUMNS]


def source_table(path: Path, headers: pd.DataFrame | None = None) -> pd.DataFrame:
    """The artifact's per-source table: ``sources.parquet``, or for an artifact written before it, the same columns
    from the shard headers and ``tokenizer.meta.json`` (roles and training characters then unknown)."""
    if (path / "sources.parquet").exists():
        return pd.read_parquet(path / "sources.parquet")
    headers = pd.read_parquet(path / "shards.parquet") if headers is None else headers
    return source_counts(headers, json.loads((path / "tokenizer.meta.json").read_text()))
