"""The end-of-run summary: what the evidence says at each stage, and where to look next.

Reads only the artifact store (paths returned by the pipeline), so it works the same for a cold run and a
fully cached rerun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from infra.runs import RunsLayout
from tasks.train.epochs import epoch_warnings


def _fmt(value, floats: str) -> str:
    if isinstance(value, float):
        return floats.format(value) if abs(value) >= 1e-2 or value == 0 else f"{value:.1e}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(title: str, frame: pd.DataFrame, floats: str = "{:.3f}") -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in frame.columns:
        table.add_column(str(column), justify="right" if frame[column].dtype.kind in "if" else "left")
    for row in frame.itertuples(index=False):
        table.add_row(*[_fmt(v, floats) for v in row])
    return table


def funnel_frame(corpus: Path) -> pd.DataFrame:
    from tasks.corpus.stage import manifest_rows

    manifest = manifest_rows(json.loads((corpus / "manifest.json").read_text()))
    removals = pd.read_parquet(corpus / "removals.parquet")
    top = (removals.groupby(["source", "rule"]).size().rename("n").reset_index()
           .sort_values("n", ascending=False).groupby("source").head(3))
    reasons = top.groupby("source").apply(lambda g: ", ".join(f"{r} {n:,}" for r, n in zip(g["rule"], g["n"])),
                                          include_groups=False)
    return pd.DataFrame({
        "source": manifest["source"], "role": manifest["role"], "docs in": manifest["docs_in"].astype(int),
        "kept": manifest["docs_out"].astype(int), "removed": (manifest["docs_in"] - manifest["docs_out"]).astype(int),
        "top removal rules": [reasons.get(s, "") for s in manifest["source"]],
    })


def print_main_run(run: dict[str, Any], console: Console, max_epochs: float) -> None:
    """The main run's resume point and epochs per source (w·D/U, docs/methods.md §8), warning above ``max_epochs``."""
    if run.get("resumed_from_step"):
        console.print(f"  resumed from step {run['resumed_from_step']:,} of {run['steps']:,} (scratch checkpoint)")
    source = run.get("peak_lr_source", {})
    if source.get("from") == "sweep" and source.get("d_model"):
        console.print(f"  peak LR {run['peak_lr']:.2e} from the sweep at d_model {source['d_model']} (the swept width "
                      f"nearest the main model's {source['main_d_model']})")
    main_epochs = run.get("epochs", {})
    if main_epochs:
        console.print("  epochs per source: " + ", ".join(f"{s} {e:.2f}" for s, e in main_epochs.items()))
    for warning in epoch_warnings(main_epochs, max_epochs):
        console.print(f"  [yellow]warning:[/] {warning}")


def _corpus_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    console.print(_table("Corpus funnel per source", funnel_frame(paths["corpus"])))
    corpus_manifest = json.loads((paths["corpus"] / "manifest.json").read_text())
    console.print(f"  manifest {corpus_manifest['manifest_hash'][:12]} · boilerplate units cut "
                  f"{corpus_manifest['boilerplate_units']:,} · near-dup candidate pairs "
                  f"{corpus_manifest['near_dedup'].get('candidate_pairs', 0):,} (LSH threshold "
                  f"{corpus_manifest['near_dedup']['implied_threshold']:.2f})")
    for name, info in corpus_manifest["sources"].items():
        for warning in info["warnings"]:
            console.print(f"  [yellow]warning:[/] {warning}")


def _tokenizer_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    report = pd.read_parquet(paths["tokenizer"] / "report.parquet")
    heldout = report["split"] == "heldout" if "split" in report else True  # text the tokenizer never saw
    lang = report[(report["group_by"] == "language") & heldout][["group", "n_docs", "n_tokens", "chars_per_token",
                                                                  "tokens_per_word", "word_unit"]]
    meta = json.loads((paths["tokenizer"] / "tokenizer.meta.json").read_text())
    console.print(_table(f"Tokenizer (vocab {meta['vocab_size']:,}, padded {meta['padded_vocab_size']:,}) "
                         "per language, held-out split", lang))


