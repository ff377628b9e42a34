"""Experiment configs are rejected at load time with the field named; the shipped configs load."""

import os
import re
from pathlib import Path

import pytest

from flows.config import load_config, parse_config
from infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _raw() -> dict:
    import tomllib
    return tomllib.loads((ROOT / "configs/smoke.toml").read_text())


@pytest.mark.parametrize("name", ["demo.toml", "smoke.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.domain_sources == ["python_doc"]
    assert set(cfg.general_sources) == {"handbook_en", "handbook_zh", "fortunes_en", "fortunes_zh"}


def test_unknown_key_is_rejected_with_its_path():
    raw = _raw()
    raw["main"]["budget"]["stepz"] = 3
    with pytest.raises(ConfigError, match=r"main\.budget\.stepz"):
        parse_config(raw)


def test_wrong_type_is_rejected():
    raw = _raw()
    raw["main"]["budget"]["steps"] = "many"
    with pytest.raises(ConfigError, match=r"main\.budget\.steps"):
        parse_config(raw)


def test_warmup_longer_than_run_is_rejected():
    raw = _raw()
    raw["cpt"]["budget"]["warmup_steps"] = 100
    with pytest.raises(ConfigError, match="warmup_steps"):
        parse_config(raw)


def test_cpt_domain_must_be_a_domain_source():
    raw = _raw()
    raw["cpt"]["domain_sources"] = ["handbook_en"]
    with pytest.raises(ConfigError, match="role = 'domain'"):
        parse_config(raw)


def test_replay_fraction_out_of_range():
    raw = _raw()
    raw["cpt"]["replay_fractions"] = [1.5]
    with pytest.raises(ConfigError, match="replay fraction"):
        parse_config(raw)


def test_mixture_weights_must_name_general_sources():
    raw = _raw()
    raw["mixture"]["candidates"].append({"name": "bad", "weights": {"python_doc": 1.0}})
    with pytest.raises(ConfigError, match="python_doc"):
        parse_config(raw)


def test_jaccard_threshold_out_of_range_is_rejected():
    raw = _raw()
    raw["corpus"]["near_dedup"] = {"jaccard_threshold": 1.5}
    with pytest.raises(ConfigError, match="jaccard_threshold"):
        parse_config(raw)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_preflight_rejects_bad_refresh_missing_cloze_and_unmatched_local_source(tmp_path):
    from flows.preflight import preflight
    from infra.errors import SourceError

    cfg = load_config(ROOT / "configs/smoke.toml")
    with pytest.raises(ConfigError, match="unknown stage"):
        preflight(cfg, ["nonsense"])
    no_cloze = cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"cloze_items": str(tmp_path / "x.jsonl")})})
    with pytest.raises(ConfigError, match="cloze_items"):
        preflight(no_cloze)
    decontamination = cfg.corpus.decontamination.model_copy(update={"eval_files": [str(tmp_path / "missing*.jsonl")]})
    no_eval = cfg.model_copy(update={"corpus": cfg.corpus.model_copy(update={"decontamination": decontamination})})
    with pytest.raises(ConfigError, match=r"corpus\.decontamination\.eval_files: .*missing\*\.jsonl' matches no file"):
        preflight(no_eval)
    src = cfg.sources["handbook_en"].model_copy(update={"include": [str(tmp_path / "*.html")]})
    with pytest.raises(SourceError, match=r"^source 'handbook_en': no file matches include=\['.*\*\.html'\]"):
        preflight(cfg.model_copy(update={"sources": {**cfg.sources, "handbook_en": src}}))


def test_heads_not_dividing_width_fail_at_load_with_path_and_fix():
    raw = _raw()
    raw["main"]["model"].update(d_model=32, n_heads=3)
    with pytest.raises(ConfigError, match=r"main\.model\.n_heads: .*3 does not divide d_model = 32; use one of"):
        parse_config(raw)


def test_kv_heads_not_dividing_heads_fail_at_load_with_path_and_fix():
    raw = _raw()
    raw["proxy"]["model"].update(d_model=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match=r"proxy\.model\.n_kv_heads: .*use one of \[1, 2, 4\]"):
        parse_config(raw)


def test_odd_head_dim_fails_at_load():
    raw = _raw()
    raw["main"]["model"].update(d_model=24, n_heads=8, n_kv_heads=8)
    with pytest.raises(ConfigError, match=r"main\.model\.n_heads: .*head_dim .* = 3 is odd"):
        parse_config(raw)


