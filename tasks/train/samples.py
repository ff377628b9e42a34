"""Text samples at the training runs' evaluation points: a few fixed prompts continued by the model being trained.

The main run and every CPT candidate continue each prompt of ``[samples]`` at step 0, every ``eval_every`` steps and
at the end (the loop's ``on_eval``), with the decoding of ``models.generate`` (greedy by default). The rows go to the
artifact's ``samples.parquet``, which the stage publishes as an MLflow table and shows in its summary and report.

Sampling never changes training: it runs under ``torch.no_grad`` in eval mode (the model's mode is restored), and
a sampled decoding draws from its own seeded ``torch.Generator``, never from the global RNG that training uses.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from infra.jsonl import jsonl_lines
from models.generate import generate
from tasks.train.loop import Callback, TrainState
from tasks.train.sections import SampleConfig  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

COLUMNS = ["run", "step", "tokens_seen", "prompt_index", "prompt", "completion", "new_tokens", "stop_reason",
           "decoding"]


class PeriodicSamples(Callback):
    """Continues every prompt of ``cfg`` at each evaluation point and keeps the rows (``COLUMNS``).

    Args:
        cfg: prompts and decoding.
        tokenizer: the run's ``tokenizers.Tokenizer`` (prompts are encoded with it, completions decoded).
        eos_id: generation stops at this id.
        run: the ``run`` column (``main`` or the CPT candidate's name).
        lockstep: several processes evaluate together (a launched run): every rank generates the full
            ``max_new_tokens`` and the result is cut at EOS afterwards, so the ranks' collective forward passes stay
            in step whatever each one samples.
        journal: a JSON Lines file the rows are appended to as they are made (a resumable run's scratch folder);
            the rows already there are read first, so a run resumed from a checkpoint keeps the samples of the
            evaluation points before it. None: rows in memory only (the other ranks of a launched run).
    """

    def __init__(self, cfg: SampleConfig, tokenizer: Any, *, eos_id: int, run: str, lockstep: bool = False,
                 journal: Path | None = None):
        self.cfg, self.tokenizer, self.eos_id, self.run, self.lockstep = cfg, tokenizer, eos_id, run, lockstep
        self.prompt_ids = [tokenizer.encode(p, add_special_tokens=False).ids or [eos_id] for p in cfg.prompts]
        self.n_vocab = tokenizer.get_vocab_size()
        self.journal = None if journal is None else Path(journal)
        self.rows: list[dict[str, Any]] = _read_journal(self.journal) if self.journal is not None else []

    def on_eval(self, state: TrainState, model: Any) -> None:
        sampling = self.cfg.sampling
        for index, (prompt, ids) in enumerate(zip(self.cfg.prompts, self.prompt_ids)):
            done = generate(model, ids, sampling, eos_id=None if self.lockstep else self.eos_id, n_vocab=self.n_vocab)
            tokens, stop = done.tokens, done.stop_reason
            if self.lockstep and self.eos_id in tokens:
                tokens, stop = tokens[:tokens.index(self.eos_id)], "eos"
            self.rows.append({"run": self.run, "step": state.step, "tokens_seen": state.tokens_seen,
                              "prompt_index": index, "prompt": prompt,
                              "completion": self.tokenizer.decode(tokens, skip_special_tokens=False),
                              "new_tokens": len(tokens), "stop_reason": stop, "decoding": sampling.describe()})
            if self.journal is not None:
                with open(self.journal, "a", encoding="utf-8") as f:
                    f.write(json.dumps(self.rows[-1], ensure_ascii=False) + "\n")

    def frame(self) -> pd.DataFrame:
        """The rows; an evaluation point sampled twice (before a crash and again after the resume) counts once."""
        return samples_frame(self.rows).drop_duplicates(["run", "step", "prompt_index"], keep="last",
                                                        ignore_index=True)


def _read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for number, line in jsonl_lines(path.read_text(encoding="utf-8")):
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by a killed process
            log.warning("samples journal %s: line %d is not complete JSON and is skipped", path, number)
    return rows


def samples_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The ``samples.parquet`` table from ``PeriodicSamples.rows`` (several callbacks' rows concatenated)."""
    return pd.DataFrame(list(rows), columns=COLUMNS).astype(
        {"run": "string", "step": "int64", "tokens_seen": "int64", "prompt_index": "int64", "prompt": "string",
         "completion": "string", "new_tokens": "int64", "stop_reason": "string", "decoding": "string"})


def final_samples(frame: pd.DataFrame) -> pd.DataFrame:
    """Each run's rows at its last evaluated step."""
    if frame.empty:
        return frame
    last = frame.groupby("run")["step"].transform("max")
    return frame[frame["step"] == last].reset_index(drop=True)


def shown(text: str) -> str:
    """A completion on one line for tables: newlines as ↵."""
    return text.replace("\r\n", "↵").replace("\n", "↵")


def read_samples(artifact: Path) -> pd.DataFrame | None:
    """The artifact's ``samples.parquet``, or None when it has none (no ``[samples]`` prompts when it was made)."""
    path = Path(artifact) / "samples.parquet"
    return pd.read_parquet(path) if path.is_file() else None


def samples_table(title: str, frame: pd.DataFrame, columns: Sequence[str]) -> Any:
    """A rich table of sample rows; generated text is shown as it is (never read as rich markup), newlines as ↵."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if frame[column].dtype.kind in "iu" else "left",
                         overflow="fold")
    for row in frame[list(columns)].itertuples(index=False):
        table.add_row(*[Text(shown(str(v))) for v in row])
    return table


def samples_block_frame(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Sample rows for a report table (``infra.report_blocks.TableBlock``): text on one line, and escaped for the
    terminal's rich markup (the backslash before ``[`` is also Markdown's escape, so the Markdown and HTML
    reports show the text unchanged)."""
    from rich.markup import escape

    out = frame[list(columns)].copy()
    for column in ("prompt", "completion"):
        if column in out:
            out[column] = out[column].map(lambda text: escape(shown(str(text))))
    return out