def _mixture_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    choice = json.loads((paths["mixture"] / "choice.json").read_text())
    weights = ", ".join(f"{k} {v:.3f}" for k, v in choice["weights"].items())
    console.print(f"[bold]Mixture:[/] {choice['name']} ({weights})\n  rule: {choice['rule']}")
    if choice.get("runner_up"):
        console.print(f"  margin to the runner-up {choice['runner_up']}: {choice['margin']:.4f} bits/byte")
    for row in choice.get("scores", []):
        if not row.get("eligible", True):
            console.print(f"  {row['candidate']}: ineligible ({row.get('reason', '')})")
    if choice.get("proposal"):
        proposed = ", ".join(f"{k} {v:.3f}" for k, v in choice["proposal"]["weights"].items())
        console.print(f"  regression proposal ({proposed}) verified by a proxy run; it competed under the same rule")
    if choice.get("transfer"):
        t = choice["transfer"]
        flips = "the winner flips" if t["winner_flips"] else "same winner"
        console.print(f"  proxy sizes d_model {t['d_model']['proxy']} vs {t['d_model']['transfer']}: Kendall τ "
                      f"{t['tau']:.2f} ({flips}; {len(t['flipped_pairs'])} pair(s) swap order)")
    run = json.loads((paths["mixture"] / "meta.json").read_text()).get("summary", {})
    if "proxies_reused" in run:
        console.print(f"  proxies trained {run['proxies_trained']}, reused from cache {run['proxies_reused']}")


def _sweep_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    best = json.loads((paths["sweep"] / "best.json").read_text())
    console.print(f"[bold]Peak LR:[/] {best['best_lr']:.3e} (proxy held-out {best['best_value']:.4f} nats/token)")
    if best.get("spread"):
        sp = best["spread"]
        console.print(f"  {sp['n_within']} of {sp['n_complete']} completed trials within {sp['tolerance']:.0%} of the "
                      f"best loss, LR {sp['lr_low']:.2e} – {sp['lr_high']:.2e}")
    if best.get("lr_drift"):
        d = best["lr_drift"]
        lrs = ", ".join(f"d{w}: {lr:.2e}" for w, lr in zip(d["widths"], d["best_lrs"]))
        console.print(f"  best LR by width {lrs}; ratio {d['ratio']:.2f}, lr* ∝ d_model^{d['exponent']:.2f}")
    if isinstance(best.get("forecast"), list):
        for f in best["forecast"]:
            console.print(f"  loss forecast from the first {f['window']:.0%} of the best trial: predicted "
                          f"{f['predicted']:.4f}, measured {f['actual']:.4f} nats/token (error {f['error']:+.4f})")
    elif best.get("forecast"):
        console.print(f"  no loss forecast: {best['forecast']}")
    if best.get("warning"):
        console.print(f"  [yellow]warning:[/] {best['warning']}")


def _main_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    heldout = pd.read_parquet(paths["main"] / "heldout.parquet")[["source", "tokens", "loss_nats", "bits_per_byte"]]
    console.print(_table("Main run held-out loss per source", heldout))
    print_main_run(json.loads((paths["main"] / "run.json").read_text()), console, max_epochs)


def _cpt_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    candidates = json.loads((paths["cpt"] / "candidates.json").read_text())
    cands = pd.DataFrame([{"candidate": k, "replay": d.get("replay_fraction"), "realised": d.get("realised_replay_fraction"),
                           "peak_lr": d.get("peak_lr"), "general nats": d["general_loss_nats"],
                           "domain nats": d["domain_loss_nats"], "cloze acc": d["cloze_accuracy"]}
                          for k, d in candidates.items()])
    console.print(_table("CPT candidates", cands.fillna("-")))


def _gate_section(paths: dict[str, Path], console: Console, max_epochs: float) -> None:
    decision = json.loads((paths["gate"] / "decision.json").read_text())
    console.print(f"[bold]Gate decision[/]\n{decision['summary']}")
    for line in inconclusive_lines(pd.read_parquet(paths["gate"] / "decisions.parquet")):
        console.print(f"  {line}")


# One section per stage with evidence to show, in pipeline order; a run stopped by ``--until`` shows its prefix.
_SECTIONS = {"corpus": _corpus_section, "tokenizer": _tokenizer_section, "mixture": _mixture_section,
             "sweep": _sweep_section, "main": _main_section, "cpt": _cpt_section, "gate": _gate_section}


