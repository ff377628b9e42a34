"""A ``Decoder`` as a model of EleutherAI's lm-evaluation-harness (Gao et al. 2024), and the cloze sets as harness
tasks.

``DecoderLM`` (registered as the harness model ``pretrain``) answers the three request types of
``lm_eval.api.model.LM``:

- ``loglikelihood(context, continuation)``: the summed log-probability, in nats, of the continuation's tokens given
  the context, and whether greedy decoding would produce exactly those tokens. Scored as ``evals.cloze`` scores an
  option (docs/methods.md §10): the continuation is the tokens of context+continuation beyond their longest common
  prefix with the context's own tokens, so a tokenizer merge across the boundary cannot drop or add a token; when the
  context's tokens are a prefix (the usual case) this is the harness's own split. Inputs longer than ``seq_len`` are
  cut from the left, keeping the last ``seq_len`` positions, as the harness's ``hf`` model does.
- ``loglikelihood_rolling(text)``: the log-probability of the whole text after an EOS, in the harness's disjoint
  windows of ``seq_len`` predicted tokens; every token is predicted once and the last window keeps a full context.
  For a text of k·seq_len tokens the windows are those of ``evals.heldout.heldout_windows`` on EOS + the text, so the
  value is minus their summed held-out nats.
- ``generate_until(context, gen_kwargs)``: greedy decoding with the KV cache of ``models.generate``, stopped at EOS,
  at the first ``until`` string (cut off) or after ``max_gen_toks`` tokens; the context is cut from the left to
  ``seq_len − max_gen_toks`` tokens, as the ``hf`` model does; ids of the padded vocabulary rows (no text) are never
  produced. Sampling is refused.

Log-probabilities come from fp32 log-softmax over the model's full (padded) vocabulary; a continuation's terms are
summed in fp32 (as ``evals.cloze``), a rolling window's in fp64 (as ``evals.heldout``). Requests are scored in
right-padded batches (the causal mask keeps padding unseen), sorted by length or grouped by context (``batching``).

The cloze sets as harness tasks: ``cloze_task_records`` turns ``ClozeItem``s into the rows of a multiple-choice task
(``evals/harness_tasks/``: one YAML per set over a JSON-lines file, the option text carrying its leading space, so
the target delimiter is empty); ``write_cloze_task`` writes them. ``per_item_correct`` reads per-item correctness
back from the harness's logged samples (``log_samples=True``) for the gate's paired criteria.

Usage::

    lm = DecoderLM(model, tokenizer, eos_id=0)
    out = evaluate(lm, ["pretrain_cloze_general"], log_samples=True)
    results_frame(out)                       # task, metric, value, stderr, n
    per_item_correct(out["samples"]["pretrain_cloze_general"])
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (the built-in model names must be registered before ours, or get_model skips them)
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from torch import nn

from evals.cloze import ClozeItem, _split_option
from infra.errors import ConfigError, DataError

HARNESS_TASKS = Path(__file__).resolve().parent / "harness_tasks"
# The cloze sets shipped as harness tasks: task name → the item file it is generated from.
CLOZE_TASKS = {"pretrain_cloze_general": "configs/cloze/general.jsonl",
               "pretrain_cloze_domain": "configs/cloze/domain.jsonl",
               "pretrain_cloze_demo": "configs/cloze/demo.jsonl"}

BATCHING = ("length", "context")


class _OwnTaskHints(logging.Filter):
    """Drops the harness's ``--metadata`` hint for the shipped cloze tasks: it is printed for every task that loads
    its data with a function (as these do) and offers options they do not have."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(tuple(f"{t}:" for t in CLOZE_TASKS)) and "--metadata" in message)


logging.getLogger("lm_eval.api.task").addFilter(_OwnTaskHints())

# Shape legend: B requests in one batch, T input positions, V vocabulary (the model's embedding rows).


