"""Generation: the KV cache reproduces the full forward, the sampler's greedy/top-k/top-p/seeds behave as stated,
streamed text never splits a character, and greedy output matches transformers' on the exported model."""

import json
import subprocess

import numpy as np
import pytest
import torch

from infra.errors import ConfigError, DataError
from models.config import ModelConfig
from models.decoder import Decoder, KVCache
from models.generate import Sampling, complete, generate, next_token_probs, nucleus_mask, stream_tokens, top_k_mask

BASE = dict(n_layers=2, d_model=32, d_ff=64, vocab_size=97, seq_len=24, init_std=0.2, tied_embeddings=False)
SHAPES = {
    "mha": ModelConfig(n_heads=4, n_kv_heads=4, **BASE),
    "gqa": ModelConfig(n_heads=4, n_kv_heads=2, **BASE),
    "qk_norm": ModelConfig(n_heads=4, n_kv_heads=1, qk_norm=True, **BASE),
}


def _model(cfg: ModelConfig, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(cfg)
    with torch.no_grad():  # non-trivial norm gains, so QK-norm and the final norm matter
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize("shape", SHAPES)
def test_cached_logits_equal_the_uncached_full_sequence_at_every_step(shape):
    cfg = SHAPES[shape]
    model = _model(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)  # (2, T, V)
        cache = KVCache(cfg)
        # prefill 7, then one token at a time, then a chunk of 3 (a shifted causal mask), then one at a time
        bounds = [0, 7, *range(8, 15), 18, *range(19, cfg.seq_len + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            step = model(ids[:, lo:hi], cache=cache)
            assert cache.length == hi
            assert (step - full[:, lo:hi]).abs().max().item() <= 1e-5, (lo, hi)
    assert full.abs().max() > 1.0  # logits are far from uniform: the comparison has something to compare


def test_the_cache_refuses_positions_beyond_the_rope_tables_and_document_masks():
    cfg = SHAPES["gqa"]
    model = _model(cfg)
    cache = KVCache(cfg)
    with torch.no_grad():
        model(torch.zeros(1, cfg.seq_len - 1, dtype=torch.long), cache=cache)
        with pytest.raises(DataError, match="crop the context from the left"):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
        with pytest.raises(DataError, match="doc_ids"):
            model(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), cache=KVCache(cfg))
    with pytest.raises(DataError, match="1..model.seq_len"):
        KVCache(cfg, max_len=cfg.seq_len + 1)


def _greedy_without_cache(model: Decoder, prompt: list[int], steps: int) -> list[int]:
    """The textbook loop: the whole (left-cropped) context through the model at every step, argmax."""
    context, out = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            window = torch.tensor([context[-model.cfg.seq_len:]])
            token = int(model(window)[0, -1].argmax())
            out.append(token)
            context.append(token)
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_with_the_cache_equals_the_uncached_loop_also_past_seq_len(shape):
    model = _model(SHAPES[shape], seed=3)
    prompt = [5, 17, 3, 88, 41, 9, 60]
    # 7 + 30 tokens: the context outgrows seq_len = 24, so the window slides for the last steps
    done = generate(model, prompt, Sampling(max_new_tokens=30))
    assert done.tokens == _greedy_without_cache(model, prompt, 30)
    assert done.stop_reason == "length" and done.cropped == 0
    long_prompt = list(np.random.default_rng(0).integers(0, 97, 40))
    cropped = generate(model, long_prompt, Sampling(max_new_tokens=5))
    assert cropped.cropped == 16 and cropped.prompt_tokens == 24
    assert cropped.tokens == generate(model, long_prompt[-24:], Sampling(max_new_tokens=5)).tokens
    assert cropped.tokens == _greedy_without_cache(model, long_prompt, 5)


def test_generation_stops_at_eos_without_returning_it():
    model = _model(SHAPES["mha"])
    free = generate(model, [1, 2, 3], Sampling(max_new_tokens=12)).tokens
    eos = free[4]
    first = free.index(eos)
    done = generate(model, [1, 2, 3], Sampling(max_new_tokens=12), eos_id=eos)
    assert done.tokens == free[:first] and done.stop_reason == "eos"


def test_seeds_reproduce_draws_differ_between_seeds_and_the_global_rng_is_untouched():
    model = _model(SHAPES["gqa"])
    hot = Sampling(max_new_tokens=20, temperature=2.0, seed=7)
    state = torch.get_rng_state()
    a = generate(model, [4, 5, 6], hot).tokens
    assert torch.equal(torch.get_rng_state(), state)  # training's generator is never drawn from
    assert generate(model, [4, 5, 6], hot).tokens == a
    assert generate(model, [4, 5, 6], hot.model_copy(update={"seed": 8})).tokens != a
    assert a != generate(model, [4, 5, 6], Sampling(max_new_tokens=20)).tokens  # sampled, not greedy


def test_top_k_of_one_is_greedy():
    model = _model(SHAPES["qk_norm"])
    greedy = generate(model, [9, 8, 7], Sampling(max_new_tokens=15)).tokens
    for seed in (0, 1):
        sampled = generate(model, [9, 8, 7], Sampling(max_new_tokens=15, temperature=1.5, top_k=1, seed=seed))
        assert sampled.tokens == greedy


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([0.1, 2.0, -1.0, 3.0, 0.5])
    assert top_k_mask(logits, 2).tolist() == [False, True, False, True, False]
    assert top_k_mask(logits, 0).all() and top_k_mask(logits, 9).all()


def test_top_p_keeps_the_smallest_most_probable_set_whose_mass_reaches_p():
    probs = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1], dtype=torch.float64)
    kept = lambda p: [i for i, k in enumerate(nucleus_mask(probs, p).tolist()) if k]  # noqa: E731
    assert kept(0.3) == [1]              # 0.4 ≥ 0.3 already
    assert kept(0.4) == [1]              # mass exactly p is enough
    assert kept(0.41) == [1, 2]          # 0.65
    assert kept(0.7) == [1, 2, 3]        # 0.85
    assert kept(0.9) == [1, 2, 3, 4]     # 0.95
    assert kept(0.99) == [0, 1, 2, 3, 4]
    assert kept(1.0) == [0, 1, 2, 3, 4]
    # The sampling distribution renormalises the nucleus (τ = 1: softmax(log p) = p).
    dist = next_token_probs(probs.log(), Sampling(temperature=1.0, top_p=0.7))
    assert dist.tolist() == pytest.approx([0, 0.4 / 0.85, 0.25 / 0.85, 0.2 / 0.85, 0])
    draws = torch.multinomial(dist, 20_000, replacement=True, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5) / 20_000
    assert counts[0] == 0 and counts[4] == 0
    assert counts.tolist() == pytest.approx(dist.tolist(), abs=0.02)


