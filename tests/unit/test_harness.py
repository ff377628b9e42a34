"""The lm-evaluation-harness model of a Decoder (evals/harness.py), the cloze sets as harness tasks, `pretrain eval
--harness`, and the gate's harness criteria: on a tiny decoder and a BPE tokenizer fitted here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pydantic
import pytest
import torch
from lm_eval.api.instance import Instance
from mlflow import MlflowClient
from typer.testing import CliRunner

from evals.cloze import load_cloze_items, load_cloze_sets, score_cloze
from evals.gate import CandidateEval, GateConfig, GateCriterion, HeldoutArrays, decide, gate_hash
from evals.harness import (CLOZE_TASKS, HARNESS_TASKS, DecoderLM, evaluate, per_item_correct, results_frame,
                           write_shipped_cloze_tasks)
from evals.heldout import heldout_loss
from evals.stats import MIN_UNITS, mcnemar_exact, paired_proportion_diff_ci
from infra.errors import ConfigError, DataError
from infra.runs import RunsLayout
from infra.stage import StageContext
from infra.tracking import Tracker
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.fit import fit_tokenizer
from tasks.train.checkpoint import Checkpointer
from tasks.train.loop import TrainState
from tasks.train.pretrained_tokenizer import tokenizer_hash

ROOT = Path(__file__).resolve().parents[2]
SETS = [ROOT / "configs/cloze/general.jsonl", ROOT / "configs/cloze/domain.jsonl"]
FILLER = ("Debian is a free operating system. The package manager installs, removes and upgrades packages; "
          "the keyword def introduces a function definition and the return statement leaves it. ") * 4
SEQ_LEN, VOCAB, PADDED = 64, 400, 448


@pytest.fixture(scope="module")
def tokenizer():
    items = load_cloze_sets(SETS)
    texts = [FILLER] + [i.context + o for i in items for o in i.options]
    return fit_tokenizer(texts, TokenizerConfig(vocab_size=VOCAB))


def tiny_decoder(seed: int, seq_len: int = SEQ_LEN) -> Decoder:
    torch.manual_seed(seed)
    # A wide init spreads the log-probabilities, so options rarely tie and accuracy is not degenerate.
    return Decoder(ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=PADDED,
                               seq_len=seq_len, init_std=0.2)).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(0)


def per_item_logprobs(samples):
    return [[float(ll) for ll, _ in s["filtered_resps"]] for s in sorted(samples, key=lambda s: s["doc_id"])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, model):
    """A runs folder holding a tokenizer artifact and a checkpoint that records the tokenizer's hash."""
    root = tmp_path_factory.mktemp("runs")
    tok_dir = root / "artifacts" / "tokenizer" / "k0"
    tok_dir.mkdir(parents=True)
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    digest = tokenizer_hash(tokenizer)
    (tok_dir / "tokenizer.meta.json").write_text(json.dumps({
        "eos_id": 0, "pad_id": 1, "vocab_size": tokenizer.get_vocab_size(), "padded_vocab_size": PADDED,
        "tokenizer_hash": digest}))
    checkpoint = root / "artifacts" / "main" / "k1" / "checkpoint"
    Checkpointer(checkpoint.parent, extra={"tokenizer_hash": digest}).save(
        checkpoint, model=model, optimizer=torch.optim.AdamW(model.parameters()), state=TrainState(), sampler_state={})
    # The stage run that produced the checkpoint, in the runs folder's MLflow store.
    tracker = Tracker(RunsLayout(root).tracking_uri, RunsLayout(root).mlflow_artifacts, "tiny")
    source_run = tracker.start_run("main")
    (checkpoint.parent / "meta.json").write_text(json.dumps({"mlflow_run_id": source_run}))
    return {"root": root, "tokenizer": tok_dir, "checkpoint": checkpoint, "hash": digest, "source_run": source_run}


def save_checkpoint(directory: Path, model: Decoder, digest: str) -> Path:
    Checkpointer(directory.parent, extra={"tokenizer_hash": digest}).save(
        directory, model=model, optimizer=torch.optim.AdamW(model.parameters()), state=TrainState(), sampler_state={})
    return directory


# ------------------------------------------------------------------------------------ the cloze sets as harness tasks

