"""Manifest completeness through the real publish path (flows.publish, DuckDB, an MLflow SQLite store in a tmp
folder): tokens per source after the tokenizer equal a direct count; held-out, cloze, gate and decay-branch rows
carry the corpus manifest's hash; every corpus source is its own MLflow dataset input with its content digest."""

import functools
import hashlib
import json
import operator
import random
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from tokenizers import Tokenizer

from flows.config import load_config
from flows.publish import PublishTarget, publish
from flows.registry import get_stage
from infra.artifacts import ArtifactStore
from infra.errors import DataError
from infra.expectations import check_heldout, check_manifest_hash, check_source_tokens
from infra.runs import RunsLayout
from infra.stage import StageContext
from infra.tracking import Tracker
from infra.warehouse import Warehouse
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.stage import run as run_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"web_en": ("en", "general", 50), "wiki_zh": ("zh", "general", 30), "pydoc": ("en", "domain", 40)}
MANIFEST_QUERY = """
SELECT m.source, m.docs_out, t.train_tokens, t.heldout_tokens, t.tokens, t.artifact_key AS tokenizer_key
FROM manifest m JOIN tokenizer_sources t ON t.corpus_key = m.artifact_key AND t.source = m.source
ORDER BY m.source, tokenizer_key
"""


def _kept() -> pd.DataFrame:
    rng = random.Random(1)
    words = {"en": "install the package with apt then restart the service now".split(), "zh": list("软件包虚拟机安装服务")}
    rows = []
    for source, (language, _, n_docs) in SOURCES.items():
        for i in range(n_docs):
            text = " ".join(rng.choice(words[language]) + str(rng.randrange(100)) for _ in range(25))
            rows.append(dict(doc_id=f"{source}/{i}", source=source, family_id=f"{source}/{i}", text=text,
                             language=language, n_chars=len(text), n_bytes=len(text.encode()),
                             n_words=len(text.split())))
    return pd.DataFrame(rows)


def _corpus(store: ArtifactStore, kept: pd.DataFrame):
    """A corpus artifact with what its publish reads: manifest.json, kept documents and the four tables."""
    tmp = store.begin("corpus", "corpus-k")
    (tmp / "kept").mkdir(parents=True, exist_ok=True)
    kept.to_parquet(tmp / "kept" / "part-00000.parquet", index=False)
    sources = {s: {"role": role, "snapshot": "1.0-1", "licence": "GPL", "docs_in": n + 1, "docs_out": n,
                   "n_chars": int(kept.loc[kept["source"] == s, "n_chars"].sum()),
                   "n_bytes": int(kept.loc[kept["source"] == s, "n_bytes"].sum()),
                   "n_words": int(kept.loc[kept["source"] == s, "n_words"].sum()), "stages": {}}
               for s, (_, role, n) in SOURCES.items()}
    body = {"sources": sources, "near_dedup": {"implied_threshold": 0.71, "s_curve": [[0.5, 0.06], [0.9, 1.0]]}}
    body["manifest_hash"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    (tmp / "manifest.json").write_text(json.dumps(body))
    (tmp / "removals").mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"doc_id": "web_en/x", "source": "web_en", "stage": "quality", "rule": "short"}]).to_parquet(
        tmp / "removals" / "part-00000.parquet", index=False)
    pd.DataFrame([{"source": "web_en", "stage": "read", "docs_in": 51, "docs_out": 50}]).to_parquet(
        tmp / "funnel.parquet", index=False)
    pd.DataFrame([{"source": "web_en", "doc_id": "web_en/1", "eval_set": "cloze"}]).to_parquet(
        tmp / "decontamination.parquet", index=False)
    pd.DataFrame([{"source": "web_en", "unit_hash": "ab", "n_docs": 3}]).to_parquet(
        tmp / "boilerplate.parquet", index=False)
    return store.commit("corpus", "corpus-k", tmp, {"mlflow_run_id": "", "input_keys": {}})


def _tokenizer(store: ArtifactStore, corpus, layout: RunsLayout):
    tmp = store.begin("tokenizer", "tok-k")
    ctx = StageContext(out=tmp, inputs={"corpus": corpus.path}, layout=layout, key="tok-k", experiment="smoke")
    run_tokenizer(ctx, TokenizerConfig(vocab_size=300, sample_max_chars=8000, decontam_ngram=0),
                  general=["web_en", "wiki_zh"], domain=["pydoc"])
    get_stage("tokenizer").validate(tmp, None)  # the shard and per-source suites
    return store.commit("tokenizer", "tok-k", tmp, {"mlflow_run_id": "", "input_keys": {"corpus": corpus.key}})


