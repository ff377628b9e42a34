"""What the audit measures on the mixed set (docs/methods.md §7 (TinyStories filter audit)).

- Crosstab: label × first failing rule of the corpus build ("kept" when the document survives).
- Pairs: every pair inside a family (an original and its near copies), plus every LSH candidate pair across
  families, with exact Jaccard on shingle sets, the MinHash estimate (share of equal signature entries over all
  ``num_perm`` permutations) and whether LSH banding makes it a candidate (equal rows in at least one band).
- LSH detection rate per Jaccard bin beside the S-curve P(s) = 1 − (1 − s^r)^b (docs/methods.md §7).
- Near-dedup precision and recall per Jaccard threshold t, over (near copy, its original) pairs and cross-family
  candidate pairs (copy-copy pairs are left out: their count depends on how many copies share an original). A pair
  is *predicted* a duplicate when it is an LSH candidate and its exact Jaccard is ≥ t (what the corpus build's
  near dedup joins at threshold t). Two truths: ``theory``: a copy-original pair whose J = s/(2 − s),
  s = (1 − q)^n, is ≥ t (docs/methods.md §7); ``exact``: a copy-original pair whose exact Jaccard is ≥ t (so recall is the
  LSH detection rate above t, and precision only counts cross-family matches against it).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

from tasks.audit.inject import theoretical_jaccard
from tasks.corpus.config import MinHashConfig
from tasks.corpus.minhash import jaccard, lsh_candidate_probability, shingles, signatures

KEPT = "kept"
PAIR_COLUMNS = ["doc_a", "doc_b", "label_a", "label_b", "kind", "same_family", "edit_rate_a", "edit_rate_b",
                "theory_jaccard", "exact_jaccard", "minhash_jaccard", "lsh_candidate"]


def first_rules(doc_ids: pd.Series, removals: pd.DataFrame) -> pd.Series:
    """For each id, the rule of its removal row (the build logs one row, the first rule that fired) or "kept"."""
    rule_of = dict(zip(removals["doc_id"], removals["rule"]))
    return doc_ids.map(lambda d: rule_of.get(d, KEPT))


def crosstab(labels: pd.Series, rules: pd.Series, label_order: list[str], rule_order: list[str]) -> pd.DataFrame:
    """Documents per (label, rule): rows in ``label_order``, columns rules in ``rule_order`` (unlisted rules after
    them, alphabetically), then "kept", then "total". Counts are ints."""
    table = pd.crosstab(labels.rename("label"), rules.rename("rule"))
    seen = [r for r in rule_order if r in table.columns]
    rest = sorted(set(table.columns) - set(seen) - {KEPT})
    columns = seen + rest + ([KEPT] if KEPT in table.columns else [])
    table = table.reindex(index=[lb for lb in label_order if lb in table.index], columns=columns, fill_value=0)
    return table.assign(total=table.sum(axis=1)).astype(int)


def pair_table(docs: pd.DataFrame, by_chars: bool, cfg: MinHashConfig) -> pd.DataFrame:
    """Pairs of ``docs`` (columns doc_id, text, label, family, edit_rate; originals have edit_rate 0).

    Returns ``PAIR_COLUMNS``; kind is "copy-original", "copy-copy" or "cross-family" (candidates only).
    """
    texts = docs["text"].tolist()
    sigs, has = signatures(texts, [by_chars] * len(texts), cfg)  # (n, num_perm) uint32, (n,) bool
    sets = [shingles(t, cfg.shingle_size, by_chars) for t in texts]
    ids, labels, rates = docs["doc_id"].tolist(), docs["label"].tolist(), docs["edit_rate"].astype(float).tolist()
    family = docs["family"].to_numpy()
    inside = [p for members in docs.groupby("family").indices.values() for p in combinations(sorted(members), 2)]
    across = sorted((i, j) for i, j in candidate_pairs(sigs, has, cfg.bands, cfg.rows) if family[i] != family[j])
    rows = []
    for i, j in inside + across:
        same, both = bool(family[i] == family[j]), bool(has[i] and has[j])
        kind = ("copy-original" if "original" in (labels[i], labels[j]) else "copy-copy") if same else "cross-family"
        # Two copies of one original keep a shingle with probability (1 − q_a)^n (1 − q_b)^n.
        q_pair = 1.0 - (1.0 - rates[i]) * (1.0 - rates[j])
        rows.append((ids[i], ids[j], labels[i], labels[j], kind, same, rates[i], rates[j],
                     theoretical_jaccard(q_pair, cfg.shingle_size) if same else np.nan,
                     jaccard(sets[i], sets[j]),
                     float(np.mean(sigs[i] == sigs[j])) if both else np.nan,
                     both and is_candidate(sigs[i], sigs[j], cfg.bands, cfg.rows)))
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def is_candidate(sig_a: np.ndarray, sig_b: np.ndarray, bands: int, rows: int) -> bool:
    """True when the two signatures agree on all ``rows`` entries of at least one of ``bands`` bands."""
    k = bands * rows
    return bool((sig_a[:k].reshape(bands, rows) == sig_b[:k].reshape(bands, rows)).all(axis=1).any())


def candidate_pairs(sigs: np.ndarray, has: np.ndarray, bands: int, rows: int) -> set[tuple[int, int]]:
    """All index pairs (i < j) equal on every row of some band; rows without shingles get no buckets (docs/methods.md §7).

    Buckets are complete (the build may cap pairs per large bucket): this is the candidate set the S-curve
    describes."""
    pairs: set[tuple[int, int]] = set()
    idx = np.flatnonzero(has)
    for band in range(bands):
        block = np.ascontiguousarray(sigs[idx, band * rows:(band + 1) * rows])
        _, bucket = np.unique(block, axis=0, return_inverse=True)
        order = np.argsort(bucket.ravel(), kind="stable")
        groups = np.split(idx[order], np.flatnonzero(np.diff(bucket.ravel()[order])) + 1)
        pairs.update(p for g in groups if len(g) > 1 for p in combinations(sorted(g.tolist()), 2))
    return pairs


def wilson_interval(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) of the share ``hits / n`` at ``confidence``, from
    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")``; (NaN, NaN) when ``n`` is 0."""
    if not n:
        return math.nan, math.nan
    from scipy import stats

    ci = stats.binomtest(int(hits), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def minhash_error(pairs: pd.DataFrame) -> dict:
    """|MinHash estimate − exact Jaccard| over copy-original pairs: {num_pairs, mae, max_error}."""
    rows = pairs[(pairs["kind"] == "copy-original") & pairs["minhash_jaccard"].notna()]
    err = (rows["minhash_jaccard"] - rows["exact_jaccard"]).abs()
    return {"num_pairs": int(len(rows)), "mae": float(err.mean()) if len(rows) else np.nan,
            "max_error": float(err.max()) if len(rows) else np.nan}


def detection_by_bin(pairs: pd.DataFrame, edges: list[float], bands: int, rows: int) -> pd.DataFrame:
    """Share of same-family pairs that are LSH candidates, per exact-Jaccard bin [lo, hi) (last bin closed).

    Columns: lo, hi, num_pairs, mean_jaccard, num_candidates, detection_rate, theory_rate (mean of P(J) over the
    bin's pairs, the S-curve's expectation for that bin), theory_at_mid (P at the bin's midpoint).
    """
    same = pairs[pairs["same_family"]]
    out = []
    for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        last = k == len(edges) - 2
        j = same["exact_jaccard"]
        rows_in = same[(j >= lo) & ((j <= hi) if last else (j < hi))]
        n = len(rows_in)
        found = int(rows_in["lsh_candidate"].sum())
        theory = [lsh_candidate_probability(s, bands, rows) for s in rows_in["exact_jaccard"]]
        out.append(dict(lo=lo, hi=hi, num_pairs=n, mean_jaccard=float(rows_in["exact_jaccard"].mean()) if n else np.nan,
                        num_candidates=found, detection_rate=found / n if n else np.nan,
                        theory_rate=float(np.mean(theory)) if n else np.nan,
                        theory_at_mid=lsh_candidate_probability((lo + hi) / 2, bands, rows)))
    return pd.DataFrame(out)


def precision_recall(pairs: pd.DataFrame, thresholds: list[float]) -> pd.DataFrame:
    """Near-dedup precision and recall per threshold under both truths (see the module docstring).

    Columns: truth ("theory" or "exact"), threshold, predicted, positives, true_positives, precision, recall
    (NaN when the denominator is 0).
    """
    pairs = pairs[pairs["kind"] != "copy-copy"]
    out = []
    for truth_kind in ("theory", "exact"):
        score = pairs["theory_jaccard"] if truth_kind == "theory" else pairs["exact_jaccard"]
        for t in thresholds:
            predicted = pairs["lsh_candidate"] & (pairs["exact_jaccard"] >= t)
            truth = (pairs["kind"] == "copy-original") & (score >= t)
            tp = int((predicted & truth).sum())
            n_pred, n_true = int(predicted.sum()), int(truth.sum())
            out.append(dict(truth=truth_kind, threshold=t, predicted=n_pred, positives=n_true, true_positives=tp,
                            precision=tp / n_pred if n_pred else np.nan, recall=tp / n_true if n_true else np.nan))
    return pd.DataFrame(out)
