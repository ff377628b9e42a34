"""Tiny random Hugging Face decoders saved by ``transformers`` itself, and the comparison of one with the decoder
imported from it: the family tests' shared helpers."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from models.arithmetic import param_count
from models.decoder import Decoder
from models.hf import LOGIT_TOLERANCE, decoder_from_hf, probe_ids, to_hf_model, verify

EOS, PAD = 0, 1


def saved_random(model_cls, config, folder: Path):
    """A seeded random ``model_cls(config)`` with non-zero biases and norm gains in [0.5, 1.5] (random init may zero
    the one and set the other to 1, hiding a missing term), saved into ``folder`` and loaded back in fp32."""
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p))
            elif p.ndim == 1:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def compare(ours: Decoder, theirs, prompts: list[list[int]], probe_len: int = 16):
    """``models.hf.verify`` on a probe batch of ``probe_len`` tokens and 8 greedy tokens after each prompt."""
    return verify(ours, theirs, probe_ids(ours.cfg.vocab_size, ours.cfg.seq_len, length=probe_len),
                  prompts=prompts, max_new_tokens=8, eos_id=EOS, pad_id=PAD)


def check_against(ours: Decoder, theirs, label: str, prompts: list[list[int]], probe_len: int = 16) -> float:
    """Assert logits within ``LOGIT_TOLERANCE`` and equal greedy continuations (:func:`compare`); returns the
    largest logit difference."""
    result = compare(ours, theirs, prompts, probe_len)
    print(f"{label}: max |logit diff| = {result.max_abs_logit_diff:.3g}; greedy equal = {result.greedy_equal}")
    assert result.max_abs_logit_diff <= LOGIT_TOLERANCE, result.describe()
    assert result.greedy_equal, result.describe()
    assert any(len(c) > 1 for c in result.ours)  # the continuations really were compared
    return result.max_abs_logit_diff


def import_export_round_trip(model_cls, config, expected: dict, folder: Path, label: str,
                             prompts: list[list[int]], probe_len: int = 16) -> tuple[Decoder, tuple]:
    """A random ``model_cls(config)`` imported (its config fields as ``expected``, as many parameters, the same
    logits and greedy continuations), exported back into the same class and family, and that export loaded by
    transformers and imported again to the same config. Returns (ours, (the saved base, the reloaded export)) as
    transformers loaded them."""
    theirs = saved_random(model_cls, config, folder / "base")
    assert type(theirs) is model_cls
    ours = decoder_from_hf(folder / "base")
    for field, value in expected.items():
        assert getattr(ours.cfg, field) == value, field
    n_params = sum(p.numel() for p in ours.parameters())
    assert n_params == param_count(ours.cfg).total == sum(p.numel() for p in theirs.parameters())
    check_against(ours, theirs, f"import {label}", prompts, probe_len)
    exported = to_hf_model(ours, bos_id=None, eos_id=EOS, pad_id=PAD)
    assert type(exported) is model_cls and exported.config.model_type == theirs.config.model_type
    exported.save_pretrained(folder / "export")
    back = AutoModelForCausalLM.from_pretrained(folder / "export", dtype=torch.float32).eval()
    assert type(back) is model_cls
    check_against(ours, back, f"export {label}", prompts, probe_len)
    assert decoder_from_hf(folder / "export").cfg == ours.cfg
    return ours, (theirs, back)
