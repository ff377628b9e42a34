"""The experiment config: one TOML file, parsed into validated, frozen sections.

Each stage receives only its own section(s). Unknown keys, wrong types and out-of-range values are
rejected at load time with the field's dotted path and the fix; nothing runs on a bad config.

    pretrain run configs/demo.toml --dry-run     # prints the resolved config and the stage graph
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from evals.gate_config import GateConfig
from infra.errors import ConfigError
from infra.hub import hub_id_hint
from infra.section import Section
from tasks.corpus.config import CorpusConfig
from tasks.ladder.config import LadderConfig
from tasks.mixture.config import MixtureConfig
from tasks.sources.config import SourceConfig
from tasks.stability.config import StabilityExperimentConfig
from tasks.sweep.config import SweepConfig
from tasks.tokenizer.config import TokenizerConfig
from tasks.train.sections import CptConfig, MainConfig, PackingConfig, ProxyConfig, SampleConfig


class ExperimentConfig(Section):
    """A whole experiment. ``name`` is the MLflow experiment and the DuckDB ``experiment`` column."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = Field(default=0, ge=0)
    torch_threads: int | None = Field(default=None, gt=0, description=(
        "CPU threads for training, shared among launched workers; an exported OMP_NUM_THREADS (per process) wins; "
        "default: the CPUs the process may use (infra.threads). Not in keys: results do not depend on it"))
    sources: dict[str, SourceConfig]
    corpus: CorpusConfig
    tokenizer: TokenizerConfig
    packing: PackingConfig = PackingConfig()
    mixture: MixtureConfig
    proxy: ProxyConfig
    sweep: SweepConfig
    main: MainConfig
    ladder: LadderConfig = LadderConfig()
    cpt: CptConfig
    gate: GateConfig
    stability: StabilityExperimentConfig = StabilityExperimentConfig()
    samples: SampleConfig = SampleConfig()

    @field_validator("sources", mode="before")
    @classmethod
    def _name_sources(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {**v, "name": k} if isinstance(v, dict) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _cross_section(self) -> "ExperimentConfig":
        general = self.general_sources
        if not general:
            raise ValueError("sources: at least one source needs role = 'general' (the pretraining mixture)")
        for name in self.cpt.domain_sources:
            if name not in self.sources or self.sources[name].role != "domain":
                raise ValueError(f"cpt.domain_sources: '{name}' must name a source with role = 'domain'")
        by_language = [c.name for c in self.mixture.candidates if c.alpha_over == "language"]
        unlabelled = sorted(s for s in general if not self.sources[s].language)
        if by_language and unlabelled:  # caught here, before the corpus build, not when the mixture stage resolves
            raise ValueError(f"mixture.candidates {by_language} apply the temperature over languages, but general "
                             f"sources {unlabelled} have no language: set sources.<name>.language (e.g. \"en\")")
        context = self.cpt.context
        if context is not None:
            unknown = [n for n in context.long_sources if n not in self.sources]
            if unknown:
                raise ValueError(f"cpt.context.long_sources: {unknown} are not sources {sorted(self.sources)}")
            base_len = self.main.model.seq_len
            external = self.cpt.base_checkpoint and not self.cpt.base_checkpoint.startswith("main@")
            if not external and context.target_seq_len <= base_len:
                raise ValueError(f"cpt.context.target_seq_len = {context.target_seq_len} must exceed the main "
                                 f"model's seq_len = {base_len}: it is the extended window")
            if not external:
                from evals.gate_config import RETRIEVAL_METRICS
                from evals.long_context import default_lengths
                from models.context import extended_config

                for recipe in context.recipes:  # the vocabulary does not change what a recipe may do
                    try:
                        extended_config(self.main.model.build(64), context.target_seq_len, recipe)
                    except ValueError as err:
                        raise ValueError(f"cpt.context.recipes: {err}") from None
                lengths = context.retrieval_lengths or default_lengths(base_len, context.target_seq_len)
                for c in self.gate.criteria:
                    if c.metric in RETRIEVAL_METRICS and c.length and c.length not in lengths:
                        raise ValueError(f"gate.criteria '{c.name}': length = {c.length} is not a passkey length "
                                         f"{lengths} (cpt.context.retrieval_lengths; 0 = the longest)")
        from evals.gate_config import CONTEXT_METRICS

        context_criteria = [c.name for c in self.gate.criteria if c.metric in CONTEXT_METRICS]
        if self.cpt.kind != "context_extension" and (context_criteria or self.gate.select == "max_long_loss_reduction"):
            what = ([f"criteria {context_criteria}"] if context_criteria else []) + (
                [f"select = {self.gate.select!r}"] if self.gate.select == "max_long_loss_reduction" else [])
            raise ValueError(f"gate: {' and '.join(what)} judge a context extension; they need [cpt] kind = "
                             "'context_extension'")
        qm = self.corpus.quality_model
        for side in ("positive", "negative"):
            unknown = [n for n in getattr(qm, side).sources if n not in self.sources]
            if unknown:
                raise ValueError(f"corpus.quality_model.{side}.sources: {unknown} are not sources "
                                 f"{sorted(self.sources)}")
        groups = {*self.sources, *self.corpus.languages, "unknown", "all"}
        for field in ("max_removed_share_by", "accept_narrowing"):
            unknown = sorted(set(getattr(qm, field)) - groups)
            if unknown:
                raise ValueError(f"corpus.quality_model.{field}: {unknown} name no source, no kept language and not "
                                 f"'all' (the whole corpus); use one of {sorted(groups)}")
        unknown = set(self.tokenizer.fit_weights) - set(self.sources)
        if unknown:
            raise ValueError(f"tokenizer.fit_weights: {sorted(unknown)} are not sources {sorted(self.sources)}")
        for candidate in self.mixture.candidates:
            unknown = set(candidate.weights or {}) - set(general)
            if unknown:
                raise ValueError(
                    f"mixture.candidates '{candidate.name}': {sorted(unknown)} are not general sources {general}"
                )
        heads = self.proxy.model.n_heads
        for width in self.sweep.widths:
            if width % heads or (width // heads) % 2:
                raise ValueError(f"sweep.widths: {width} must be a multiple of 2 × proxy n_heads = {2 * heads} "
                                 "(an even head dimension for RoPE)")
        main_heads = self.main.model.n_heads
        for width in self.ladder.widths:
            if width % main_heads or (width // main_heads) % 2:
                raise ValueError(f"ladder.widths: {width} must be a multiple of 2 × main n_heads = {2 * main_heads} "
                                 "(an even head dimension for RoPE)")
        unknown = set(self.cpt.replay_weights) - set(general)
        if unknown:
            raise ValueError(f"cpt.replay_weights: {sorted(unknown)} are not general sources {general} (replay is "
                             "general text; the domain sources are the CPT stream itself)")
        base = self.cpt.base_checkpoint
        # main@<name> / <artifact>@<name>: a named checkpoint of a main artifact (tasks.train.milestones)
        named = base.rpartition("@")[0] if base and "@" in Path(base).name and not Path(base).exists() else None
        if named is not None:
            if named != "main" and not Path(named).is_dir():
                raise ValueError(f"cpt.base_checkpoint: {named} is not a directory; name a checkpoint of a main "
                                 "artifact as main@<name> (this experiment's) or runs/artifacts/main/<key>@<name>")
        elif self.cpt.base_checkpoint and not Path(self.cpt.base_checkpoint).is_dir():
            raise ValueError(f"cpt.base_checkpoint: {self.cpt.base_checkpoint} is not a directory (give a checkpoint "
                             "folder with model.safetensors and state.json, or a Hugging Face model folder with "
                             "config.json and safetensors; relative paths are read from the working directory)"
                             f"{hub_id_hint(self.cpt.base_checkpoint)}")
        if self.cpt.base_checkpoint and named is None:
            from tasks.cpt.hf_base import check_hf_base, is_hf_folder

            if is_hf_folder(self.cpt.base_checkpoint):
                try:
                    check_hf_base(self.cpt.base_checkpoint, self.tokenizer.pretrained)
                except ConfigError as err:
                    raise ValueError(f"cpt.base_checkpoint: {err}") from None
        dist = self.main.distributed
        if dist.launch == "accelerate":
            from tasks.main.launch import resolve_launch_config

            try:
                resolve_launch_config(dist.accelerate_config)
            except ConfigError as err:
                raise ValueError(str(err)) from None
            if dist.strategy == "hybrid" and dist.shard_size and dist.processes % dist.shard_size:
                raise ValueError(f"main.distributed.shard_size = {dist.shard_size} does not divide processes = "
                                 f"{dist.processes}")
        return self

    @property
    def general_sources(self) -> list[str]:
        return [name for name, src in self.sources.items() if src.role == "general"]

    @property
    def domain_sources(self) -> list[str]:
        return [name for name, src in self.sources.items() if src.role == "domain"]


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate an experiment TOML file.

    Args:
        path: the TOML file.
        overrides: dotted field paths set before validation, e.g. ``{"seed": 1, "main.distributed.processes": 8}``
            (a scheduled deployment's typed parameters); validated exactly like the file's own values.

    Raises:
        ConfigError: the file is missing or not TOML, or any field is invalid (every problem listed with its
            dotted field path and the validator's message).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give the experiment's TOML file, e.g. {path / 'smoke.toml'}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 (byte {err.object[err.start]:#04x} at offset {err.start}); "
                          "TOML files must be UTF-8: re-save it as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from err
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    return parse_config(raw, origin=str(path) + (f" with overrides {overrides}" if overrides else ""))


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {part} is a value, not a section")
        node = child
    node[leaf] = value


def parse_config(raw: dict[str, Any], origin: str = "<config>") -> ExperimentConfig:
    """Validate an already-parsed config mapping; see ``load_config``.

    Raises:
        ConfigError: one line naming every invalid field with its dotted path, the bad value and the fix.
    """
    return ExperimentConfig.validate_strict(raw, origin)