def _evaluations(store: ArtifactStore, tokenizer, manifest_hash: str) -> dict:
    """Main, CPT, gate and decay-branch artifacts as their stages write them (only the files publish reads)."""
    heldout = pd.DataFrame([{"source": s, "split": "heldout", "tokens": 100, "loss_nats": 3.0, "bits_per_byte": 1.5,
                             "checkpoint": c, "step": 10, "tokens_seen": 1000} for s in SOURCES for c in ("base", "c1")])
    tmp = store.begin("main", "main-k")
    heldout[heldout["checkpoint"] == "base"].assign(checkpoint="main").to_parquet(tmp / "heldout.parquet", index=False)
    (tmp / "run.json").write_text(json.dumps({"schedule": "cosine", "epochs": {}}))
    (tmp / "checkpoint").mkdir()
    (tmp / "checkpoint" / "state.json").write_text(json.dumps({"extra": {"manifest_hash": manifest_hash}}))
    main = store.commit("main", "main-k", tmp, {"mlflow_run_id": "", "input_keys": {"tokenizer": tokenizer.key}})
    tmp = store.begin("cpt", "cpt-k")
    heldout.to_parquet(tmp / "heldout.parquet", index=False)
    pd.DataFrame([{"checkpoint": c, "item_id": "i1", "answer": 0, "predicted": 0, "correct": True,
                   "logprob_answer": -1.0} for c in ("base", "c1")]).to_parquet(tmp / "cloze.parquet", index=False)
    cpt = store.commit("cpt", "cpt-k", tmp, {"mlflow_run_id": "", "input_keys": {"tokenizer": tokenizer.key,
                                                                               "main": main.key}})
    tmp = store.begin("gate", "gate-k")
    (tmp / "decision.json").write_text(json.dumps({"gate_hash": "g1", "kept": "base", "summary": "keep base"}))
    pd.DataFrame([{"candidate": "c1", "decision": "fail"}]).to_parquet(tmp / "decisions.parquet", index=False)
    gate = store.commit("gate", "gate-k", tmp, {"mlflow_run_id": "", "input_keys": {"main": main.key, "cpt": cpt.key}})
    tmp = store.begin("branches", "br-k")
    (tmp / "branches.json").write_text(json.dumps({"requested": True, "trunk_key": "t", "decay_shape": "linear",
                                                   "min_lr_ratio": 0.1, "main_decay_start": 8,
                                                   "branches": [{"branch": "main_mixture"}]}))
    pd.DataFrame([{"branch": "main_mixture", "source": "web_en", "tokens_seen": 1000, "tokens": 100,
                   "bits_per_byte": 1.4, "delta_bpb_vs_branch_point": -0.1, "delta_bpb_vs_main_mixture": None}]
                 ).to_parquet(tmp / "branches.parquet", index=False)
    branches = store.commit("branches", "br-k", tmp, {"mlflow_run_id": "", "input_keys": {"tokenizer": tokenizer.key}})
    return {"main": main, "cpt": cpt, "gate": gate, "branches": branches}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("completeness")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", root / "mlartifacts", "smoke")
    env = SimpleNamespace(cfg=load_config(ROOT / "configs/smoke.toml"), tracker=tracker,
                          warehouse=Warehouse(root / "results.duckdb"), store=ArtifactStore(root / "artifacts"),
                          parent_run_id=tracker.start_run("pipeline"), runs={})
    target = PublishTarget(tracker, env.warehouse, "smoke", env.parent_run_id, "flow-1")
    env.kept = _kept()
    corpus = _corpus(env.store, env.kept)
    env.tokenizer = _tokenizer(env.store, corpus, RunsLayout(root))
    env.manifest_hash = json.loads((corpus.path / "manifest.json").read_text())["manifest_hash"]
    artifacts = {"corpus": corpus, "tokenizer": env.tokenizer, **_evaluations(env.store, env.tokenizer,
                                                                                env.manifest_hash)}
    for name, artifact in artifacts.items():  # cached=True: figures and files are not logged, rows and inputs are
        env.runs[name] = tracker.start_run(name, parent_id=env.parent_run_id)
        inputs = {n: env.store.get(n, k) for n, k in artifact.meta.get("input_keys", {}).items()}
        publish(get_stage(name), artifact, inputs, env.cfg, target, env.runs[name], cached=True)
    return env


