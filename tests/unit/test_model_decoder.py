"""The built Decoder against the closed-form counts, causality, init and initial loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from models.arithmetic import param_count
from models.config import ModelConfig
from infra.errors import DataError
from models.decoder import Decoder, apply_rope
from tasks.train.config import OptimConfig
from tasks.train.optim import build_optimizer


def tiny(**kw):
    base = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=160, vocab_size=512, seq_len=32)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("cfg", [
    tiny(),
    tiny(tied_embeddings=False),
    tiny(n_kv_heads=1, n_layers=3),
    tiny(n_kv_heads=4, qk_norm=True),
    ModelConfig(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, d_ff=688, vocab_size=4096, seq_len=256),
])
def test_module_count_equals_formula(cfg):
    model = Decoder(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg).total


def test_optimizer_groups_match_lab2_split():
    cfg = ModelConfig(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, d_ff=688, vocab_size=4096, seq_len=256)
    groups = build_optimizer(Decoder(cfg), OptimConfig(peak_lr=3e-3, warmup_steps=30)).param_groups
    sizes = {g["weight_decay"]: sum(p.numel() for p in g["params"]) for g in groups}
    assert sizes == {0.1: 5_791_744, 0.0: 3_328}


@pytest.mark.parametrize("cfg", [tiny(), tiny(qk_norm=True, tied_embeddings=False)])
def test_causal(cfg):
    torch.manual_seed(0)
    model = Decoder(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    t = 10
    changed = idx.clone()
    changed[:, t + 1:] = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len - t - 1))
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, cfg.seq_len, cfg.vocab_size)
    torch.testing.assert_close(a[:, :t + 1], b[:, :t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_init_stds():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=8, d_model=256, n_heads=4, n_kv_heads=4, d_ff=512, vocab_size=2048, seq_len=16)
    model = Decoder(cfg)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.blocks[0].ffn.w_up.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.blocks[3].attn.wo.weight.std().item() == pytest.approx(0.02 / 4, rel=0.03)  # 0.02/√(2·8)
    assert model.blocks[3].ffn.w_down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.03)


def test_initial_loss_is_log_vocab():
    # docs/methods.md §10 (TinyStories small-decoder run): initial loss 8.3274 vs ln V 8.3178; a small-init model predicts almost uniformly.
    torch.manual_seed(0)
    cfg = tiny(vocab_size=4096)
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1))
    with torch.no_grad():
        logits = Decoder(cfg)(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).item()
    assert loss == pytest.approx(math.log(4096), abs=0.05)


def test_gqa_matches_repeated_kv_reference():
    """SDPA with grouped KV equals explicit attention with each KV head repeated for its query group."""
    torch.manual_seed(0)
    cfg = tiny(n_heads=4, n_kv_heads=2)
    model = Decoder(cfg)
    attn, cos, sin = model.blocks[0].attn, model.rope_cos[:8], model.rope_sin[:8]
    x = torch.randn(2, 8, cfg.d_model)
    q = apply_rope(attn.wq(x).view(2, 8, 4, 16), cos, sin).transpose(1, 2)
    k = apply_rope(attn.wk(x).view(2, 8, 2, 16), cos, sin).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attn.wv(x).view(2, 8, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) / 4.0 + torch.full((8, 8), float("-inf")).triu(1)
    ref = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 64))
    torch.testing.assert_close(attn(x, cos, sin), ref, atol=1e-5, rtol=1e-4)


def test_document_mask_blocks_attention_across_documents():
    torch.manual_seed(0)
    model = Decoder(tiny()).eval()
    idx = torch.randint(1, 512, (1, 12))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7])
    edited = idx.clone()
    edited[0, :5] = torch.randint(1, 512, (5,))  # a different first document
    with torch.no_grad():
        masked, masked_edit = model(idx, doc_ids), model(edited, doc_ids)
        plain, plain_edit = model(idx), model(edited)
        alone = model(idx[:, 5:])  # the second document on its own, from position 0
    # Masked: the second document cannot see the first, so editing the first changes nothing there...
    torch.testing.assert_close(masked[0, 5:], masked_edit[0, 5:])
    # ...and (RoPE scores depend only on relative position) it equals the document run alone.
    torch.testing.assert_close(masked[0, 5:], alone[0], atol=1e-4, rtol=1e-4)
    # Unmasked, the first document leaks into the second.
    assert not torch.allclose(plain[0, 5:], plain_edit[0, 5:])


def test_document_ids_must_match_input_shape():
    with pytest.raises(DataError, match="doc_ids"):
        Decoder(tiny())(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 7, dtype=torch.long))