def test_padding_rows_of_the_vocabulary_are_never_generated():
    model = _model(SHAPES["mha"])
    with torch.no_grad():
        model.lm_head.weight[90:] *= 50  # the padding rows would win every argmax
    assert all(t >= 90 for t in generate(model, [1, 2], Sampling(max_new_tokens=5)).tokens)
    limited = generate(model, [1, 2], Sampling(max_new_tokens=8, temperature=1.0), n_vocab=90).tokens
    assert limited and max(limited) < 90


def test_stream_yields_the_tokens_generate_returns_and_restores_the_mode():
    model = _model(SHAPES["gqa"]).train()
    settings = Sampling(max_new_tokens=10, temperature=0.9, top_p=0.9, seed=3)
    seen = []
    done = generate(model, [3, 1, 4], settings, on_token=seen.append)
    stream = stream_tokens(model, [3, 1, 4], settings)
    assert list(stream) == done.tokens == seen and stream.stop_reason == "length"
    assert model.training


def test_bad_settings_and_prompts_are_refused():
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"max_new_tokens": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Sampling(**bad)
    model = _model(SHAPES["mha"])
    with pytest.raises(DataError, match="empty prompt"):
        generate(model, [], Sampling())
    with pytest.raises(DataError, match="0..96"):
        stream_tokens(model, [97], Sampling())