def _direct_tokens(env) -> dict[tuple[str, str], int]:
    """Tokens of each (source, split) counted from the documents: the fitted tokenizer on each text (special-token
    strings as plain text, as shards encode them) plus one EOS per document."""
    tok = Tokenizer.from_file(str(env.tokenizer.path / "tokenizer.json"))
    tok.encode_special_tokens = True
    splits = pd.read_parquet(env.tokenizer.path / "splits.parquet").merge(env.kept[["doc_id", "text"]], on="doc_id")
    counts = {}
    for (source, split), docs in splits.groupby(["source", "split"]):
        ids = tok.encode_batch(docs["text"].tolist(), add_special_tokens=False)
        counts[(source, split)] = sum(len(e.ids) + 1 for e in ids)
    return counts


def test_tokens_per_source_equal_a_direct_count(published):
    direct = _direct_tokens(published)
    joined = published.warehouse.query(MANIFEST_QUERY).set_index("source")
    assert sorted(joined.index) == sorted(SOURCES)
    for source in SOURCES:
        train, heldout = direct[(source, "train")], direct.get((source, "heldout"), 0)
        assert (joined.loc[source, "train_tokens"], joined.loc[source, "heldout_tokens"]) == (train, heldout)
        assert joined.loc[source, "tokens"] == train + heldout
    manifest = published.warehouse.query("SELECT source, tokens FROM manifest").set_index("source")["tokens"]
    assert manifest.to_dict() == joined["tokens"].to_dict()  # the manifest's own column, filled by the tokenizer


def test_the_per_source_suite_catches_a_miscount(published):
    path = published.tokenizer.path
    sources, headers = pd.read_parquet(path / "sources.parquet"), pd.read_parquet(path / "shards.parquet")
    check_source_tokens(sources, headers)
    with pytest.raises(DataError, match="tokenizer_sources"):
        check_source_tokens(sources.assign(train_tokens=sources["train_tokens"] + 1), headers)


@pytest.mark.parametrize("table", ["heldout_loss", "cloze_results", "gate_decisions", "decay_branches",
                                   "tokenizer_sources"])
def test_published_rows_carry_the_corpus_manifest_hash(published, table):
    corpus_hash = published.warehouse.query("SELECT DISTINCT manifest_hash FROM manifest")["manifest_hash"].tolist()
    assert corpus_hash == [published.manifest_hash]
    rows = published.warehouse.query(f"SELECT * FROM {table}")
    check_manifest_hash(rows, table, expected=published.manifest_hash)
    if table == "heldout_loss":
        assert set(rows["stage"]) == {"main", "cpt"}
        check_heldout(rows)
        with pytest.raises(DataError, match="heldout_loss"):
            check_heldout(rows.assign(manifest_hash="not-a-hash"))


def test_each_corpus_source_is_its_own_mlflow_dataset_input(published):
    inputs = published.tracker.client.get_run(published.runs["corpus"]).inputs.dataset_inputs
    by_name = {d.dataset.name: d.dataset for d in inputs}
    assert sorted(by_name) == sorted(f"corpus/{s}" for s in SOURCES)
    for source, (_, role, n_docs) in SOURCES.items():
        docs = published.kept[published.kept["source"] == source]
        xor = functools.reduce(operator.xor, [int.from_bytes(hashlib.md5(f"{d}\0{t}".encode()).digest(), "little")
                                              for d, t in zip(docs["doc_id"], docs["text"])])
        dataset = by_name[f"corpus/{source}"]
        assert dataset.digest == f"{xor:032x}"
        profile = json.loads(dataset.profile)
        assert (profile["docs"], profile["chars"], profile["role"]) == (n_docs, int(docs["n_chars"].sum()), role)
    tokens = published.tracker.client.get_run(published.runs["tokenizer"]).inputs.dataset_inputs
    profiles = {d.dataset.name: json.loads(d.dataset.profile) for d in tokens}
    direct = _direct_tokens(published)
    assert sorted(profiles) == sorted(f"token_shards/{s}" for s in SOURCES)
    assert all(profiles[f"token_shards/{s}"]["train_tokens"] == direct[(s, "train")] for s in SOURCES)
