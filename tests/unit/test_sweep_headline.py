"""The summary's Peak LR headline shows the LR the main run used and which swept width (and verdict) it came from,
not the proxy width's fit (tasks/sweep/views.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from infra.runs import RunsLayout
from infra.stage import SummaryContext
from tasks.sweep.views import summary


def _width(d_model: int, lr: float, verdict: str, low=None, high=None) -> dict:
    fit = {"n_trials": 10, "optimum": lr, "low": low, "high": high, "confidence": 0.95, "coefficients": [],
           "reason": "" if low else "the confidence set is unbounded"}
    return {"d_model": d_model, "best_lr": lr, "best_trial_lr": lr, "best_value": 6.0, "study_name": f"s{d_model}",
            "lr_source": "fit" if verdict == "decided" else "best trial", "verdict": verdict, "fit": fit,
            "fallback": "fall back to the best trial", "resolve": "more trials between 1e-3 and 3e-2"}


def _folder(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    widths = [_width(64, 1.166e-2, "undetermined"), _width(128, 6.367e-3, "decided", 4.1e-3, 9.9e-3)]
    (sweep / "best.json").write_text(json.dumps({**{k: v for k, v in widths[0].items() if k != "d_model"},
                                                 "widths": widths}))
    return sweep


def _headline(tmp_path, paths, cfg=None) -> str:
    ctx = SummaryContext(path=paths["sweep"], paths=paths, layout=RunsLayout(tmp_path / "runs"), cfg=cfg)
    return summary(ctx)[0]


def test_the_headline_is_the_lr_the_main_run_trained_at_with_its_width_and_verdict(tmp_path):
    sweep = _folder(tmp_path)
    main = tmp_path / "main"
    main.mkdir()
    (main / "run.json").write_text(json.dumps({"peak_lr": 6.367e-3, "peak_lr_source": {
        "from": "sweep", "d_model": 128, "study": "s128", "main_d_model": 160}}))
    line = _headline(tmp_path, {"sweep": sweep, "main": main})
    assert "6.367e-03" in line and "1.166e-02" not in line
    assert "the main run trained at it (main d_model 160), from the d128 sweep" in line
    assert "decided" in line and "[4.10e-03, 9.90e-03]" in line


def test_before_the_main_run_the_headline_is_the_width_the_config_will_take(tmp_path):
    sweep = _folder(tmp_path)
    cfg = SimpleNamespace(main=SimpleNamespace(peak_lr=None, model=SimpleNamespace(d_model=64)))
    line = _headline(tmp_path, {"sweep": sweep}, cfg)
    assert "1.166e-02" in line and "trains at it (main d_model 64), from the d64 sweep" in line
    assert "the fit undetermined, no interval" in line
    set_lr = SimpleNamespace(main=SimpleNamespace(peak_lr=3e-3, model=SimpleNamespace(d_model=64)))
    assert "set in \\[main] peak_lr" in _headline(tmp_path, {"sweep": sweep}, set_lr)