@pytest.fixture(scope="module")
def tokenizer():
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer

    texts = ["Debian 软件包 管理 apt-get install", "中文 文档 软件 系统 包", "the package manager installs software"] * 40
    return fit_tokenizer(texts, TokenizerConfig(vocab_size=300))


def test_streamed_text_never_splits_a_character_and_joins_to_the_completion(tokenizer):
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=320, seq_len=64)
    model = _model(cfg)
    # Steer the head towards single bytes of multi-byte characters: ids of byte tokens, not whole characters.
    byte_ids = [i for i in range(tokenizer.get_vocab_size()) if "\ufffd" in tokenizer.decode([i])]
    with torch.no_grad():
        model.tok_embeddings.weight[byte_ids] *= 30
    chunks = []
    done = complete(model, tokenizer, "中文", Sampling(max_new_tokens=30, temperature=1.0, seed=1), eos_id=0,
                    on_text=chunks.append)
    assert "".join(chunks) == done.text
    assert all("\ufffd" not in c for c in chunks[:-1])
    assert done.text == tokenizer.decode(done.tokens, skip_special_tokens=False)
    assert set(done.tokens) & set(byte_ids), "no token is a partial character: the test exercises nothing"


def test_greedy_equals_transformers_greedy_on_the_exported_model():
    hf = pytest.importorskip("models.hf", reason="models.hf (the export) is not in this tree yet")
    for shape, cfg in SHAPES.items():
        model = _model(cfg, seed=5)
        prompt = [7, 3, 55, 12, 80]
        ours = generate(model, prompt, Sampling(max_new_tokens=12)).tokens
        exported = hf.to_hf_model(model, bos_id=None, eos_id=96, pad_id=None)
        out = exported.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                do_sample=False, max_new_tokens=12, min_new_tokens=12, eos_token_id=None,
                                pad_token_id=0)
        assert out[0, len(prompt):].tolist() == ours, shape


# ---------------------------------------------------------------- `pretrain generate` on a checkpoint trained here