def print_summary(result: dict[str, Any], layout: RunsLayout, console: Console | None = None, *,
                  max_epochs: float = 4.0) -> None:
    """Print the per-stage evidence and the pointers to MLflow, DuckDB and the artifacts.

    ``max_epochs`` is the config's ``mixture.max_epochs``: sources the main run repeats more often get a warning.
    """
    console = console or Console()
    paths = {k: Path(v) for k, v in result["paths"].items()}
    cached = result["cached"]
    console.rule(f"[bold]pretrain · {result['experiment']}")
    console.print("stages: " + "  ".join(f"{s}={'cached' if c else 'ran'}" for s, c in cached.items()), soft_wrap=True)
    for stage, section in _SECTIONS.items():
        if stage in paths:
            section(paths, console, max_epochs)
    missing = [stage for stage in _SECTIONS if stage not in paths]
    if missing:
        console.print(f"[bold]Stopped early[/] (--until): not run this time: {', '.join(missing)}")
    console.rule("where to look next")
    if layout.remote_tracking:
        console.print(f"MLflow UI:   {layout.tracking_uri}")
    else:
        console.print(f"MLflow UI:   mlflow ui --backend-store-uri {layout.tracking_uri} --host 127.0.0.1")
    console.print(f"DuckDB:      {layout.duckdb}   (tables, columns and example queries: docs/duckdb.md)")
    console.print(f"Artifacts:   {layout.artifacts}")


def inconclusive_lines(table: pd.DataFrame) -> list[str]:
    """For each inconclusive criterion of each candidate in the gate's decision table, how many more items or
    windows would resolve it."""
    lines = []
    for row in table.to_dict("records"):
        for column in (c for c in table.columns if c.startswith("status_")):
            name = column.removeprefix("status_")
            needed = row.get(f"needed_{name}")
            if row[column] == "inconclusive" and needed is not None and needed == needed:
                resolve = "no finite number of items would" if needed == float("inf") else f"about {needed:,.0f} items/windows would"
                lines.append(f"{row['candidate']}: {name} is inconclusive; {resolve} resolve it")
    return lines


def gate_tables(gates: pd.DataFrame, decisions: pd.DataFrame, gate_cfg) -> list:
    """Rich renderables for ``pretrain gate show``: the declarations (newest first, the first is in force) and
    the decision table in the form of the CPT replay grid (docs/methods.md §11), each metric with its confidence interval and each criterion's verdict."""
    out = []
    if gates.empty:
        return ["no gate declared yet for this experiment: `pretrain run` or `pretrain gate declare` records it"]
    declared = pd.DataFrame({"gate_hash": gates["gate_hash"].str[:12], "declared_at": gates["declared_at"].astype(str),
                             "in force": ["yes"] + ["no"] * (len(gates) - 1)})
    out.append(_table("Gate declarations", declared))
    lines = [f"{c.name}: {c.metric} {c.op} {c.threshold:g} at {c.confidence:.0%}" for c in gate_cfg.criteria]
    out.append("criteria in the config: " + "; ".join(lines))
    if decisions.empty:
        out.append("no decisions recorded under the gate in force yet")
        return out
    key = decisions["artifact_key"].iloc[0] if "artifact_key" in decisions else "?"
    out.append(_table(f"Decisions under gate {decisions['gate_hash'].iloc[0][:12]} (gate artifact {key})",
                      decision_frame(decisions)))
    return out


def decision_frame(decisions: pd.DataFrame) -> pd.DataFrame:
    """The gate's decision table in the form of the CPT replay grid (docs/methods.md §11), one row per candidate: its CPT parameters, each metric as
    ``value [low, high]`` (nats; cloze accuracy ± its standard error), each criterion's status and the decision.

    Args:
        decisions: rows of ``decisions.parquet`` / DuckDB ``gate_decisions``.
    """
    def interval(row, metric):
        low, high = row.get(f"{metric}_ci_low"), row.get(f"{metric}_ci_high")
        value = row.get(metric)
        if value is None or value != value:
            return "-"
        return f"{value:+.3f} [{low:+.3f}, {high:+.3f}]"

    rows = []
    for row in decisions.to_dict("records"):
        entry = {"candidate": row["candidate"],
                 "replay": "-" if pd.isna(row.get("param_replay_fraction")) else f"{row['param_replay_fraction']:g}",
                 "peak_lr": "-" if pd.isna(row.get("param_peak_lr")) else f"{row['param_peak_lr']:g}",
                 "general rise (nats)": interval(row, "general_loss_rise_nats"),
                 "domain reduction (nats)": interval(row, "domain_loss_reduction_nats"),
                 "cloze acc": "-" if pd.isna(row.get("cloze_accuracy")) else
                 f"{row['cloze_accuracy']:.3f} ± {row.get('cloze_accuracy_se_pts', float('nan')) / 100:.3f}"}
        for column in (c for c in decisions.columns if c.startswith("status_")):
            entry[column.removeprefix("status_")] = row[column]
        entry["decision"] = row["decision"] + (" (kept)" if row.get("kept") else "")
        rows.append(entry)
    return pd.DataFrame(rows)
