"""A released tokenizer adopted by the tokenizer stage (``[tokenizer] pretrained``): its EOS from its config files,
its vocabulary (uint32 shards above 65,536 ids), its hash in the shards, its files' content in the stage key, and
clear errors for a missing path or a tokenizer without an EOS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from flows.config import load_config
from infra.errors import ConfigError
from infra.runs import RunsLayout
from infra.stage import StageContext
from tasks.tokenizer.config import TokenizerConfig
from tasks.tokenizer.definition import key_pretrained
from tasks.tokenizer.fit import padded_vocab_size, tokenizer_hash
from tasks.train.pretrained_tokenizer import files_digest, read_pretrained
from tasks.train.shards import encode_documents, read_shard, vocab_span, write_shard

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["the quick brown fox jumps over the lazy dog", "subprocess and asyncio are python modules",
         "你好，世界。Debian 是一个自由的操作系统。"] * 20


def _bpe(specials=("<unk>", "<s>", "</s>"), vocab_size=400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return tok


def _folder(path: Path, tok: Tokenizer, config: dict | None, special_map: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map is not None:
        (path / "special_tokens_map.json").write_text(json.dumps(special_map))
    return path


@pytest.fixture(scope="module")
def bpe():
    return _bpe()


def test_eos_comes_from_tokenizer_config(bpe, tmp_path):
    folder = _folder(tmp_path / "tok", bpe, {"eos_token": "</s>", "bos_token": "<s>"})
    got = read_pretrained(folder)
    assert (got.eos_token, got.eos_id, got.pad_id) == ("</s>", 2, 2)  # no pad_token: padding inputs are EOS
    assert got.vocab_size == bpe.get_vocab_size() == vocab_span(bpe)
    assert got.tokenizer_hash == tokenizer_hash(bpe)


def test_eos_as_an_added_token_dict_and_a_pad_token(bpe, tmp_path):
    folder = _folder(tmp_path / "tok", bpe, {"pad_token": {"content": "<unk>", "__type": "AddedToken"}},
                     {"eos_token": {"content": "<s>", "lstrip": False}})
    got = read_pretrained(folder)
    assert (got.eos_token, got.eos_id, got.pad_id) == ("<s>", 1, 0)


def test_a_bare_file_uses_a_conventional_eos(tmp_path):
    tok = _bpe(specials=("<|endoftext|>", "<|im_end|>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    got = read_pretrained(tmp_path / "tokenizer.json")
    assert (got.eos_token, got.eos_id) == ("<|endoftext|>", 0)
    assert files_digest(tmp_path / "tokenizer.json").keys() == {"tokenizer.json"}


def test_no_eos_is_refused(tmp_path):
    folder = _folder(tmp_path / "tok", _bpe(specials=("<unk>",)), {"bos_token": "<unk>"})
    with pytest.raises(ConfigError, match="cannot determine the EOS"):
        read_pretrained(folder)
    folder = _folder(tmp_path / "named", _bpe(specials=("<unk>",)), {"eos_token": "<|eot|>"})
    with pytest.raises(ConfigError, match="'<|eot|>' is not in the tokenizer's vocabulary"):
        read_pretrained(folder)


def test_missing_path_is_a_config_error_naming_the_field(tmp_path):
    text = (ROOT / "configs" / "smoke.toml").read_text()
    for path, message in ((tmp_path / "absent", "does not exist"), (tmp_path, "has no tokenizer.json")):
        config = tmp_path / "c.toml"
        config.write_text(text.replace("[tokenizer]\n", f'[tokenizer]\npretrained = "{path}"\n', 1))
        with pytest.raises(ConfigError, match=f"tokenizer.pretrained: .*{message}"):
            load_config(config)


def test_a_hub_id_is_named_as_one_with_the_command_that_downloads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths are read from the working directory: nothing is there
    with pytest.raises(ConfigError, match=r"meta-llama/Llama-3\.2-1B does not exist .*looks like a Hugging Face Hub "
                       r"id: download it into a folder first, e\.g\. `\.venv/bin/hf download meta-llama/Llama-3\.2-1B "
                       r"--include '\*\.json' --local-dir hf-models/Llama-3\.2-1B`, and give that folder"):
        read_pretrained("meta-llama/Llama-3.2-1B")
    with pytest.raises(ConfigError, match="does not exist") as err:
        read_pretrained("no/such/tokenizer")  # not an id: owner/name has one slash
    assert "Hub" not in str(err.value)


def test_more_than_65536_ids_are_stored_as_uint32(tmp_path):
    vocab = {"</s>": 0, **{f"w{i}": i + 1 for i in range(70_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens, offsets = encode_documents(tok, ["w1 w69999", "w0"], eos_id=0)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [2, 70_000, 0, 1, 0] and offsets.tolist() == [0, 3]
    write_shard(tmp_path / "s", tokens, vocab_size=padded_vocab_size(tok, 128), eos_id=0, tokenizer_hash="h",
                n_bytes=11, doc_offsets=offsets)
    shard = read_shard(tmp_path / "s")
    assert shard.header["dtype"] == "uint32" and shard.tokens.tolist() == tokens.tolist()
    assert padded_vocab_size(tok, 128) == 70_016


def test_vocab_span_counts_an_added_token_past_the_model_vocabulary():
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    tok.add_special_tokens([AddedToken("<eos>", special=True)])
    assert vocab_span(tok) == 3 and tok.token_to_id("<eos>") == 2


def test_shards_keep_whole_documents_when_the_tokenizer_truncates(bpe):
    tok = Tokenizer.from_str(bpe.to_str())
    tok.enable_truncation(4)
    tokens, offsets = encode_documents(tok, [TEXTS[0]], eos_id=2)
    assert len(tokens) == len(bpe.encode(TEXTS[0]).ids) + 1 > 5


def test_key_follows_the_files_content_not_the_path(bpe, tmp_path):
    folder = _folder(tmp_path / "a", bpe, {"eos_token": "</s>"})
    copy = tmp_path / "b"
    shutil.copytree(folder, copy)

    class Cfg:
        def __init__(self, path):
            self.tokenizer = TokenizerConfig(pretrained=str(path))

    assert key_pretrained(Cfg(folder)) == key_pretrained(Cfg(copy)) != {}
    (copy / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<s>"}))
    assert key_pretrained(Cfg(folder)) != key_pretrained(Cfg(copy))
    assert key_pretrained(type("C", (), {"tokenizer": TokenizerConfig()})()) == {}


def test_stage_adopts_the_tokenizer_and_still_reports(bpe, tmp_path):
    from tasks.tokenizer.stage import run

    folder = _folder(tmp_path / "tok", bpe, {"eos_token": "</s>"})
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [dict(doc_id=f"{s}#{i}", source=s, family_id=f"{s}#{i}", text=f"{TEXTS[i % 3]} {i}", language=lang)
            for s, lang in (("en", "en"), ("zh", "zh")) for i in range(12)]
    kept = pd.DataFrame(docs).assign(n_bytes=lambda d: d["text"].map(lambda t: len(t.encode())))
    (corpus / "kept").mkdir(parents=True, exist_ok=True)
    kept.to_parquet(corpus / "kept" / "part-00000.parquet", index=False)
    (corpus / "manifest.json").write_text(json.dumps({"manifest_hash": "m" * 64}))
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(out=out, inputs={"corpus": corpus}, layout=RunsLayout(tmp_path / "runs"), key="k",
                       experiment="t")
    cfg = TokenizerConfig(pretrained=str(folder), domain_terms=["asyncio", "你好"], decontam_ngram=0)
    run(ctx, cfg)
    meta = json.loads((out / "tokenizer.meta.json").read_text())
    assert (meta["eos_id"], meta["pad_id"], meta["vocab_size"]) == (2, 2, bpe.get_vocab_size())
    assert meta["padded_vocab_size"] == -(-bpe.get_vocab_size() // 64) * 64
    assert meta["tokenizer_hash"] == tokenizer_hash(bpe)
    assert meta["pretrained"]["eos_token"] == "</s>" and meta["pretrained"]["files"] == files_digest(folder)
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    for source in ("en", "zh"):
        shard = read_shard(out / "shards" / source / "train", expected_tokenizer_hash=tokenizer_hash(bpe))
        assert shard.header["eos_id"] == 2 and shard.tokens.dtype == np.uint16
        assert int((np.asarray(shard.tokens) == 2).sum()) == shard.header["n_docs"]  # one EOS per document
    assert len(pd.read_parquet(out / "report.parquet")) > 0
    frag = pd.read_parquet(out / "fragmentation.parquet")
    assert "".join(frag.set_index("term").loc["你好", "pieces"]) == "你好"


def test_fragmentation_of_a_non_byte_level_vocabulary():
    from tasks.tokenizer.report import fragmentation

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "▁hello": 1, "▁world": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    frag = fragmentation(tok, ["hello world"])
    assert frag.loc[0, "n_tokens"] == 2 and list(frag.loc[0, "pieces"]) == ["hello", "world"]