CORPUS = ["Debian is a free operating system. It uses the Linux kernel and the apt package manager.",
          "To install a package, run apt-get install followed by the name of the package.",
          "软件包 是 Debian 系统 的 基本 单位。使用 apt 安装 软件包。"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A runs folder with a tokenizer artifact and a main checkpoint: 2 layers, d_model 64, trained for 150 AdamW
    steps (peak LR 1e-2, 8 rows of 48 tokens) on the three sentences of CORPUS repeated, so greedy continuations
    recite them."""
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer
    from tasks.train.checkpoint import Checkpointer
    from tasks.train.config import OptimConfig
    from tasks.train.data import MixtureSampler
    from tasks.train.loop import train
    from tasks.train.pretrained_tokenizer import tokenizer_hash
    from tasks.train.shards import encode_documents

    runs = tmp_path_factory.mktemp("runs")
    tok = fit_tokenizer(CORPUS * 20, TokenizerConfig(vocab_size=300))
    folder = runs / "artifacts" / "tokenizer" / "tk"
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    digest = tokenizer_hash(tok)
    (folder / "tokenizer.meta.json").write_text(json.dumps({"tokenizer_hash": digest, "eos_id": 0,
                                                            "padded_vocab_size": 320}))
    tokens, _ = encode_documents(tok, CORPUS * 40)
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=320, seq_len=48)
    torch.manual_seed(0)
    model = Decoder(cfg)
    sampler = MixtureSampler({"docs": tokens}, {"docs": 1.0}, seq_len=48, batch_size=8, seed=0)
    result = train(model, sampler, OptimConfig(peak_lr=1e-2, warmup_steps=10), total_steps=150, seed=0)
    checkpoint = runs / "artifacts" / "main" / "mk" / "checkpoint"
    Checkpointer(checkpoint.parent, extra={"tokenizer_hash": digest}).save(
        checkpoint, model=model, optimizer=result.optimizer, state=result.state, sampler_state=sampler.state_dict())
    return {"runs": runs, "checkpoint": checkpoint, "tokenizer": folder, "model": model.eval(), "tok": tok,
            "final_loss": result.metrics[-1]["loss_nats"]}


def _pretrain(*args: str, cwd) -> subprocess.CompletedProcess:
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("pretrain")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"})


def test_pretrain_generate_streams_the_greedy_continuations_of_the_checkpoint(trained, tmp_path):
    assert trained["final_loss"] < 1.0  # it has learned the sentences
    prompts = ["Debian is", "To install a package,", "软件包"]
    done = _pretrain("generate", str(trained["checkpoint"]), *[x for p in prompts for x in ("--prompt", p)],
                     "--max-new-tokens", "24", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = [p + complete(trained["model"], trained["tok"], p, Sampling(max_new_tokens=24), eos_id=0).text
                for p in prompts]
    assert done.stdout == "\n".join(f"{line}\n" for line in expected)
    print("\n" + done.stdout)  # the report's samples (pytest -s)
    assert "free operating system" in expected[0]  # the memorised sentence, through the KV-cached sampler
    assert "tokenizer " + str(trained["tokenizer"]) in done.stderr.replace("\n", "")  # found from the checkpoint
    assert done.stderr.count("new tokens, stopped at") == 3


def test_pretrain_generate_samples_reproducibly_from_a_prompts_file(trained, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    (tmp_path / "prompts.txt").write_text("Debian is\n\n软件包 是\n", encoding="utf-8")
    args = ["generate", str(trained["checkpoint"]), "--prompts-file", str(tmp_path / "prompts.txt"),
            "--max-new-tokens", "10", "--temperature", "1.2", "--top-p", "0.9", "--top-k", "20", "--seed", "4"]
    first, again = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    sampling = Sampling(max_new_tokens=10, temperature=1.2, top_p=0.9, top_k=20, seed=4)
    for prompt in ("Debian is", "软件包 是"):
        text = complete(trained["model"], trained["tok"], prompt, sampling, eos_id=0).text
        assert prompt + text in first.stdout
    assert first.stdout == again.stdout


def test_pretrain_generate_without_a_known_tokenizer_asks_for_one_and_refuses_a_wrong_one(trained, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.tokenizer.config import TokenizerConfig
    from tasks.tokenizer.fit import fit_tokenizer

    elsewhere = tmp_path / "copied"
    shutil.copytree(trained["checkpoint"], elsewhere)
    lost = CliRunner().invoke(app, ["generate", str(elsewhere), "--prompt", "Debian", "--runs-dir",
                                    str(tmp_path / "empty")])
    assert lost.exit_code == 2 and "pass --tokenizer DIR" in lost.output.replace("\n", "")
    given = CliRunner().invoke(app, ["generate", str(elsewhere), "--prompt", "Debian is", "--max-new-tokens", "4",
                                     "--tokenizer", str(trained["tokenizer"])])
    assert given.exit_code == 0 and given.stdout.startswith("Debian is")
    other = tmp_path / "other"
    other.mkdir()
    fit_tokenizer(["something else entirely"] * 30, TokenizerConfig(vocab_size=280)).save(str(other / "tokenizer.json"))
    wrong = CliRunner().invoke(app, ["generate", str(elsewhere), "--prompt", "x", "--tokenizer", str(other)])
    assert wrong.exit_code == 2 and "was trained with" in wrong.output.replace("\n", "")
    none = CliRunner().invoke(app, ["generate", str(elsewhere), "--tokenizer", str(trained["tokenizer"])])
    assert none.exit_code == 2 and "no prompt" in none.output