def test_shipped_cloze_task_files_are_generated_from_the_item_files(tmp_path):
    written = write_shipped_cloze_tasks(ROOT, tmp_path)
    assert [p.name for p in written] == [f"{task}.jsonl" for task in CLOZE_TASKS]
    for path in written:
        stale = f"{path.name} is stale: python -m evals.harness"
        assert path.read_bytes() == (HARNESS_TASKS / path.name).read_bytes(), stale
        assert (HARNESS_TASKS / f"{path.stem}.yaml").is_file()


@pytest.mark.parametrize("batching,batch_size", [("context", 16), ("length", 5)])
def test_harness_cloze_scores_equal_the_project_cloze_scores(tokenizer, model, batching, batch_size):
    lm = DecoderLM(model, tokenizer, eos_id=0, batch_size=batch_size, batching=batching)
    out = evaluate(lm, ["pretrain_cloze_general", "pretrain_cloze_domain"], log_samples=True)
    frame = results_frame(out).set_index(["task", "metric"])
    for task, path in zip(["pretrain_cloze_general", "pretrain_cloze_domain"], SETS):
        project = score_cloze(model, lambda t: tokenizer.encode(t).ids, load_cloze_items(path), max_len=SEQ_LEN)
        assert not project["boundary_shift"].any()
        samples = out["samples"][task]
        harness, ours = per_item_logprobs(samples), [list(map(float, lps)) for lps in project["logprobs"]]
        assert [s["doc"]["item_id"] for s in sorted(samples, key=lambda s: s["doc_id"])] == list(project["item_id"])
        if batching == "context":  # the same batches as score_cloze: bit-identical
            assert harness == ours
        else:
            diff = max(abs(a - b) for h, o in zip(harness, ours) for a, b in zip(h, o))
            assert diff <= 1e-5
        np.testing.assert_array_equal(per_item_correct(samples), project["correct"].to_numpy(bool))
        assert frame.loc[(task, "acc"), "value"] == pytest.approx(project["correct"].mean(), abs=0)
        assert frame.loc[(task, "acc"), "n"] == len(project)
        assert 0 < project["correct"].mean() < 1


def test_loglikelihood_left_truncates_to_seq_len_and_flags_greedy(tokenizer):
    short = tiny_decoder(1, seq_len=8)
    lm = DecoderLM(short, tokenizer, eos_id=0)
    context = tokenizer.encode(FILLER).ids[:20]
    with torch.no_grad():
        logits = short(torch.tensor([context[-8:]]))[0].float()  # (8, V)
    greedy = int(logits[-1].argmax())
    other = (greedy + 1) % PADDED
    got = lm._loglikelihood_tokens([(None, context, [greedy]), (None, context, [other])])
    logprobs = torch.log_softmax(logits[-1], dim=-1)
    assert got[0] == (float(logprobs[greedy]), True)
    assert got[1] == (float(logprobs[other]), False)
    with pytest.raises(DataError, match="seq_len"):
        lm._loglikelihood_tokens([(None, context, context[:9])])


def test_loglikelihood_rolling_equals_the_heldout_loss(tokenizer):
    seq_len = 16
    short = tiny_decoder(2, seq_len=seq_len)
    words, text = FILLER.split(), ""
    for word in words:  # the first text of a whole number (3+) of windows
        text = f"{text} {word}" if text else word
        n = len(tokenizer.encode(text).ids)
        if n % seq_len == 0 and n >= 3 * seq_len:
            break
    ids = tokenizer.encode(text).ids
    assert len(ids) % seq_len == 0
    lm = DecoderLM(short, tokenizer, eos_id=0, batch_size=8)
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    held = heldout_loss(short, np.array([0] + ids), seq_len=seq_len, batch_size=8)
    assert held.n_tokens == len(ids)
    assert rolling[0] == -held.sum_nats


def test_generate_until_is_greedy_and_cuts_at_the_stop_string(tokenizer, model):
    from models.generate import Sampling, generate

    lm = DecoderLM(model, tokenizer, eos_id=0)
    prompt = "The package manager"
    [free] = lm.generate_until([Instance("generate_until", {}, (prompt, {"max_gen_toks": 12}), 0)])
    done = generate(model, tokenizer.encode(prompt).ids, Sampling(max_new_tokens=12), eos_id=0,
                    n_vocab=tokenizer.get_vocab_size())
    assert free == tokenizer.decode(done.tokens, skip_special_tokens=False)
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop
    [cut] = lm.generate_until([Instance("generate_until", {}, (prompt, {"max_gen_toks": 12, "until": [stop]}), 0)])
    assert cut == free[:free.index(stop)]
    with pytest.raises(ConfigError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, (prompt, {"do_sample": True}), 0)])


