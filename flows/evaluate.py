"""Scoring any checkpoint on an experiment's evaluation sets without training (``pretrain eval``).

The tokenizer is the experiment's tokenizer artifact whose hash the checkpoint records, so a checkpoint is never
scored with a tokenizer it was not trained with. Held-out loss per source (nats/token and bits per byte) uses
the tokenizer stage's held-out splits and the CPT evaluation budget; cloze accuracy is reported per group and
kind with its binomial standard error (docs/methods.md §10).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


from evals.cloze import cloze_summary, load_cloze_sets, score_cloze
from infra.errors import CheckpointError
from infra.runs import RunsLayout


def find_tokenizer(layout: RunsLayout, tokenizer_hash: str) -> Path:
    """The tokenizer artifact under ``layout`` whose ``tokenizer_hash`` is the given one.

    Raises:
        CheckpointError: no complete tokenizer artifact has that hash (names the ones present).
    """
    folder = layout.artifacts / "tokenizer"
    found = []
    for meta in sorted(folder.glob("*/tokenizer.meta.json")) if folder.is_dir() else []:
        saved = json.loads(meta.read_text()).get("tokenizer_hash")
        found.append(saved)
        if saved == tokenizer_hash:
            return meta.parent
    raise CheckpointError(f"no tokenizer artifact in {folder} has hash {tokenizer_hash!r} (present: {found}); run "
                          "the experiment's pipeline up to the tokenizer stage with the tokenizer this model used")


def evaluate_checkpoint(checkpoint: Path, cfg: Any, layout: RunsLayout) -> dict[str, Any]:
    """Held-out loss per source and cloze accuracy of ``checkpoint`` on ``cfg``'s evaluation sets. ``checkpoint``
    may name a checkpoint of a main-run artifact: ``main@<name>`` (the main artifact of ``cfg`` in ``layout``) or
    ``<artifact folder>@<name>`` (names such as ``step_00000400``, ``ema``, ``average``: ``tasks.train.milestones``).

    Returns {"heldout": DataFrame(source, tokens, loss_nats, bits_per_byte), "cloze": DataFrame(group, kind,
    scoring, correct, items, accuracy, se_points, ci_low, ci_high): ``evals.cloze.cloze_summary``, every scoring
    (sum, per token, per byte), "tokenizer": Path}.

    Raises:
        CheckpointError: missing/corrupt checkpoint, an unknown checkpoint name (the available ones listed), or no
            tokenizer artifact matching its recorded hash.
        DataError: unreadable cloze sets.
    """
    from evals.cloze import cloze_files
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.checkpoint import load_model, verify_checkpoint
    from tasks.train.runner import evaluate_sources, evals_frame

    from tasks.train.milestones import resolve_named, split_name

    named = split_name(checkpoint)
    if named is not None and not Path(checkpoint).exists():
        main_artifact = None
        if named[0] == "main":  # this experiment's main run, by its key
            from flows.keys import chain_keys

            main_artifact = layout.artifacts / "main" / chain_keys(cfg, until="main")["main"].key
            if not main_artifact.is_dir():
                raise CheckpointError(f"{checkpoint}: this experiment's main artifact {main_artifact} does not "
                                      "exist; run the pipeline through the main stage first, or name another "
                                      "artifact as runs/artifacts/main/<key>@<name>")
        checkpoint = resolve_named(checkpoint, main_artifact=main_artifact, runs_root=layout.root)
    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        raise CheckpointError(f"{checkpoint} does not exist; give a checkpoint directory (one holding "
                              "model.safetensors and state.json, e.g. runs/artifacts/main/<key>/checkpoint)")
    if (checkpoint / "checkpoint").is_dir() and not (checkpoint / "state.json").exists():
        checkpoint = checkpoint / "checkpoint"  # a stage artifact folder: its checkpoint
    record = verify_checkpoint(checkpoint)
    tokenizer_hash = record.get("extra", {}).get("tokenizer_hash")
    if not tokenizer_hash:
        raise CheckpointError(f"{checkpoint} records no tokenizer_hash: it cannot be matched to a tokenizer")
    tokenizer_dir = find_tokenizer(layout, tokenizer_hash)
    corpus = TokenizedCorpus(tokenizer_dir)
    model = load_model(checkpoint)
    sources = list(dict.fromkeys(cfg.general_sources + cfg.domain_sources))
    evals = evaluate_sources(model, corpus, sources, seq_len=model.cfg.seq_len, eval_tokens=cfg.cpt.budget.eval_tokens)
    heldout = evals_frame(evals)[["source", "tokens", "loss_nats", "bits_per_byte"]]
    tokenizer = corpus.tokenizer
    scored = score_cloze(model, lambda text: tokenizer.encode(text).ids, load_cloze_sets(cloze_files(cfg.gate.cloze_paths)),
                         max_len=model.cfg.seq_len)
    return {"heldout": heldout, "cloze": cloze_summary(scored), "tokenizer": tokenizer_dir}
