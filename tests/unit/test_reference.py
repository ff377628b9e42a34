"""The configuration reference is generated from the config models; the committed page must match them."""

from pathlib import Path

from flows.config import ExperimentConfig
from flows.reference import reference

ROOT = Path(__file__).resolve().parents[2]


def test_committed_reference_matches_the_config_models():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == reference(), "docs/configuration.md is stale: python -m flows.reference > docs/configuration.md"


def test_every_top_level_section_and_distributed_field_is_documented():
    page = reference()
    for name in ExperimentConfig.model_fields:
        assert f"| `{name}` |" in page
    for field in ("launch", "processes", "accelerate_config", "strategy"):
        assert f"| `{field}` |" in page.split("## `[main.distributed]`")[1].split("## ")[0]