def test_unknown_tasks_and_missing_task_files_are_refused(tokenizer, model):
    lm = DecoderLM(model, tokenizer, eos_id=0)
    with pytest.raises(ConfigError, match="pretrain_cloze_general"):
        evaluate(lm, ["pretrain_cloze_genral"])
    with pytest.raises(ConfigError, match="not found"):
        evaluate(lm, ["no/such/task.yaml"])


def test_a_local_task_yaml_path_runs(tmp_path, tokenizer, model, caplog):
    """A task YAML outside the shipped folder, given by path: its folder joins the include path. The harness's
    ``--metadata`` hint is dropped for the shipped cloze tasks only."""
    template = (HARNESS_TASKS / "_cloze_template_yaml").read_text()
    (tmp_path / "mine.yaml").write_text(template.replace("!function cloze_data.load", "!function loader.load")
                                        + "task: my_cloze\ndataset_kwargs:\n  file: items.jsonl\n")
    (tmp_path / "loader.py").write_text((HARNESS_TASKS / "cloze_data.py").read_text())
    (tmp_path / "items.jsonl").write_text((HARNESS_TASKS / "pretrain_cloze_demo.jsonl").read_text())
    out = evaluate(DecoderLM(model, tokenizer, eos_id=0), [str(tmp_path / "mine.yaml")], limit=5)
    frame = results_frame(out)
    assert set(frame["task"]) == {"my_cloze"} and set(frame["n"]) == {5}
    hints = [r.getMessage().split(":")[0] for r in caplog.records if "--metadata" in r.getMessage()]
    assert hints == ["my_cloze"]
    caplog.clear()
    evaluate(DecoderLM(model, tokenizer, eos_id=0), ["pretrain_cloze_demo"], limit=2)
    assert not [r for r in caplog.records if "--metadata" in r.getMessage()]


# ------------------------------------------------------------------------------------------ pretrain eval --harness

