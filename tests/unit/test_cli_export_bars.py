"""`pretrain export` prints its own result line, not transformers' tqdm bars (flows/cli.py, flows/runlog.py)."""

from typer.testing import CliRunner

from flows.cli import app


def test_export_prints_its_result_without_transformers_progress_bars(monkeypatch, tmp_path):
    import flows.export
    from transformers.utils import logging as hf_logging

    record = {"architecture": "LlamaForCausalLM", "tokenizer_dir": "tok", "max_abs_logit_diff": 1e-6,
              "tolerance": 1e-4}
    bars = []
    monkeypatch.setattr(flows.export, "export", lambda *args: bars.append(hf_logging.is_progress_bar_enabled())
                        or record)
    try:
        result = CliRunner().invoke(app, ["export", str(tmp_path / "ckpt"), str(tmp_path / "out")])
    finally:
        hf_logging.enable_progress_bar()
    assert result.exit_code == 0, result.output
    assert bars == [False] and "wrote " in result.output and "LlamaForCausalLM" in result.output
