"""LSH layouts compared on their S-curves P(s) = 1 − (1 − s^r)^b (docs/methods.md §7; Leskovec, Rajaraman & Ullman,
"Mining of Massive Datasets", ch. 3): the configured ``[corpus.near_dedup]`` banding, the layouts the audit lists
(``audit.lsh_layouts``) and, under ``audit.lsh_design`` constraints, the fewest-hash layouts that meet them
(``tasks.corpus.lsh_design``)."""

from __future__ import annotations

import math

import pandas as pd

from tasks.audit.config import AuditConfig
from tasks.corpus.config import MinHashConfig, lsh_candidate_probability, lsh_threshold
from tasks.corpus.lsh_design import design_layouts, evaluate_layout, parse_layout

LAYOUT_COLUMNS = ["layout", "role", "bands", "rows", "hashes", "within_num_perm", "threshold",
                  "p_at_jaccard_threshold", "p_at_s1", "p_at_s2", "margin", "meets", "drawn"]
DESIGN_ROWS = 10  # designed layouts listed, fewest hashes first
DESIGN_DRAWN = 4  # designed layouts drawn: the cheapest of each of the first distinct row counts


def layout_table(near_dedup: MinHashConfig, cfg: AuditConfig) -> pd.DataFrame:
    """One row per layout (``LAYOUT_COLUMNS``): role "configured" first, then "listed" in ``cfg.lsh_layouts``
    order, then "designed" (the first ``DESIGN_ROWS`` of :func:`design_layouts`); a layout appears once, under its
    first role. ``p_at_s1``, ``p_at_s2``, ``margin`` and ``meets`` are NaN / None without ``cfg.lsh_design``;
    ``within_num_perm``: bands·rows ≤ the configured ``num_perm`` (otherwise num_perm must be raised to use it).
    ``drawn``: configured and listed layouts, and the cheapest designed layout of each of the first
    ``DESIGN_DRAWN`` distinct row counts (neighbours with one band more are near-identical curves).

    Raises:
        NoLayoutError: ``cfg.lsh_design`` has no layout within its budget (see :func:`design_layouts`).
    """
    design = cfg.lsh_design
    chosen: list[tuple[int, int, str, bool]] = [(near_dedup.bands, near_dedup.rows, "configured", True)]
    chosen += [(*parse_layout(text), "listed", True) for text in cfg.lsh_layouts]
    if design is not None:
        rows_drawn: set[int] = set()
        for lay in design_layouts(design, limit=DESIGN_ROWS):
            drawn = lay.rows not in rows_drawn and len(rows_drawn) < DESIGN_DRAWN
            rows_drawn.add(lay.rows)
            chosen.append((lay.bands, lay.rows, "designed", drawn))
    seen: set[tuple[int, int]] = set()
    out = []
    for bands, rows, role, drawn in chosen:
        if (bands, rows) in seen:
            continue
        seen.add((bands, rows))
        fit = evaluate_layout(bands, rows, design) if design is not None else None
        out.append(dict(layout=f"{bands}x{rows}", role=role, bands=bands, rows=rows, hashes=bands * rows,
                        within_num_perm=bands * rows <= near_dedup.num_perm, threshold=lsh_threshold(bands, rows),
                        p_at_jaccard_threshold=lsh_candidate_probability(near_dedup.jaccard_threshold, bands, rows),
                        p_at_s1=fit.p_at_s1 if fit else math.nan, p_at_s2=fit.p_at_s2 if fit else math.nan,
                        margin=fit.margin if fit else math.nan, meets=fit.meets if fit else None, drawn=drawn))
    return pd.DataFrame(out, columns=LAYOUT_COLUMNS)