@register_model("pretrain")
class DecoderLM(TemplateLM):
    """A ``Decoder`` and its tokenizer behind the harness's ``LM`` interface (module docstring).

    Args:
        model: the decoder; run in eval mode under ``torch.no_grad`` on its own device, its mode restored after
            each call.
        tokenizer: the ``tokenizers.Tokenizer`` it was trained with.
        eos_id: the document separator: the conditioning token of an empty context and of rolling windows, and a
            stop token for generation.
        batch_size: requests per forward pass.
        batching: ``"length"`` sorts requests by length before cutting batches (fewest padded positions);
            ``"context"`` batches the continuations of one context together, in request order, which for a cloze
            task is the batch ``evals.cloze.score_cloze`` runs (one item's options), so the scores are bit-identical
            to it.
        max_gen_toks: default cap on generated tokens (a task's ``max_gen_toks`` overrides it).

    Raises:
        ConfigError: ``eos_id`` outside the model's vocabulary, a non-positive batch size / ``max_gen_toks``, or
            an unknown ``batching``.
    """

    backend = "causal"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, eos_id: int, *, batch_size: int = 16,
                 batching: str = "length", max_gen_toks: int = 256):
        super().__init__()
        cfg = model.cfg
        if not 0 <= eos_id < cfg.vocab_size:
            raise ConfigError(f"eos_id = {eos_id} lies outside the model's vocabulary [0, {cfg.vocab_size})")
        if batch_size < 1 or max_gen_toks < 1:
            raise ConfigError(f"batch_size = {batch_size} and max_gen_toks = {max_gen_toks} must both be >= 1")
        if batching not in BATCHING:
            raise ConfigError(f"batching = {batching!r}: must be one of {list(BATCHING)}")
        self.model, self.tokenizer, self.eos_id, self.batching = model, tokenizer, int(eos_id), batching
        self.batch_size, self.max_gen_toks = int(batch_size), int(max_gen_toks)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "DecoderLM":
        raise ConfigError("the harness model 'pretrain' is built from a loaded Decoder and tokenizer, not from "
                          f"--model_args ({arg_string!r}); score a checkpoint with `pretrain eval CHECKPOINT "
                          "--harness TASKS`")

    create_from_arg_obj = create_from_arg_string

    # -------------------------------------------------------------------------------------- tokenization

    @property
    def eot_token_id(self) -> int:
        return self.eos_id

    @property
    def max_length(self) -> int:
        """The model's context window, ``cfg.seq_len`` tokens."""
        return int(self.model.cfg.seq_len)

    @property
    def device(self) -> torch.device:
        param = next(self.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``, encoded as the cloze scorer encodes text (the tokenizer's post-processor, if any,
        applied unless ``add_special_tokens`` is False)."""
        return list(self.tokenizer.encode(string, add_special_tokens=add_special_tokens is not False).ids)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens) by the cloze rule: the continuation is what lies beyond the longest
        common prefix of the context's tokens and context+continuation's (docs/methods.md §10). Trailing spaces of the
        context move to the continuation first, as in the harness.

        Raises:
            DataError: the continuation adds no token.
        """
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        full, start, _ = _split_option(self.tok_encode, context, continuation)
        return full[:start], full[start:]

    # -------------------------------------------------------------------------------------- scoring

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False,
                              accumulate: torch.dtype = torch.float32) -> list[tuple[float, bool]]:
        """(summed log-probability in nats, greedy) of each request's continuation tokens given its context tokens.

        ``accumulate`` is the dtype the per-token log-probabilities (fp32) are summed in.

        Raises:
            DataError: a continuation longer than ``seq_len`` or empty, or an empty context.
        """
        for key, context, continuation in requests:
            if not context or not continuation:
                raise DataError(f"request {key!r}: context and continuation need at least one token each")
            if len(continuation) > self.max_length:
                raise DataError(f"request {key!r}: the continuation has {len(continuation)} tokens, more than the "
                                f"model's seq_len = {self.max_length}; it cannot be scored in full")
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        with _inference(self.model):
            for chunk in self._batches(requests):
                inputs = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in chunk]
                logprobs = self._logprobs(inputs)  # (B, T, V) fp32
                for row, i in enumerate(chunk):
                    key, _, continuation = requests[i]
                    k, n = len(continuation), len(inputs[row])
                    positions = torch.arange(n - k, n, device=logprobs.device)  # (k,)
                    targets = torch.tensor(continuation, dtype=torch.long, device=logprobs.device)  # (k,)
                    rows = logprobs[row, positions]  # (k, V)
                    total = float(rows[torch.arange(k, device=rows.device), targets].to(accumulate).sum())
                    greedy = bool((rows.argmax(dim=-1) == targets).all())
                    results[i] = (total, greedy)
                    if key is not None:
                        self.cache_hook.add_partial("loglikelihood", key, results[i])
        return results  # type: ignore[return-value]

    def _batches(self, requests: list[tuple[Any, list[int], list[int]]]) -> list[list[int]]:
        """Request indices per forward pass: by descending length (``batching="length"``), or each context's
        requests together in their order (``"context"``), at most ``batch_size`` at a time."""
        if self.batching == "length":
            order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
            groups = [order]
        else:
            by_context: dict[tuple[int, ...], list[int]] = {}
            for i, (_, context, _) in enumerate(requests):
                by_context.setdefault(tuple(context), []).append(i)
            groups = list(by_context.values())
        return [group[start:start + self.batch_size] for group in groups
                for start in range(0, len(group), self.batch_size)]

    def _logprobs(self, inputs: list[list[int]]) -> torch.Tensor:
        """fp32 log-softmax (B, T, V) of the right-padded batch ``inputs`` (each ≤ seq_len ids)."""
        width = max(len(x) for x in inputs)
        idx = torch.full((len(inputs), width), self.eos_id, dtype=torch.long)  # (B, T)
        for row, x in enumerate(inputs):
            idx[row, :len(x)] = torch.tensor(x, dtype=torch.long)
        out = self.model(idx.to(self.device))
        logits = out[0] if isinstance(out, tuple) else out  # (B, T, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.log_softmax(logits, dim=-1)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-probability (nats) of each request's whole text after EOS, over disjoint rolling windows of
        ``seq_len`` predicted tokens (``lm_eval.utils.get_rolling_token_windows``); an empty text scores 0."""
        windows, owner = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            for context, predicted in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.eos_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, context, predicted))
                owner.append(index)
        scored = self._loglikelihood_tokens(windows, accumulate=torch.float64)
        totals = [0.0] * len(requests)
        for index, (value, _) in zip(owner, scored):
            totals[index] += value
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each request's context (module docstring).

        Raises:
            ConfigError: a request asks for sampling (``do_sample`` true or ``temperature`` > 0).
        """
        from models.generate import Sampling, stream_tokens

        outputs = []
        n_vocab = min(self.tokenizer.get_vocab_size(), self.model.cfg.vocab_size)
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ConfigError(f"generation settings {gen_kwargs!r} ask for sampling; the 'pretrain' harness model "
                                  "decodes greedily only (set do_sample: false, temperature: 0)")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            prompt = self.tok_encode(context) or [self.eos_id]
            prompt = prompt[-max(1, self.max_length - max_new):]
            streamed, tokens = "", []
            decoder = DecodeStream(skip_special_tokens=False)  # incremental: no re-decoding per new token
            longest = max((len(stop) for stop in until), default=0)
            with _inference(self.model):
                stream = stream_tokens(self.model, prompt, Sampling(max_new_tokens=max_new, temperature=0.0),
                                       eos_id=self.eos_id, n_vocab=n_vocab)
                for token in stream:
                    tokens.append(token)
                    chunk = decoder.step(self.tokenizer, token) or ""
                    streamed += chunk
                    tail = streamed[-(len(chunk) + longest):]  # a stop string can only end in the new text
                    if chunk and any(stop in tail for stop in until):
                        break
                del stream  # closes the generator now, inside the eval-mode block
            text = self.tok_decode(tokens)
            cut = min((text.index(stop) for stop in until if stop in text), default=len(text))
            outputs.append(text[:cut])
            self.cache_hook.add_partial("generate_until", req.args, text[:cut])
        return outputs


