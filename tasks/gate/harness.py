"""The per-document correctness that harness criteria of the gate judge (``evals.gate``, metrics ``harness_*``).

The base and every CPT candidate are scored on each task the gate names, with the experiment's tokenizer (the CPT
artifact's tokenizer input) and the harness model of ``evals.harness``, on every document of the task, logged samples
on; a document is correct when it scores 1 on the criterion's ``task_metric``. Unlike the cloze items, harness
documents are not checked against the CPT training stream for overlap.

Output: ``harness_items.parquet`` in the gate artifact: candidate, task, task_metric, doc_id, correct.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from infra.errors import CheckpointError, DataError

ITEMS_FILE = "harness_items.parquet"


def experiment_tokenizer(cpt_dir: Path, artifacts: Path) -> Path:
    """The tokenizer artifact the CPT artifact at ``cpt_dir`` was built from (its ``meta.json`` input keys).

    Raises:
        CheckpointError: the CPT artifact records no tokenizer input, or that artifact is gone.
    """
    key = json.loads((Path(cpt_dir) / "meta.json").read_text()).get("input_keys", {}).get("tokenizer")
    path = Path(artifacts) / "tokenizer" / str(key)
    if not key or not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"the CPT artifact {cpt_dir} names no tokenizer artifact that exists ({path}); the "
                              "gate's harness criteria need it")
    return path


def _load(checkpoint: Path):
    if (checkpoint / "config.json").is_file() and not (checkpoint / "state.json").exists():
        from models.hf import decoder_from_hf

        return decoder_from_hf(checkpoint)
    from tasks.train.checkpoint import load_model

    return load_model(checkpoint)


def score_harness(checkpoints: dict[str, Path], criteria, tokenizer_dir: Path, out: Path, *,
                  seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Per model name, ``<task>.<task_metric>`` → bool (M_t,) per document, for the harness ``criteria``.

    Args:
        checkpoints: model name → checkpoint directory (or Hugging Face folder), base first.
        criteria: the gate's harness criteria (``GateCriterion`` with ``task`` and ``task_metric``).
        tokenizer_dir: a tokenizer artifact (``tokenizer.json``, ``tokenizer.meta.json``).
        out: folder that receives ``harness_items.parquet``.

    Raises:
        ConfigError: an unknown task. DataError: a group or tag named as a task, or a task metric that is not a
            per-document 0/1.
    """
    from tokenizers import Tokenizer

    from evals.harness import DecoderLM, evaluate, per_item_correct

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    eos_id = int(json.loads((Path(tokenizer_dir) / "tokenizer.meta.json").read_text())["eos_id"])
    tasks = list(dict.fromkeys(c.task for c in criteria))
    arrays: dict[str, dict[str, np.ndarray]] = {}
    rows = []
    for name, checkpoint in checkpoints.items():
        # Each context's continuations in one batch: on cloze items, the scores of evals.cloze to the bit.
        lm = DecoderLM(_load(Path(checkpoint)), tokenizer, eos_id, batching="context")
        samples = evaluate(lm, tasks, log_samples=True, bootstrap_iters=0, seed=seed)["samples"]
        arrays[name] = {}
        for c in criteria:
            if c.task not in samples:
                raise DataError(f"gate criterion {c.name}: harness task {c.task!r} logged no samples (logged: "
                                f"{sorted(samples)}); name a task, not a group or tag")
            correct = per_item_correct(samples[c.task], c.task_metric)
            arrays[name][c.harness_key] = correct
            rows += [{"candidate": name, "task": c.task, "task_metric": c.task_metric, "doc_id": i, "correct": bool(v)}
                     for i, v in enumerate(correct)]
    pd.DataFrame(rows, columns=["candidate", "task", "task_metric", "doc_id", "correct"]).to_parquet(
        Path(out) / ITEMS_FILE, index=False)
    return arrays
