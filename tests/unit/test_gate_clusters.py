"""The gate's loss intervals resample held-out documents, not windows (Cameron, Gelbach & Miller 2008): windows of
one document are correlated, so a window-level interval is too narrow. Also the per-window document ids the CPT
stage stores, and the gate's decision record from the stage through publishing to the summary."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evals.cloze import ClozeItem
from evals.decision import DECISION_COLUMNS
from evals.gate import CandidateEval, GateConfig, GateCriterion, HeldoutArrays, decide
from evals.heldout import window_documents
from evals.stats import MIN_UNITS, paired_bootstrap_ci
from infra.errors import DataError
from infra.runs import RunsLayout
from infra.stage import StageContext, SummaryContext

ROOT = Path(__file__).resolve().parents[2]
N_DOCS, PER_DOC, TOKENS = 8, 20, 64
# Per-document effects with mean 0 and sd ~0.29: the domain reduction is 0.5 on average, and every window of a
# document repeats its document's value (up to 1e-3), so only the 8 documents carry independent information.
EFFECTS = np.linspace(-0.45, 0.45, N_DOCS)
GATE = GateConfig(criteria=[
    GateCriterion(name="domain_gain", metric="domain_loss_reduction_nats", op=">=", threshold=0.4),
    GateCriterion(name="general_forgetting", metric="general_loss_rise_nats", op="<=", threshold=0.1)])


def _heldout(nats, docs=None):
    return HeldoutArrays(np.asarray(nats, float), np.full(len(nats), TOKENS), docs)


def _clustered(with_docs=True, reduction=0.5, effects=EFFECTS, per_doc=PER_DOC):
    """Base and one candidate on len(effects) · per_doc domain windows, per_doc near-identical windows per document;
    on the general windows (as many, in as many documents) the candidate equals the base up to per-window noise."""
    rng = np.random.default_rng(1)
    n = len(effects) * per_doc
    docs = np.repeat(np.arange(len(effects)) * 7 + 3, per_doc) if with_docs else None  # any ids, not 0..D-1
    base_domain = np.full(n, 5.0)
    cand_domain = base_domain - reduction - np.repeat(effects, per_doc) - rng.normal(0, 1e-3, n)
    general_docs = np.repeat(np.arange(len(effects)), per_doc) if with_docs else None
    general = rng.normal(3.0, 0.01, n)
    cand_general = general + rng.normal(0, 0.01, n)  # no forgetting, but the candidate's own per-window noise
    base = CandidateEval("base", _heldout(general, general_docs), _heldout(base_domain, docs))
    cand = CandidateEval("cand", _heldout(cand_general, general_docs), _heldout(cand_domain, docs))
    return base, cand


def test_correlated_windows_widen_the_interval_and_a_window_pass_becomes_undetermined():
    base, cand = _clustered()
    row = decide(GATE, base, [cand]).table.iloc[0]
    m = "domain_loss_reduction_nats"
    assert row[m] == pytest.approx(0.5, abs=1e-3)
    assert (row[f"{m}_docs"], row[f"{m}_windows"], row[f"{m}_cluster_unit"]) == (N_DOCS, N_DOCS * PER_DOC, "document")
    doc_width = row[f"{m}_ci_high"] - row[f"{m}_ci_low"]
    window_width = row[f"{m}_window_ci_high"] - row[f"{m}_window_ci_low"]
    # 20 copies per document: the window interval is about √20 ≈ 4.5 times too narrow
    assert doc_width > 3 * window_width
    assert row[f"{m}_window_ci_low"] > 0.4  # counted as 160 independent windows it would pass ...
    assert row[f"{m}_ci_low"] < 0.4 < row[f"{m}_ci_high"]  # ... over 8 documents it does not
    assert row["window_status_domain_gain"] == "pass"
    assert row["status_domain_gain"] == "undetermined" and row["decision"] == "undetermined"
    # what would resolve it is counted in documents: n · (half-width / gap)²
    half, gap = doc_width / 2, row[m] - 0.4
    assert row["needed_domain_gain"] == max(np.ceil(N_DOCS * (half / gap) ** 2), N_DOCS + 1)
    assert N_DOCS < row["needed_domain_gain"] < N_DOCS * PER_DOC
    assert row["status_general_forgetting"] == row["window_status_general_forgetting"] == "pass"
    assert "domain_gain" in decide(GATE, base, [cand]).summary() and "over 8 documents/160 windows" in decide(
        GATE, base, [cand]).summary()


def test_one_window_per_document_gives_the_window_interval():
    rng = np.random.default_rng(2)
    n = 300
    base_nats, cand_nats = rng.normal(5.0, 0.3, n), rng.normal(4.6, 0.3, n)
    docs = rng.permutation(n) * 11  # one window per document, in any order
    base = CandidateEval("base", _heldout(base_nats, docs), _heldout(base_nats, docs))
    cand = CandidateEval("cand", _heldout(base_nats, docs), _heldout(cand_nats, docs))
    row = decide(GATE, base, [cand], seed=5).table.iloc[0]
    m = "domain_loss_reduction_nats"
    before = paired_bootstrap_ci(cand_nats, base_nats, weights=np.full(n, TOKENS), seed=5)  # the previous method
    assert (row[f"{m}_window_ci_low"], row[f"{m}_window_ci_high"]) == (before.low, before.high)
    assert row[f"{m}_docs"] == row[f"{m}_windows"] == n
    width = before.high - before.low
    assert row[f"{m}_ci_low"] == pytest.approx(before.low, abs=0.1 * width)  # bootstrap noise only
    assert row[f"{m}_ci_high"] == pytest.approx(before.high, abs=0.1 * width)
    assert row["status_domain_gain"] == row["window_status_domain_gain"]


def test_without_document_ids_each_window_is_its_own_cluster():
    base, cand = _clustered(with_docs=False)
    row = decide(GATE, base, [cand]).table.iloc[0]
    m = "domain_loss_reduction_nats"
    assert row[f"{m}_cluster_unit"] == "window" and row["general_loss_rise_nats_cluster_unit"] == "window"
    assert row[f"{m}_docs"] == row[f"{m}_windows"] == N_DOCS * PER_DOC
    assert row["status_domain_gain"] == "pass"  # the correlated windows pass, as they did before document ids
    # the same as giving every window a document of its own
    n = N_DOCS * PER_DOC
    own = [CandidateEval(e.name, HeldoutArrays(e.general.window_nats, e.general.window_tokens, np.arange(n)),
                         HeldoutArrays(e.domain.window_nats, e.domain.window_tokens, np.arange(n)))
           for e in (base, cand)]
    same = decide(GATE, own[0], [own[1]]).table.iloc[0]
    for column in (m, f"{m}_ci_low", f"{m}_ci_high", f"{m}_window_ci_low", "needed_domain_gain"):
        assert same[column] == row[column] or (np.isnan(same[column]) and np.isnan(row[column]))
    assert same[f"{m}_cluster_unit"] == "document"


def test_fewer_than_two_documents_give_no_interval_and_an_undetermined_criterion():
    base, cand = _clustered(effects=np.array([0.0]), per_doc=40)
    row = decide(GATE, base, [cand]).table.iloc[0]
    m = "domain_loss_reduction_nats"
    assert row[f"{m}_docs"] == 1 and row[f"{m}_windows"] == 40
    assert row[f"{m}_ci_low"] == -np.inf and row[f"{m}_ci_high"] == np.inf
    assert row["status_domain_gain"] == "undetermined" and row["window_status_domain_gain"] == "pass"
    # what would resolve it is the minimum a loss verdict needs, not the 2 any interval needs
    assert (row["units_domain_gain"], row["needed_domain_gain"]) == (1, MIN_UNITS["documents"]) == (1, 5)
    assert row["reason_domain_gain"] == ("needs >= 5 documents, has 1: score more held-out documents (the budget's "
                                         "eval_tokens while documents lack a window, else a larger held-out split: "
                                         "[tokenizer] heldout_fraction or min_heldout_docs)")


@pytest.mark.parametrize("n_docs", [2, 4])
def test_two_to_four_documents_give_an_interval_but_no_verdict(n_docs):
    """From 2 documents there is a t interval; below MIN_UNITS["documents"] (5) a clear gain is still undetermined,
    with the reason; at 5 the same gain passes."""
    effects = np.linspace(-0.02, 0.02, n_docs)  # a gain of 1 nat, nearly the same on every document
    base, cand = _clustered(effects=effects, per_doc=4, reduction=1.0)
    row = decide(GATE, base, [cand]).table.iloc[0]
    m = "domain_loss_reduction_nats"
    assert row[f"{m}_docs"] == n_docs and np.isfinite(row[f"{m}_ci_low"]) and np.isfinite(row[f"{m}_ci_high"])
    assert row[f"{m}_ci_low"] > 0.4  # the interval alone would pass it ...
    assert row["status_domain_gain"] == "undetermined"  # ... but it rests on too few documents
    assert (row["units_domain_gain"], row["needed_domain_gain"]) == (n_docs, 5)
    assert row["reason_domain_gain"].startswith(f"needs >= 5 documents, has {n_docs}: ")
    base, cand = _clustered(effects=np.linspace(-0.02, 0.02, 5), per_doc=4, reduction=1.0)
    row = decide(GATE, base, [cand]).table.iloc[0]
    assert (row["status_domain_gain"], row["reason_domain_gain"], row["units_domain_gain"]) == ("pass", "", 5)


def test_a_gate_on_one_domain_document_is_undetermined_and_says_five_are_needed(tmp_path):
    from tasks.gate.views import undetermined_lines

    base, cand = _clustered(effects=np.array([0.0]), per_doc=40, reduction=1.0)
    out = _gate(tmp_path, {"base": base, "cand": cand}, "one")
    record = json.loads((out / "decision.json").read_text())["decision"]
    assert (record["choice"], record["verdict"]) == ("base", "undetermined")
    assert record["low"] == -np.inf and record["high"] == np.inf
    table = pd.read_parquet(out / "decisions.parquet")  # the general split is one document too
    for name in ("domain_gain", "general_forgetting"):
        assert table.loc[0, f"status_{name}"] == "undetermined"
        assert (table.loc[0, f"units_{name}"], table.loc[0, f"needed_{name}"]) == (1, 5)
        assert table.loc[0, f"reason_{name}"] == ("needs >= 5 documents, has 1: score more held-out documents "
                                                  "(the budget's eval_tokens while documents lack a window, else a larger held-out split: [tokenizer] heldout_fraction or min_heldout_docs)")
    assert undetermined_lines(table) == [f"cand: {name} is undetermined; about 5 held-out documents would resolve it"
                                         for name in ("domain_gain", "general_forgetting")]


def test_the_decision_record_of_a_one_document_gate_asks_for_five_documents(tmp_path):
    base, cand = _clustered(effects=np.array([0.0]), per_doc=40, reduction=1.0)
    record = json.loads((_gate(tmp_path, {"base": base, "cand": cand}, "one") / "decision.json").read_text())
    resolve = record["decision"]["resolve"]
    assert "domain_gain of cand" in resolve and "5 held-out documents" in resolve and "1 now" in resolve


def test_document_ids_must_match_the_windows_and_the_base():
    with pytest.raises(DataError, match="one document id per window"):
        HeldoutArrays(np.ones(4), np.full(4, TOKENS), np.arange(3))
    base, cand = _clustered()
    shifted = CandidateEval("cand", cand.general, HeldoutArrays(cand.domain.window_nats, cand.domain.window_tokens,
                                                                cand.domain.window_docs + 1))
    with pytest.raises(DataError, match="document ids differ"):
        decide(GATE, base, [shifted])
    missing = CandidateEval("cand", cand.general, HeldoutArrays(cand.domain.window_nats, cand.domain.window_tokens))
    with pytest.raises(DataError, match="document ids differ"):
        decide(GATE, base, [missing])


# --------------------------------------------------------------------------------------------- the CPT stage

VOCAB, SEQ_LEN, HASH = 64, 16, "synthetic"
HELDOUT = {"g1": [0, 30, 100, 150], "g2": [0, 70], "d": [0, 40, 90]}  # document offsets of each held-out split


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    """A tokenizer artifact of three sources with multi-document held-out splits; the domain training split
    contains the tokens of held-out window 3 of ``d``, so decontamination drops that window."""
    from tasks.train.shards import write_shard

    folder, rng, rows = tmp_path / "tokenizer", np.random.default_rng(0), []
    heldout_d = rng.integers(1, VOCAB, 200)
    for source, offsets in HELDOUT.items():
        train = rng.integers(1, VOCAB, 300)
        if source == "d":
            train[100:116] = heldout_d[3 * SEQ_LEN:4 * SEQ_LEN]
        for split, tokens, docs in (("train", train, [0]), ("heldout", heldout_d if source == "d" else
                                                          rng.integers(1, VOCAB, 200), offsets)):
            path = folder / "shards" / source / split
            path.parent.mkdir(parents=True, exist_ok=True)
            write_shard(path, tokens, vocab_size=VOCAB, eos_id=0, tokenizer_hash=HASH, n_bytes=4 * len(tokens),
                        doc_offsets=np.array(docs))
            rows.append({"source": source, "split": split, "n_tokens": len(tokens), "n_bytes": 4 * len(tokens)})
    pd.DataFrame(rows).to_parquet(folder / "shards.parquet", index=False)
    (folder / "tokenizer.meta.json").write_text(json.dumps({"tokenizer_hash": HASH, "padded_vocab_size": VOCAB,
                                                            "eos_id": 0}))
    return folder


def test_the_cpt_stage_stores_each_windows_document_and_drops_decontaminated_ones(tmp_path, corpus_dir):
    from tasks.cpt.stage import DOC_ID_STRIDE, _decontaminate, _Scorer
    from tasks.gate.stage import load_eval
    from tasks.train.corpus import TokenizedCorpus
    from tasks.train.runner import build_model
    from tasks.train.sections import CptConfig, ModelShape, RunBudget

    cfg = CptConfig(domain_sources=["d"], replay_fractions=[0.1], peak_lrs=[1e-3],
                    budget=RunBudget(steps=2, batch_size=2, warmup_steps=1, eval_tokens=2048))
    out = tmp_path / "cpt"
    out.mkdir()
    ctx = StageContext(out=out, inputs={"tokenizer": corpus_dir}, layout=RunsLayout(tmp_path / "runs"), key="k",
                       experiment="t")
    corpus = TokenizedCorpus(corpus_dir)
    encode = lambda text: [ord(ch) % (VOCAB - 1) + 1 for ch in text]  # noqa: E731
    items = [ClozeItem("i1", "general", "ab cd", [" e", " f"], 0)]
    masks, items = _decontaminate(ctx, cfg, corpus, ["g1", "g2"], items, encode, ["d"], SEQ_LEN)
    assert masks["d"].tolist() == [i != 3 for i in range(len(masks["d"]))]
    model = build_model(ModelShape(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32,
                                   seq_len=SEQ_LEN).build(VOCAB), 0)
    _Scorer(ctx, corpus, ["g1", "g2"], cfg, items, encode, masks).score("base", model, {}, step=0)
    data = np.load(out / "evals" / "base.npz")
    n = (200 - 1) // SEQ_LEN
    expected_general = np.concatenate([window_documents(HELDOUT["g1"], n, SEQ_LEN),
                                       DOC_ID_STRIDE + window_documents(HELDOUT["g2"], n, SEQ_LEN)])
    np.testing.assert_array_equal(data["general_window_docs"], expected_general)
    np.testing.assert_array_equal(data["domain_window_docs"], window_documents(HELDOUT["d"], n, SEQ_LEN)[masks["d"]])
    assert len(data["domain_window_docs"]) == len(data["domain_window_nats"]) == n - 1
    assert len(np.unique(data["general_window_docs"])) == len(HELDOUT["g1"]) + len(HELDOUT["g2"])
    loaded = load_eval(out, "base", {})
    np.testing.assert_array_equal(loaded.domain.window_docs, data["domain_window_docs"])
    old = {k: data[k] for k in data.files if not k.endswith("_docs")}  # a file written before document ids
    np.savez(out / "evals" / "old.npz", **old)
    assert load_eval(out, "old", {}).general.window_docs is None


# --------------------------------------------------------------------- the gate stage's decision record

def _cpt_artifact(folder: Path, evals: dict[str, CandidateEval]) -> Path:
    (folder / "evals").mkdir(parents=True)
    (folder / "candidates.json").write_text(json.dumps(
        {"base": {"checkpoint": str(folder / "base")}} | {n: {"replay_fraction": 0.1, "peak_lr": 1e-3}
                                                          for n in evals if n != "base"}))
    for name, e in evals.items():
        np.savez(folder / "evals" / f"{name}.npz", general_window_nats=e.general.window_nats,
                 general_window_tokens=e.general.window_tokens, general_window_docs=e.general.window_docs,
                 domain_window_nats=e.domain.window_nats, domain_window_tokens=e.domain.window_tokens,
                 domain_window_docs=e.domain.window_docs, cloze_correct=np.ones(4, bool))
    return folder


def _gate(tmp_path: Path, evals: dict[str, CandidateEval], name: str) -> Path:
    from tasks.gate.stage import run

    cpt = _cpt_artifact(tmp_path / f"cpt-{name}", evals)
    out = tmp_path / f"gate-{name}"
    out.mkdir()
    run(StageContext(out=out, inputs={"cpt": cpt, "main": tmp_path}, layout=RunsLayout(tmp_path / "runs"),
                     key=f"key-{name}", experiment="t"), GATE)
    return out


def test_the_gate_records_an_undetermined_decision_when_documents_leave_it_open(tmp_path):
    base, cand = _clustered()
    out = _gate(tmp_path, {"base": base, "cand": cand}, "open")
    decision = json.loads((out / "decision.json").read_text())
    record = decision["decision"]
    assert record["kind"] == "gate" and record["verdict"] == "undetermined" and record["choice"] == "base"
    assert record["fallback"] == "keep the base"
    table = pd.read_parquet(out / "decisions.parquet")
    needed = int(table.loc[0, "needed_domain_gain"])
    assert record["resolve"] == f"about {needed:,} held-out documents for domain_gain of cand, 8 now"
    assert (record["estimate"], record["low"], record["high"]) == tuple(
        table.loc[0, [f"domain_loss_reduction_nats{s}" for s in ("", "_ci_low", "_ci_high")]])
    assert record["unit"] == "nats/token"
    assert record["evidence"] == {"table": "gate_decisions", "gate_hash": decision["gate_hash"],
                                  "artifact_key": "key-open"}
    assert record["declared_at"] <= record["decided_at"]
    assert "domain_gain: domain_loss_reduction_nats >= 0.4" in record["rule"]


def test_a_passing_candidate_is_decided_and_failing_ones_keep_the_base_decided(tmp_path):
    base, cand = _clustered(reduction=1.0)
    record = json.loads((_gate(tmp_path, {"base": base, "cand": cand}, "pass") / "decision.json").read_text())
    assert record["kept"] == "cand" and record["decision"]["verdict"] == "decided"
    assert record["decision"]["choice"] == "cand" and record["decision"]["low"] > 0.4
    assert record["decision"]["resolve"] == "" and record["decision"]["fallback"] == ""
    base, bad = _clustered(reduction=-1.0)
    record = json.loads((_gate(tmp_path, {"base": base, "bad": bad}, "fail") / "decision.json").read_text())["decision"]
    assert (record["choice"], record["verdict"]) == ("base", "decided")
    assert np.isnan(record["estimate"])


def test_the_decision_is_published_and_summarised_with_documents_against_windows(tmp_path):
    from flows.config import load_config
    from flows.publish import PublishTarget, publish
    from flows.registry import get_stage
    from infra.artifacts import ArtifactStore
    from infra.tracking import Tracker
    from infra.warehouse import Warehouse
    from tasks.gate.views import summary

    base, cand = _clustered()
    made = _gate(tmp_path, {"base": base, "cand": cand}, "pub")
    store = ArtifactStore(tmp_path / "artifacts")
    tmp = store.begin("gate", "gate-pub")
    for name in ("decision.json", "decisions.parquet", "gate_scatter.png"):
        (tmp / name).write_bytes((made / name).read_bytes())
    artifact = store.commit("gate", "gate-pub", tmp, {"mlflow_run_id": ""})
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts", "smoke")
    warehouse = Warehouse(tmp_path / "results.duckdb")
    parent = tracker.start_run("pipeline")
    run_id = tracker.start_run("gate", parent_id=parent)
    target = PublishTarget(tracker, warehouse, "smoke", parent, "f1")
    publish(get_stage("gate"), artifact, {}, load_config(ROOT / "configs/smoke.toml"), target, run_id, cached=False)
    rows = warehouse.query("SELECT * FROM decisions")
    assert list(rows.columns[:len(DECISION_COLUMNS)]) == list(DECISION_COLUMNS)
    assert rows.loc[0, "kind"] == "gate" and rows.loc[0, "verdict"] == "undetermined"
    assert rows.loc[0, "artifact_key"] == "gate-pub"
    assert json.loads(rows.loc[0, "evidence"])["table"] == "gate_decisions"
    stage_run = tracker.client.get_run(run_id)
    assert stage_run.data.tags["decision.gate.verdict"] == "undetermined"
    assert "decision.gate.low" in stage_run.data.metrics
    assert tracker.client.get_run(parent).data.tags["decision.gate.verdict"] == "undetermined"
    lines = summary(SummaryContext(path=artifact.path, paths={}, layout=RunsLayout(tmp_path / "runs")))
    text = "\n".join(map(str, lines))
    assert "gate: base — undetermined" in text and "keep the base" in text
    assert "over 8 documents / 160 windows" in text
    assert "domain_gain would be pass by window (is undetermined)" in text
    assert "held-out documents would resolve it" in text