class _inference:
    """``torch.no_grad`` and eval mode for the duration; the model's previous mode is restored."""

    def __init__(self, model: nn.Module):
        self.model, self.grad = model, torch.no_grad()

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.model.eval()
        self.grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.grad.__exit__(*exc)
        self.model.train(self.was_training)


# ------------------------------------------------------------------------------------------ the cloze sets as tasks

def cloze_task_records(items: Iterable[ClozeItem]) -> list[dict[str, Any]]:
    """One multiple-choice row per cloze item: ``item_id, group, kind, source, context, options, answer`` (the
    option strings as ``evals.cloze`` scores them, each with its leading space)."""
    return [{"item_id": item.item_id, "group": item.group, "kind": item.kind, "source": item.source,
             "context": item.context, "options": list(item.options), "answer": int(item.answer)} for item in items]


def write_cloze_task(items: Iterable[ClozeItem], path: Path) -> Path:
    """Write ``cloze_task_records(items)`` to ``path`` as JSON lines (UTF-8, one item per line, in item order).

    Raises:
        DataError: no items.
    """
    records = cloze_task_records(items)
    if not records:
        raise DataError(f"no cloze items to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def write_shipped_cloze_tasks(root: Path = HARNESS_TASKS.parents[1], folder: Path = HARNESS_TASKS) -> list[Path]:
    """Regenerate the data files of the shipped cloze tasks (``CLOZE_TASKS``) from the item files under ``root``
    (default: the repository root), into ``folder``.

    Raises:
        DataError: as ``evals.cloze.load_cloze_items``.
    """
    from evals.cloze import load_cloze_items

    return [write_cloze_task(load_cloze_items(Path(root) / source), Path(folder) / f"{task}.jsonl")
            for task, source in CLOZE_TASKS.items()]


# ------------------------------------------------------------------------------------------ running and reading

def task_manager(specs: Sequence[str], include_path: Sequence[Path] = ()):
    """An ``lm_eval`` ``TaskManager`` that knows every spec: task, group or tag names, or paths of task YAML files.

    The shipped tasks (``evals/harness_tasks``) and the folder of every YAML path are on the include path; the
    harness's own task index (thousands of YAML files) is read only when a name is not found without it.

    Returns:
        (the manager, the specs as it loads them: names, and YAML paths made absolute).

    Raises:
        ConfigError: a YAML path that does not exist, or a name no task, group or tag has (close names given).
    """
    paths, resolved = [HARNESS_TASKS, *map(Path, include_path)], []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            raise ConfigError("an empty task name in the task list; give names or YAML paths separated by commas")
        if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
            path = Path(spec).resolve()
            if not path.is_file():
                raise ConfigError(f"harness task file {spec} not found (relative paths are read from the working "
                                  "directory)")
            paths.append(path.parent)
            resolved.append(str(path))
        else:
            resolved.append(spec)
    folders = tuple(dict.fromkeys(str(p) for p in paths))
    manager = _task_manager(folders, False)
    names = [s for s in resolved if not Path(s).is_file()]
    if any(name not in manager.all_tasks for name in names):
        manager = _task_manager(folders, True)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        hints = {name: difflib.get_close_matches(name, manager.all_tasks, n=3) for name in unknown}
        raise ConfigError(f"unknown harness task(s) {unknown} (close names: {hints}); give lm_eval task names or paths "
                          "of task YAML files")
    return manager, resolved


@functools.lru_cache(maxsize=8)
def _task_manager(folders: tuple[str, ...], include_defaults: bool):
    """One index per include path per process: indexing the harness's own tasks takes seconds."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(folders), include_defaults=include_defaults)


def evaluate(lm: DecoderLM, specs: Sequence[str], *, limit: int | None = None, num_fewshot: int | None = None,
             log_samples: bool = True, bootstrap_iters: int = 1000, include_path: Sequence[Path] = (),
             seed: int = 0) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` of ``lm`` on ``specs`` (see ``task_manager``): its results dict, with
    ``samples`` (per task, one logged record per document) when ``log_samples``.

    ``limit``: the first N documents of each task; ``num_fewshot``: K examples in every prompt (None: each task's
    default); ``bootstrap_iters``: resamples behind each standard error (0: none computed); ``seed`` seeds the
    harness's Python, NumPy, torch and few-shot generators.

    Raises:
        ConfigError: as ``task_manager``; a negative ``limit`` or ``num_fewshot``.
        DataError: a task whose dataset lives on the Hugging Face Hub when the Hub cannot be reached (or offline
            mode is set) and the dataset is not in the local cache; the message names the task list and the cause.
    """
    import lm_eval

    if limit is not None and limit < 1:
        raise ConfigError(f"limit = {limit}: give a positive number of documents per task")
    if num_fewshot is not None and num_fewshot < 0:
        raise ConfigError(f"num_fewshot = {num_fewshot}: must be >= 0")
    manager, resolved = task_manager(specs, include_path)
    try:
        return lm_eval.simple_evaluate(model=lm, tasks=resolved, task_manager=manager, limit=limit,
                                       num_fewshot=num_fewshot, log_samples=log_samples,
                                       bootstrap_iters=bootstrap_iters, random_seed=seed, numpy_random_seed=seed,
                                       torch_random_seed=seed, fewshot_random_seed=seed)
    except ConnectionError as err:  # `datasets` raises it for a Hub dataset it can neither download nor find cached
        raise DataError(f"tasks {', '.join(specs)}: a dataset could not be loaded from the Hugging Face Hub ({err}); "
                        "run where the Hub is reachable, or with the dataset in the local cache, or give a task "
                        "YAML with local data files (dataset_path: json, dataset_kwargs.data_files)") from None


def results_frame(results: dict[str, Any]) -> pd.DataFrame:
    """One row per (task or group, metric) of a harness results dict: ``task, metric, filter, value, stderr, n``.

    ``metric`` is the harness's metric name (``acc``, ``acc_norm``, ``exact_match``, ...) and ``filter`` its filter
    (``none`` unless the task defines one); ``stderr`` is NaN where the harness computed none; ``n`` is the
    documents scored (after ``limit``; for a group, the sum over its tasks).
    """
    n_samples = results.get("n-samples", {})
    groups = results.get("group_subtasks", {})

    def count(name: str) -> int:
        if name in n_samples:
            return int(n_samples[name].get("effective", n_samples[name].get("original", 0)))
        return sum(count(child) for child in groups.get(name, []))

    rows = []
    for task, values in {**results.get("results", {}), **results.get("groups", {})}.items():
        for key, value in values.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, filter_name = key.split(",", 1)
            stderr = values.get(f"{metric}_stderr,{filter_name}")
            rows.append({"task": task, "metric": metric, "filter": filter_name, "value": float(value),
                         "stderr": float(stderr) if isinstance(stderr, (int, float)) else math.nan, "n": count(task)})
    frame = pd.DataFrame(rows, columns=["task", "metric", "filter", "value", "stderr", "n"])
    return frame.drop_duplicates(["task", "metric", "filter"]).reset_index(drop=True)


def per_item_correct(samples: Sequence[dict[str, Any]], metric: str = "acc") -> np.ndarray:
    """bool (M,) per document in ``doc_id`` order: whether the document scored 1 on ``metric`` in the harness's
    logged samples of one task (``evaluate(..., log_samples=True)["samples"][task]``).

    Raises:
        DataError: no samples, a sample without ``metric``, a value other than 0 or 1 (not a per-item
            correctness), or a document logged twice (several filters: pass one filter's samples).
    """
    if not samples:
        raise DataError("no logged samples: run the harness with log_samples=True on at least one document")
    by_doc: dict[int, bool] = {}
    for sample in samples:
        if metric not in sample:
            raise DataError(f"harness sample of document {sample.get('doc_id')} has no metric {metric!r} (it has "
                            f"{sample.get('metrics')}); name a per-item metric of the task")
        value = float(sample[metric])
        if value not in (0.0, 1.0):
            raise DataError(f"metric {metric!r} is {value} for document {sample.get('doc_id')}: a per-item "
                            "correctness must be 0 or 1")
        doc_id = int(sample["doc_id"])
        if doc_id in by_doc:
            raise DataError(f"document {doc_id} is logged twice (once per filter?); pass the samples of one filter")
        by_doc[doc_id] = value == 1.0
    return np.array([by_doc[d] for d in sorted(by_doc)], dtype=bool)


if __name__ == "__main__":
    for written in write_shipped_cloze_tasks():
        print(written)