def test_removed_mixture_main_tokens_says_where_d_comes_from():
    raw = _raw()
    raw["mixture"]["main_tokens"] = 1_000_000
    with pytest.raises(ConfigError, match=r"mixture\.main_tokens .*\[main\]"):
        parse_config(raw)


@pytest.mark.parametrize("section, change, message", [
    ("mixture", {"generate": {"kind": "grid", "count": 3, "step": 0.3}}, "1/step must be an integer"),
    ("mixture", {"candidates": [{"name": "natural", "alpha": 1.0}], "propose": True}, "at least 2"),
    ("mixture", {"candidates": [{"name": "natural", "alpha": 0.3}, {"name": "b", "alpha": 1.0}]}, "must have alpha = 1"),
    ("sweep", {"widths": [34]}, r"sweep\.widths: 34 must be a multiple of 2 × proxy n_heads"),
    ("sweep", {"forecast_windows": [1.0]}, "fit the very point it forecasts"),
    ("sweep", {"forecast_windows": []}, "at least one share"),
    ("cpt", {"replay_weights": {"python_doc": 1.0}}, "are not general sources"),
    ("cpt", {"replay_fractions": [0.1, 0.1]}, "repeats a value"),
    ("cpt", {"base_checkpoint": "no/such/dir"}, "is not a directory"),
    ("cpt", {"base_checkpoint": "meta-llama/Llama-3.2-1B"}, r"is not a directory.* looks like a Hugging Face Hub "
     r"id: download it into a folder first, e\.g\. `\.venv/bin/hf download meta-llama/Llama-3\.2-1B --local-dir "
     r"hf-models/Llama-3\.2-1B`, and give that folder"),
    ("gate", {"cloze_items": []}, "at least one cloze item file"),
    ("main", {"distributed": {"launch": "accelerate", "processes": 2, "accelerate_config": "no/such.yaml"}},
     "not found"),
    ("main", {"distributed": {"launch": "inprocess", "processes": 2}}, "needs launch"),
])
def test_proxy_cpt_gate_and_layout_values_are_rejected_at_load(section, change, message):
    raw = _raw()
    raw[section] = {**raw[section], **change}
    if section == "main":
        raw["main"]["async_checkpoints"] = False
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def _set(raw: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        raw = raw[int(part)] if isinstance(raw, list) else raw.setdefault(part, {})
    raw[int(last) if isinstance(raw, list) else last] = value


# (dotted path in configs/smoke.toml, bad value, the field path the error must name, the fix it must give)
BAD_FIELDS = [
    ("tokenizer.vocab_size", "1024", r"tokenizer\.vocab_size", r"got the string '1024'; write it without quotes"),
    ("proxy.peak_lr", "3e-4", r"proxy\.peak_lr", r"got the string '3e-4'; write it without quotes"),
    ("main.budget.steps", "16", r"main\.budget\.steps", "without quotes"),
    ("packing.document_mask", "true", r"packing\.document_mask", r"expected true or false.*document_mask = true"),
    ("corpus.pii", 1, r"corpus\.pii", "expected true or false, got int 1"),
    ("tokenizer.heldout_fraction", [0.1], r"tokenizer\.heldout_fraction", "expected a number, got list"),
    ("main.budget.stepz", 3, r"main\.budget\.stepz", r"unknown key; did you mean 'steps'\?"),
    ("corpus.near_dedup.rowz", 3, r"corpus\.near_dedup\.rowz", r"did you mean 'rows'\?"),
    ("sources.handbook_en.languag", "en", r"sources\.handbook_en\.languag", r"did you mean 'language'\?"),
    ("mixture.candidates.0.alfa", 1.0, r"mixture\.candidates\.0\.alfa", r"did you mean 'alpha'\?"),
    ("gate.criteria.0.treshold", 1.0, r"gate\.criteria\.0\.treshold", r"did you mean 'threshold'\?"),
    ("stability.stepz", 3, r"stability\.stepz", r"did you mean 'steps'\?"),
    ("nmae", "x", r"nmae", r"did you mean 'name'\?"),
    ("corpus.near_dedup.jaccard_threshold", 1.5, r"corpus\.near_dedup", r"jaccard_threshold=1\.5 must lie in \(0, 1\]"),
    ("corpus.near_dedup.bands", 20, r"corpus\.near_dedup", r"20\*8 = 160 exceeds num_perm=112; raise num_perm"),
    ("corpus.langid_threshold", 1.2, r"corpus\.langid_threshold", r"must lie in \[0, 1\)"),
    ("corpus.gopher.max_dup_lines", -0.1, r"corpus\.gopher", r"max_dup_lines=-0\.1 .* must lie in \[0, 1\]"),
    ("corpus.gopher.top_ngram_max_share", {"2": 1.3}, r"corpus\.gopher", r"top_ngram_max_share\[2\]=1\.3"),
    ("corpus.chinese.min_cjk_share", 2.0, r"corpus\.chinese", r"min_cjk_share=2\.0 .* must lie in \[0, 1\]"),
    ("corpus.source_overrides.fortunes_en.min_words", "3", r"source_overrides\['fortunes_en'\].*min_words",
     "without quotes"),
    ("corpus.languages", ["en", "xx"], r"corpus\.languages", r"\['xx'\] not lid\.176 labels; use codes like 'en'"),
    ("sources.handbook_en.language", "english", r"sources\.handbook_en\.language",
     r"'english' is not a lid\.176 label; use codes like 'en'"),
    ("sources.handbook_en.package", "debian-handbook", r"sources\.handbook_en", r"only for kind='deb'; remove it"),
    ("mixture.candidates.1", {"name": "w", "weights": {"handbook_en": 0.5, "handbook_zh": 0.6}},
     r"mixture\.candidates\.1", r"sums to 1\.1.*must sum to 1"),
    ("mixture.candidates.1", {"name": "w", "weights": {"handbook_en": -0.5, "handbook_zh": 1.5}},
     r"mixture\.candidates\.1", r"negative .* every weight must be ≥ 0"),
    ("mixture.candidates.1.alpha", 1.5, r"mixture\.candidates\.1", r"alpha = 1\.5: must lie in \[0, 1\]"),
    ("cpt.replay_fractions", [1.5], r"cpt", r"replay fraction 1\.5 must be in \[0, 1\)"),
    ("cpt.min_lr_ratio", 1.5, r"cpt\.min_lr_ratio", r"less than or equal to 1 \(got 1\.5\)"),
    ("cpt.replay_weights", {"handbook_en": 0.7}, r"cpt", r"must be ≥ 0 and sum to 1"),
    ("main.budget.steps", 0, r"main\.budget\.steps", r"greater than 0 \(got 0\)"),
    ("main.budget.batch_size", -8, r"main\.budget\.batch_size", r"greater than 0 \(got -8\)"),
    ("proxy.model.seq_len", 1, r"proxy\.model\.seq_len", r"greater than 1 \(got 1\)"),
    ("proxy.peak_lr", 0.0, r"proxy\.peak_lr", r"greater than 0 \(got 0\.0\)"),
    ("proxy.peak_lr", float("inf"), r"proxy\.peak_lr", r"finite number \(got inf\)"),
    ("sweep.lr_min", float("nan"), r"sweep\.lr_min", "finite number"),
    ("sweep.n_trials", 0, r"sweep", r"n_trials = 0: must be ≥ 1"),
    ("tokenizer.vocab_size", 200, r"tokenizer", r"vocab_size=200 leaves no room for merges: it must exceed .* = 260"),
    ("tokenizer.heldout_fraction", 1.0, r"tokenizer\.heldout_fraction", "strictly between 0 and 1"),
    ("seed", -1, r"seed", r"greater than or equal to 0 \(got -1\)"),
    ("corpus.near_dedup.seed", -1, r"corpus\.near_dedup\.seed", "greater than or equal to 0"),
    ("corpus.execution.workers", 0, r"corpus\.execution\.workers", r"greater than or equal to 1 \(got 0\)"),
    ("gate.criteria.0.confidence", 1.5, r"gate\.criteria\.0\.confidence", "1.5"),
    ("stability.lrs", [-0.1], r"stability", r"every learning rate must be > 0"),
    ("stability.interventions", ["qk_norm"], r"stability", r"must start with 'bare'"),
    ("stability.model", {"n_layers": 2, "d_model": 30, "n_heads": 4, "n_kv_heads": 4, "d_ff": 8},
     r"stability.*n_heads", r"4 does not divide d_model = 30; use one of"),
    ("sources.deb1", {"kind": "deb", "package": "-oAPT::Get::x=1", "include": ["*"]},
     r"sources\.deb1\.package", r"not a Debian package name.*starting with a letter or digit"),
]


@pytest.mark.parametrize("path, value, field, fix", BAD_FIELDS, ids=[f"{p}={v!r}"[:60] for p, v, *_ in BAD_FIELDS])
def test_one_bad_field_is_refused_naming_the_field_and_the_fix(path, value, field, fix):
    raw = _raw()
    _set(raw, path, value)
    with pytest.raises(ConfigError) as err:
        parse_config(raw, origin="smoke.toml")
    message = str(err.value)
    assert "\n" not in message
    assert re.search(rf"^smoke\.toml: invalid config: .*{field}", message), message
    assert re.search(fix, message), message


@pytest.mark.parametrize("path, value", [("proxy.peak_lr", 1), ("cpt.peak_lrs", [1, 3e-3]),
                                         ("corpus.gopher.top_ngram_max_share", {"2": 0.25, "3": 0.2})])
def test_integers_for_floats_and_toml_integer_keys_are_accepted(path, value):
    raw = _raw()
    _set(raw, path, value)
    cfg = parse_config(raw)
    assert cfg.proxy.peak_lr == (1.0 if path == "proxy.peak_lr" else 3e-3)
    if path == "corpus.gopher.top_ngram_max_share":
        assert cfg.corpus.gopher.top_ngram_max_share == {2: 0.25, 3: 0.2}


def test_every_problem_is_listed_on_one_line():
    raw = _raw()
    raw["tokenizer"]["vocab_size"] = "1024"
    raw["main"]["budget"]["stepz"] = 3
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    message = str(err.value)
    assert "\n" not in message and "tokenizer.vocab_size" in message and "main.budget.stepz" in message


def test_section_built_directly_still_raises_its_config_error():
    from tasks.corpus.config import MinHashConfig

    with pytest.raises(ConfigError, match=r"exceeds num_perm=112"):
        MinHashConfig(bands=20, rows=8)


def test_language_labels_are_the_models_own():
    from infra.languages import LID176_LABELS
    from tasks.corpus.langid import model_labels

    assert model_labels() == LID176_LABELS


@pytest.mark.parametrize("command", ["run", "status"])
def test_cli_prints_a_bad_config_as_one_line_with_exit_code_2(command, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/smoke.toml").read_text().replace("vocab_size = 1024", 'vocab_size = "1024"'))
    args = [command, str(bad), "--runs-dir", str(tmp_path / "runs")] + (["--dry-run"] if command == "run" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert re.search(r"error: ConfigError: .*bad\.toml: invalid config: tokenizer\.vocab_size: expected an integer, "
                     r"got the string '1024'; write it without quotes", lines[0])
    assert not (tmp_path / "runs").exists()


def test_config_that_is_not_utf8_or_is_a_directory_is_refused_with_the_fix(tmp_path):
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 \(byte 0xe9 at offset 11\).*re-save it as UTF-8"):
        load_config(latin1)
    with pytest.raises(ConfigError, match="is a directory; give the experiment's TOML file"):
        load_config(tmp_path)


@pytest.mark.parametrize("value, hint", [("yes", "write document_mask = true or document_mask = false"),
                                         ("TRUE", "write document_mask = true without quotes")])
def test_boolean_given_as_a_string_gets_a_valid_toml_hint(value, hint):
    raw = _raw()
    raw["packing"]["document_mask"] = value
    with pytest.raises(ConfigError, match=re.escape(hint)):
        parse_config(raw)


def test_word_given_for_a_number_and_a_missing_section_get_their_own_hints():
    raw = _raw()
    raw["main"]["budget"]["steps"] = "sixteen"
    del raw["sweep"]
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert "give steps a number, without quotes" in str(err.value)
    assert "sweep: required section missing; add a [sweep] table" in str(err.value)
    assert "<top level>" not in str(err.value)


def test_runs_folder_that_is_a_file_or_unwritable_is_a_one_line_error(tmp_path):
    from infra.runs import RunsLayout

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="a file is in the way"):
        RunsLayout.resolve(blocker).prepare_environment()
    locked = tmp_path / "locked"
    (locked / "prefect").mkdir(parents=True)
    locked.chmod(0o555)
    (locked / "prefect").chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root): permissions cannot be tested")
        with pytest.raises(ConfigError, match="is not writable"):
            RunsLayout.resolve(locked).prepare_environment()
    finally:
        locked.chmod(0o755)
        (locked / "prefect").chmod(0o755)


def test_near_dedup_settings_that_waste_or_miss_warn_at_load_and_shipped_configs_do_not():
    import warnings

    from infra.errors import ConfigWarning

    raw = _raw()
    raw["corpus"]["near_dedup"] = {"bands": 14, "rows": 8, "jaccard_threshold": 0.55}
    with pytest.warns(ConfigWarning, match=r"corpus\.near_dedup: jaccard_threshold=0\.55"):
        parse_config(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        for name in ("demo.toml", "smoke.toml"):
            load_config(ROOT / "configs" / name)


@pytest.mark.parametrize("blocked", ["audit", "reports", "scratch", "locks", "cache", "cache/sources", "cache/proxies",
                                     "mlartifacts", "artifacts", "optuna", "prefect"])
def test_a_file_where_the_runs_folder_needs_a_folder_is_named_with_the_fix(tmp_path, blocked):
    from infra.errors import RunsFolderError
    from infra.runs import RunsLayout

    root = tmp_path / "runs"
    (root / blocked).parent.mkdir(parents=True, exist_ok=True)
    (root / blocked).write_text("x")
    with pytest.raises(RunsFolderError) as err:
        RunsLayout.resolve(root).prepare_environment()
    message = str(err.value)
    assert str(root / blocked) in message and "a file is in the way" in message and "needs a folder" in message
    assert "remove or rename the file" in message and "--runs-dir" in message
    assert isinstance(err.value, ConfigError) and isinstance(err.value, OSError)


def test_a_file_below_the_runs_folder_is_named_where_a_stage_or_the_audit_makes_its_folder(tmp_path):
    from infra.artifacts import ArtifactStore
    from infra.errors import RunsFolderError
    from infra.runs import RunsLayout, ensure_folder
    from infra.stage import StageContext

    layout = RunsLayout.resolve(tmp_path / "runs")
    layout.prepare_environment()
    (layout.artifacts / "corpus").write_text("x")
    with pytest.raises(RunsFolderError, match=re.escape(str(layout.artifacts / "corpus")) + ".*needs a folder"):
        ArtifactStore(layout.artifacts).begin("corpus", "k1")
    (layout.root / "locks").mkdir()
    (layout.root / "locks" / "corpus").write_text("x")
    with pytest.raises(RunsFolderError, match=re.escape(str(layout.root / "locks" / "corpus"))):
        with ArtifactStore(layout.artifacts).computing("corpus", "k1"):
            pass
    (layout.root / "scratch").mkdir()
    (layout.root / "scratch" / "tokenizer").write_text("x")
    ctx = StageContext(out=layout.artifacts / "tokenizer" / ".tmp-k", inputs={}, layout=layout, key="k", experiment="e")
    with pytest.raises(RunsFolderError, match=re.escape(str(layout.root / "scratch" / "tokenizer"))):
        ctx.scratch
    (layout.root / "audit").mkdir()
    (layout.root / "audit" / "smoke").write_text("x")
    with pytest.raises(RunsFolderError, match=r"audit/smoke: a file is in the way .* remove or rename the file"):
        ensure_folder(layout.root / "audit" / "smoke" / "fortunes_en")


def test_a_cross_section_problem_reads_as_one_field_path(tmp_path):
    """Checks across sections run on the whole config, which has no field path of its own: the message starts at
    the field the check names."""
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/smoke.toml").read_text().replace('domain_sources = ["python_doc"]',
                                                                       'domain_sources = ["handbook_en"]'))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert re.search(r"bad\.toml: invalid config: cpt\.domain_sources: 'handbook_en' must name a source with "
                     r"role = 'domain'", str(err.value)), str(err.value)
    assert ": :" not in str(err.value)