def test_pretrain_eval_harness_writes_duckdb_mlflow_and_samples(runs, tmp_path, monkeypatch):
    from flows.cli import app

    args = ["eval", str(runs["checkpoint"]), "--harness", "pretrain_cloze_general,pretrain_cloze_domain", "--limit",
            "10", "--runs-dir", str(runs["root"]), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output[result.output.index("{"):])
    assert Path(printed["tokenizer"]) == runs["tokenizer"]
    with duckdb.connect(str(runs["root"] / "results.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT checkpoint, task, metric, value, stderr, n, tokenizer_hash, mlflow_run_id, "
                           "num_fewshot, doc_limit FROM harness_results ORDER BY task, metric").df()
    assert list(rows["task"]) == ["pretrain_cloze_domain"] * 2 + ["pretrain_cloze_general"] * 2
    assert list(rows["metric"]) == ["acc", "acc_norm"] * 2
    assert set(rows["n"]) == {10} and set(rows["doc_limit"]) == {10} and rows["num_fewshot"].isna().all()
    assert set(rows["checkpoint"]) == {str(runs["checkpoint"])}
    assert set(rows["tokenizer_hash"]) == {runs["hash"]} and rows["stderr"].notna().all()
    samples = [json.loads(line) for line in (Path(printed["out"]) / "samples_pretrain_cloze_general.jsonl").open()]
    assert len(samples) == 10
    acc = rows.set_index(["task", "metric"]).loc[("pretrain_cloze_general", "acc"), "value"]
    assert acc == pytest.approx(np.mean([s["acc"] for s in samples]))
    client = MlflowClient(f"sqlite:///{runs['root'] / 'mlflow.db'}")
    run = client.get_run(printed["mlflow_run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "tiny"  # the checkpoint's own experiment
    assert run.data.tags["harness.source_run"] == runs["source_run"]
    assert run.data.metrics["pretrain_cloze_general.acc"] == pytest.approx(acc)
    assert run.data.params["tokenizer_hash"] == runs["hash"] and run.info.status == "FINISHED"
    # The same evaluation replaces its rows; without --runs-dir it is recorded in the runs folder holding the
    # checkpoint, not in ./runs.
    monkeypatch.delenv("PRETRAIN_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    again = CliRunner().invoke(app, [a for a in args if a not in ("--runs-dir", str(runs["root"]))])
    assert again.exit_code == 0, again.output
    assert not (tmp_path / "runs").exists()
    assert Path(json.loads(again.output[again.output.index("{"):])["out"]).parent == runs["root"] / "harness"
    with duckdb.connect(str(runs["root"] / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM harness_results").fetchone()[0] == 4
    # A first evaluation without few-shot left num_fewshot empty; a later one with it still fits the table.
    fewshot = CliRunner().invoke(app, [*args[:-1], "--num-fewshot", "1", "--json"])
    assert fewshot.exit_code == 0, fewshot.output
    with duckdb.connect(str(runs["root"] / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM harness_results WHERE num_fewshot = 1").fetchone()[0] == 4


def test_pretrain_eval_harness_needs_a_tokenizer_it_can_find(tmp_path, runs, model):
    from flows.cli import app

    bare = tmp_path / "bare"
    Checkpointer(tmp_path, extra={}).save(bare, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                          state=TrainState(), sampler_state={})
    missing = CliRunner().invoke(app, ["eval", str(bare), "--harness", "pretrain_cloze_demo", "--runs-dir",
                                       str(tmp_path / "runs")])
    assert missing.exit_code == 2 and "--tokenizer" in missing.output
    other = tmp_path / "other_tok"
    other.mkdir()
    (other / "tokenizer.json").write_text((runs["tokenizer"] / "tokenizer.json").read_text())
    (other / "tokenizer.meta.json").write_text(json.dumps({"eos_id": 0, "tokenizer_hash": "different"}))
    wrong = CliRunner().invoke(app, ["eval", str(runs["checkpoint"]), "--harness", "pretrain_cloze_demo",
                                     "--tokenizer", str(other), "--runs-dir", str(tmp_path / "runs")])
    assert wrong.exit_code == 2 and "trained with tokenizer" in wrong.output
    neither = CliRunner().invoke(app, ["eval", str(runs["checkpoint"])])
    assert neither.exit_code == 2 and "--harness" in neither.output


def test_a_hub_task_that_cannot_be_downloaded_is_one_error_line(runs, tmp_path):
    """arc_easy's data lives on the Hub; offline (as here, with offline mode set so no retries are waited for) the
    command names the task and the way out instead of a traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "c"),
           "PRETRAIN_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "eval", str(runs["checkpoint"]), "--harness",
                           "arc_easy", "--limit", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "arc_easy" in proc.stdout and "Hugging Face Hub" in proc.stdout and "task YAML" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ the gate

def test_a_harness_criterion_is_judged_paired_per_document_like_cloze(tokenizer):
    """Base and candidate scored by the harness on the general cloze task: the harness criteria give the intervals
    and verdicts the cloze criteria give on the project's own scores of the same items."""
    base_model, cand_model = tiny_decoder(0), tiny_decoder(3)
    items = load_cloze_items(SETS[0])
    harness, cloze = {}, {}
    for name, m in (("base", base_model), ("cand", cand_model)):
        samples = evaluate(DecoderLM(m, tokenizer, eos_id=0), ["pretrain_cloze_general"], bootstrap_iters=0)["samples"]
        harness[name] = {"pretrain_cloze_general.acc": per_item_correct(samples["pretrain_cloze_general"])}
        scored = score_cloze(m, lambda t: tokenizer.encode(t).ids, items, max_len=SEQ_LEN)
        cloze[name] = scored["correct"].to_numpy(bool)
    assert (harness["base"]["pretrain_cloze_general.acc"] != harness["cand"]["pretrain_cloze_general.acc"]).any()
    windows = HeldoutArrays(np.full(4, 3.0), np.full(4, 64))
    evals = {name: CandidateEval(name, windows, windows, cloze[name], harness_correct=harness[name])
             for name in ("base", "cand")}
    task = dict(task="pretrain_cloze_general")
    gate = GateConfig(criteria=[
        GateCriterion(name="h_delta", metric="harness_accuracy_delta", op=">=", threshold=-0.10, **task),
        GateCriterion(name="c_delta", metric="cloze_accuracy_delta", op=">=", threshold=-0.10),
        GateCriterion(name="h_acc", metric="harness_accuracy", op=">=", threshold=0.9, min_items=40, **task),
        GateCriterion(name="c_acc", metric="cloze_accuracy", op=">=", threshold=0.9, min_items=40)])
    row = decide(gate, evals["base"], [evals["cand"]]).table.iloc[0]
    column = "harness_accuracy_delta.pretrain_cloze_general.acc"
    for suffix in ("", "_ci_low", "_ci_high"):
        assert row[column + suffix] == row["cloze_accuracy_delta" + suffix]
        assert row["harness_accuracy.pretrain_cloze_general.acc" + suffix] == row["cloze_accuracy" + suffix]
    assert row[column + "_mcnemar_p"] == row["cloze_accuracy_delta_mcnemar_p"]
    assert row["status_h_delta"] == row["status_c_delta"] and row["status_h_acc"] == row["status_c_acc"]
    assert row["status_h_acc"] == "undetermined"  # 38 documents < min_items
    assert row["needed_h_acc"] == row["needed_c_acc"]
    expected = cloze["cand"].mean() - cloze["base"].mean()
    assert row[column] == pytest.approx(expected)
    missing = CandidateEval("cand", windows, windows, cloze["cand"])
    with pytest.raises(DataError, match="no harness results"):
        decide(gate, evals["base"], [missing])


def test_the_gate_stage_scores_harness_criteria_on_base_and_candidates(tmp_path, runs, tokenizer):
    """The gate stage with a harness criterion: it scores the base and the candidate checkpoints of a CPT artifact
    with the experiment's tokenizer, and judges them per document."""
    from tasks.gate.harness import ITEMS_FILE
    from tasks.gate.stage import run

    cpt = tmp_path / "cpt"
    (cpt / "evals").mkdir(parents=True)
    (cpt / "meta.json").write_text(json.dumps({"input_keys": {"tokenizer": "k0"}}))
    save_checkpoint(cpt / "candidates" / "cand", tiny_decoder(3), runs["hash"])
    (cpt / "candidates.json").write_text(json.dumps({
        "base": {"checkpoint": str(runs["checkpoint"])}, "cand": {"replay_fraction": 0.1, "peak_lr": 1e-3}}))
    for name, loss in (("base", 3.0), ("cand", 2.9)):
        np.savez(cpt / "evals" / f"{name}.npz", general_window_nats=np.full(4, 3.0),
                 general_window_tokens=np.full(4, 64), domain_window_nats=np.full(4, loss),
                 domain_window_tokens=np.full(4, 64),
                 cloze_correct=np.ones(38, bool))
    gate = GateConfig(criteria=[GateCriterion(name="harness", metric="harness_accuracy_delta", op=">=",
                                              threshold=-0.5, task="pretrain_cloze_general")])
    out = tmp_path / "gate"
    out.mkdir()
    run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=RunsLayout(runs["root"]), key="g",
                     experiment="tiny"), gate)
    items = pd.read_parquet(out / ITEMS_FILE)
    assert len(items) == 2 * 38 and set(items["candidate"]) == {"base", "cand"}
    table = pd.read_parquet(out / "decisions.parquet")
    by_model = {name: part.sort_values("doc_id")["correct"].to_numpy() for name, part in items.groupby("candidate")}
    expected = by_model["cand"].mean() - by_model["base"].mean()
    assert table.loc[0, "harness_accuracy_delta.pretrain_cloze_general.acc"] == pytest.approx(expected)
    for name, m in (("base", tiny_decoder(0)), ("cand", tiny_decoder(3))):
        own = score_cloze(m, lambda t: tokenizer.encode(t).ids, load_cloze_items(SETS[0]), max_len=SEQ_LEN)
        np.testing.assert_array_equal(by_model[name], own["correct"].to_numpy(bool))
    # Paired per document: the interval is Newcombe's over the 38 pairs, with the exact McNemar p beside it.
    paired = paired_proportion_diff_ci(by_model["base"], by_model["cand"])
    column = "harness_accuracy_delta.pretrain_cloze_general.acc"
    assert (table.loc[0, column + "_ci_low"], table.loc[0, column + "_ci_high"]) == pytest.approx(
        (paired.low, paired.high))
    exact = mcnemar_exact(by_model["base"], by_model["cand"])
    assert table.loc[0, column + "_mcnemar_p"] == pytest.approx(exact.p_value)
    # The task has 38 documents, fewer than MIN_UNITS["items"]: the criterion has no verdict, and says why.
    assert table.loc[0, "status_harness"] == "undetermined" and table.loc[0, "decision"] == "undetermined"
    assert (table.loc[0, "units_harness"], table.loc[0, "needed_harness"]) == (38, MIN_UNITS["items"]) == (38, 40)
    assert table.loc[0, "reason_harness"] == ("needs >= 40 items, has 38: score more items (gate.cloze_items, passkey "
                                              "prompts or the harness task's limit)")


def test_harness_criteria_fields_and_the_gate_hash():
    with pytest.raises(pydantic.ValidationError, match="needs task"):
        GateCriterion(name="h", metric="harness_accuracy", op=">=", threshold=0.5)
    with pytest.raises(pydantic.ValidationError, match="harness metrics only"):
        GateCriterion(name="c", metric="cloze_accuracy", op=">=", threshold=0.5, task="arc_easy")
    plain = GateConfig(criteria=[GateCriterion(name="c", metric="cloze_accuracy", op=">=", threshold=0.5)])
    # The harness fields stay out of the canonical form of criteria that do not use them: a gate declared before
    # they existed keeps its hash.
    before = json.dumps({"cloze_items": "configs/cloze/demo.jsonl", "criteria": [
        {"confidence": 0.95, "metric": "cloze_accuracy", "min_items": 0, "name": "c", "op": ">=", "threshold": 0.5}],
        "rule": "all", "select": "max_domain_loss_reduction"}, sort_keys=True, separators=(",", ":"))
    import hashlib

    assert gate_hash(plain) == hashlib.sha256(before.encode()).hexdigest()
    harness = GateConfig(criteria=[GateCriterion(name="c", metric="harness_accuracy", op=">=", threshold=0.5,
                                                 task="arc_easy")])
    other = GateConfig(criteria=[GateCriterion(name="c", metric="harness_accuracy", op=">=", threshold=0.5,
                                               task="arc_easy", task_metric="acc_norm")])
    assert len({gate_hash(plain), gate_hash(harness), gate_hash(other)}) == 3


# ------------------------------------------------------------------------------- the stock `hf` model, same numbers

def test_the_exported_folder_scores_the_same_under_the_harness_hf_model(tmp_path, runs, tokenizer, model):
    """`pretrain export`'s folder run by lm_eval's own `hf` model (transformers): the same per-option
    log-likelihoods (fp32 rounding only), the same accuracy, and the same rolling log-likelihoods."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    from evals.harness import task_manager
    from tasks.export.hf import export_checkpoint

    folder = tmp_path / "hf"
    export_checkpoint(runs["checkpoint"], runs["tokenizer"], folder)
    manager, tasks = task_manager(["pretrain_cloze_general"])
    hf = HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=16)
    theirs = lm_eval.simple_evaluate(model=hf, tasks=tasks, task_manager=manager, bootstrap_iters=0)
    ours = evaluate(DecoderLM(model, tokenizer, eos_id=0), tasks, bootstrap_iters=0)
    a, b = (per_item_logprobs(out["samples"]["pretrain_cloze_general"]) for out in (theirs, ours))
    np.testing.assert_allclose(np.concatenate(a), np.concatenate(b), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(*(per_item_correct(out["samples"]["pretrain_cloze_general"])
                                    for out in (theirs, ours)))
    assert hf.prefix_token_id == 0 and hf.max_length == SEQ_LEN
    texts = [FILLER, "Debian is a free operating system."]  # several windows, and one
    requests = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    np.testing.assert_allclose(hf.loglikelihood_rolling(requests),
                               DecoderLM(model, tokenizer, eos_id=0).loglikelihood_rolling(requests), rtol=1e-6)


def test_the_model_is_registered_beside_the_harness_models():
    from lm_eval.api.registry import get_model

    assert get_model("pretrain") is DecoderLM
    assert get_model("hf").__name__ == "HFLM"
    with pytest.raises(ConfigError, match="pretrain eval"):
        DecoderLM.create_from_arg_string("pretrained=some/folder")
