"""Text samples at the evaluation points: they leave training byte-for-byte unchanged, survive a resume, reach the
stage summary and report and an MLflow table, and change no cache key."""

import json
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from rich.console import Console

from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.stage import StageContext, SummaryContext
from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import train
from tasks.train.samples import PeriodicSamples, SampleConfig
from tasks.train.sections import MainConfig, ModelShape, RunBudget
from tasks.train.shards import write_shard

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Debian is a free operating system. 软件包 管理 apt-get install python3.",
         "To install a package, run apt-get install 软件包 名称."] * 30


@pytest.fixture(scope="module")
def tokenizer():
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer

    return fit_tokenizer(TEXTS, TokenizerConfig(vocab_size=300))


def _train(samples: PeriodicSamples | None, steps: int = 6):
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=320, seq_len=16)
    torch.manual_seed(0)
    tokens = np.random.default_rng(0).integers(1, 300, 3_000).astype(np.uint16)
    sampler = MixtureSampler({"a": tokens}, {"a": 1.0}, seq_len=16, batch_size=4, seed=0)
    model = Decoder(cfg)
    result = train(model, sampler, OptimConfig(peak_lr=3e-3, warmup_steps=1), total_steps=steps, eval_every=3,
                   callbacks=[samples] if samples else [], seed=0)
    return model, [m["loss_nats"] for m in result.metrics]


def test_sampling_at_the_evaluation_points_leaves_training_byte_for_byte_unchanged(tokenizer):
    hot = SampleConfig(prompts=["Debian is", "软件包"], max_new_tokens=5, temperature=1.5, top_p=0.9, seed=3)
    samples = PeriodicSamples(hot, tokenizer, eos_id=0, run="main")
    with_samples, losses_with = _train(samples)
    without, losses_without = _train(None)
    assert losses_with == losses_without
    for (name, a), b in zip(with_samples.state_dict().items(), without.state_dict().values()):
        assert torch.equal(a, b), name
    frame = samples.frame()
    assert frame["step"].tolist() == [0, 0, 3, 3, 6, 6]
    assert frame["prompt"].tolist()[:2] == ["Debian is", "软件包"]
    assert (frame["new_tokens"] <= 5).all() and set(frame["decoding"]) == {"τ=1.5 top_p=0.9 seed=3"}


def test_the_section_is_checked():
    with pytest.raises(ConfigError, match="empty"):
        SampleConfig(prompts=["ok", "  "])
    with pytest.raises(ConfigError, match="top_p"):
        SampleConfig(prompts=["ok"], top_p=0.0)


def test_samples_change_no_cache_key(tmp_path, monkeypatch):
    from flows.config import parse_config
    from flows.status import stage_statuses

    monkeypatch.chdir(ROOT)
    raw = tomllib.loads((ROOT / "configs/smoke.toml").read_text())
    assert raw["samples"]["prompts"]
    keys = lambda r: {s.stage: s.key for s in stage_statuses(parse_config(r), RunsLayout(tmp_path))}  # noqa: E731
    base = keys(raw)
    raw["samples"] = {"prompts": ["something else"], "max_new_tokens": 3, "temperature": 0.7, "seed": 9}
    assert keys(raw) == base


@pytest.fixture
def inputs(tmp_path, tokenizer) -> dict[str, Path]:
    """A tokenizer artifact with a real tokenizer.json (ids in its vocabulary) and a mixture choice."""
    from tasks.train.pretrained_tokenizer import tokenizer_hash

    folder, mixture = tmp_path / "tokenizer", tmp_path / "mixture"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    digest, rng, rows = tokenizer_hash(tokenizer), np.random.default_rng(0), []
    for split, n_tokens in (("train", 600), ("heldout", 80)):
        write_shard(folder / "shards" / "a" / split, rng.integers(1, 300, n_tokens), vocab_size=320, eos_id=0,
                    tokenizer_hash=digest, n_bytes=4 * n_tokens, doc_offsets=np.array([0]))
        rows.append({"source": "a", "split": split, "n_tokens": n_tokens, "n_bytes": 4 * n_tokens})
    pd.DataFrame(rows).to_parquet(folder / "shards.parquet", index=False)
    (folder / "tokenizer.meta.json").write_text(json.dumps({"tokenizer_hash": digest, "padded_vocab_size": 320,
                                                            "eos_id": 0}))
    mixture.mkdir()
    (mixture / "choice.json").write_text(json.dumps({"name": "natural", "weights": {"a": 1.0}}))
    return {"tokenizer": folder, "mixture": mixture}