@pytest.mark.parametrize("line, message", [
    ('accept_narrowing = ["nosuch"]', r"accept_narrowing: \['nosuch'\] name no source"),
    ("max_removed_share_by = {nosuch = 0.3}", r"max_removed_share_by: \['nosuch'\] name no source"),
    ('positive.sources = ["nosuch"]', r"quality_model.positive.sources: \['nosuch'\] are not sources"),
])
def test_quality_model_names_must_be_sources_languages_or_all(tmp_path, line, message):
    text = (ROOT / "configs/smoke.toml").read_text()
    text = text.replace('positive.sources = ["handbook_en", "handbook_zh", "fortunes_en", "fortunes_zh", "python_doc"]',
                        line if line.startswith("positive") else
                        'positive.sources = ["handbook_en"]\n' + line)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(bad)
    ok = text.replace("nosuch", "all") if "positive" not in line else None
    if ok is not None:
        bad.write_text(ok)
        assert load_config(bad).corpus.quality_model is not None  # "all" names the whole corpus


def test_a_string_where_a_list_belongs_is_told_to_be_a_list(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/smoke.toml").read_text().replace('languages = ["en", "zh"]', 'languages = "en"', 1))
    with pytest.raises(ConfigError, match=r'corpus.languages: expected a list, got the string \'en\'; write it as a '
                                          r'list: languages = \["en"\]'):
        load_config(bad)
