"""What a mixture artifact puts into DuckDB and MLflow: the trials with the epochs each source would get in the
main run, the choice (name, rule, runner-up, weights, transfer flips, epoch warnings) and its decision record
(DuckDB ``decisions``; MLflow ``decision.mixture.*``, docs/methods.md §14)."""

from __future__ import annotations

import json

import pandas as pd

from evals.decision import DecisionRecord, decisions_frame
from infra.stage import PublishContext, Published


def publish(ctx: PublishContext) -> Published:
    path, cfg = ctx.artifact.path, ctx.cfg
    trials = pd.read_parquet(path / "trials.parquet")
    if "unique_train_tokens" in trials:
        # Epochs each source would get in the main run under each candidate, e = w·D/U (docs/methods.md §8), D
        # from today's [main] budget: the main budget is not in the mixture key, so this is computed here.
        main_tokens = cfg.main.budget.steps * cfg.main.budget.batch_size * cfg.main.model.seq_len
        trials["main_epochs"] = trials["weight"] * main_tokens / trials["unique_train_tokens"].clip(lower=1)
        trials["epochs_over_limit"] = trials["main_epochs"] > cfg.mixture.max_epochs
    choice = json.loads((path / "choice.json").read_text())
    out = Published(tables={"mixture_trials": trials}, files=["choice.json", "mixture_loss.png"])
    out.params = {"choice.mixture": choice["name"], "choice.rule_text": choice["rule"][:500],
                  "choice.runner_up": str(choice.get("runner_up")),
                  **{f"choice.weight.{s}": round(w, 6) for s, w in choice["weights"].items()}}
    if choice.get("decision"):  # artifacts built before decisions were recorded have none
        record = DecisionRecord.from_dict(choice["decision"])
        out.tables["decisions"] = decisions_frame([record])
        out.tags |= {"decision.mixture.verdict": record.verdict, "decision.mixture.choice": record.choice}
        out.metrics |= {"decision.mixture.margin": record.estimate, "decision.mixture.margin_low": record.low,
                        "decision.mixture.margin_high": record.high}
    if choice.get("transfer"):
        t = choice["transfer"]
        out.tags |= {"choice.transfer_winner_flips": str(t["winner_flips"]).lower(),
                     "choice.transfer_flipped_pairs": json.dumps(t["flipped_pairs"])[:500]}
    if "epochs_over_limit" in trials:
        over = trials[trials["epochs_over_limit"] & trials["candidate"].eq(choice["name"])]
        if not over.empty:
            out.tags["epoch_warnings"] = " | ".join(f"{r.source}: {r.main_epochs:.2f} epochs"
                                                    for r in over.drop_duplicates("source").itertuples())
    return out