MAIN = MainConfig(model=ModelShape(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, seq_len=16),
                  budget=RunBudget(steps=6, batch_size=2, warmup_steps=1, eval_every=2, eval_tokens=32),
                  peak_lr=1e-3, log_every=1, checkpoint_every=2)
PROMPTS = SampleConfig(prompts=["Debian is a [free] system", "软件包"], max_new_tokens=4)


def _context(tmp_path: Path, inputs, attempt: str, log_metrics=lambda metrics, step: None) -> StageContext:
    out = tmp_path / "runs" / "artifacts" / "main" / f".tmp-{attempt}"
    out.mkdir(parents=True)
    return StageContext(out=out, inputs=inputs, layout=RunsLayout(tmp_path / "runs"), key="k1", experiment="t",
                        torch_threads=1, log_metrics=log_metrics)


def test_a_resumed_main_run_keeps_the_samples_of_the_evaluation_points_before_it(tmp_path, inputs):
    from tasks.main.stage import run

    def interrupt_at_step_5(metrics, step):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(_context(tmp_path, inputs, "first", interrupt_at_step_5), MAIN, sources=["a"], samples=PROMPTS)
    run(_context(tmp_path, inputs, "second"), MAIN, sources=["a"], samples=PROMPTS)
    resumed = pd.read_parquet(tmp_path / "runs/artifacts/main/.tmp-second/samples.parquet")
    run(_context(tmp_path / "fresh", inputs, "only"), MAIN, sources=["a"], samples=PROMPTS)
    fresh = pd.read_parquet(tmp_path / "fresh/runs/artifacts/main/.tmp-only/samples.parquet")
    assert resumed["step"].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    pd.testing.assert_frame_equal(resumed, fresh)  # a resume reproduces the weights, so the samples too


def test_the_summary_report_and_mlflow_show_the_samples(tmp_path, inputs):
    from types import SimpleNamespace

    from flows.report import to_markdown
    from infra.artifacts import Artifact
    from infra.report_blocks import TableBlock
    from infra.stage import PublishContext, ReportContext
    from infra.tracking import Tracker
    from tasks.main.publish import publish
    from tasks.main.stage import run
    from tasks.main.views import report, summary

    run(_context(tmp_path, inputs, "only"), MAIN, sources=["a"], samples=PROMPTS)
    path = tmp_path / "runs/artifacts/main/.tmp-only"
    (path / "meta.json").write_text("{}")
    frame = pd.read_parquet(path / "samples.parquet")
    final = frame[frame["step"] == 6]["completion"].map(lambda c: c.replace("\n", "↵")).tolist()

    console = Console(record=True, width=250)
    for item in summary(SummaryContext(path=path, paths={"main": path}, layout=RunsLayout(tmp_path / "runs"))):
        console.print(item)
    shown = console.export_text()
    assert "Main run samples at step 6 (greedy)" in shown
    assert "Debian is a [free] system" in shown  # printed as text, never read as markup
    assert all(c.strip()[:10] in shown for c in final)

    layout = RunsLayout(tmp_path / "runs")
    blocks = report(ReportContext(path=path, paths={"main": path}, layout=layout, warehouse=None,
                                  plots_dir=tmp_path, history=pd.DataFrame()))
    table = next(b for b in blocks if isinstance(b, TableBlock) and b.title.startswith("Samples"))
    assert table.frame["step"].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    markdown = to_markdown(SimpleNamespace(experiment="t", blocks=[table]), str)
    assert "Debian is a \\[free] system" in markdown  # Markdown's escape: renders as "[free]"

    artifact = Artifact("main", "k1", path, {"mlflow_run_id": "r"})
    published = publish(PublishContext(artifact, {}, SimpleNamespace(mixture=SimpleNamespace(max_epochs=4.0)), False))
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts", "t")
    run_id = tracker.start_run("main")
    for name, table_frame in published.mlflow_tables.items():
        tracker.log_table(run_id, table_frame, name)
    # (MlflowClient.load_table searches the fluent API's default store, not this client's: read the file itself)
    logged = pd.read_json(tracker.client.download_artifacts(run_id, "samples.json", str(tmp_path)), orient="split")
    assert logged["completion"].tolist() == frame["completion"].tolist()
    tags = json.loads(tracker.client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "samples.json", "type": "table"} in tags
