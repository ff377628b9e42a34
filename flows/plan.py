"""``pretrain plan``: the pre-launch arithmetic of a run, before any device is booked (docs/methods.md §1–§5).

A plan file holds one ``[model]`` shape and one or more ``[[runs]]`` (pretraining, CPT, ...) with their tokens,
devices and layout; a run may train a shape of its own (``[runs.model]``, e.g. a context extension at a longer
seq_len). An experiment config is planned too, from its ``[main]`` section on the detected device, and, when its
``[cpt] kind = "context_extension"``, the extension grid at ``cpt.context.target_seq_len`` (docs/methods.md §15).
The plan is a list of tables (section, rows of label/value/note) so the CLI can print it and tests can read it.

A run on several devices also gets its data-parallel traffic per step (DDP/ZeRO-1/2, ZeRO-3, hybrid sharding)
timed on its declared links; ``flop_conventions`` adds PaLM's FLOP count and HFU beside the architecture-aware MFU;
a ``[moe]`` section routes blocks to experts (total vs active parameters, capacity, the load-balancing loss,
all-to-all traffic, expert-parallel memory). The arithmetic is ``models.scaleout`` (docs/methods.md §1–§4).

    pretrain plan configs/plan_case_study.toml
    pretrain plan configs/plan_moe.toml
    pretrain plan configs/demo.toml --runs-dir runs   # with the law its scaling ladder fitted, when there is one

The scaling table uses the published Chinchilla constants (Hoffmann et al. 2022), or, for an experiment config whose
``[ladder]`` artifact is in the runs folder and decided its forecast, the constants that ladder fitted
(``ladder_law``; N is then the non-embedding parameter count, the ladder's convention). The table's title and its
``law`` row say which, and why an undetermined fit was not used.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from infra.errors import ConfigError
from infra.section import Section
from models.arithmetic import flops_6nd, flops_per_token, param_count, training_flops
from models.config import ModelConfig
from models.planning import (DEVICE_MEMORY_GB, DEVICE_PEAK_BF16, GB, PLANNING_RATE, Chinchilla, activation_bytes,
                             checkpoint_bytes, detected_device, elapsed_hours, gpu_hours, memory_fit, pipeline_bubble,
                             rate_at_mfu, served_token_break_even, tensor_parallel_traffic,
                             tokens_per_param_allocation, young_interval)
from models.scaleout import (DEVICES_PER_NODE, INTER_NODE_BANDWIDTH, INTRA_NODE_BANDWIDTH, Links, MoEShape,
                             data_parallel_traffic, dropped_share_bounds, expert_capacity, hardware_flops_per_token,
                             hfu_from_mfu, moe_data_parallel_traffic, moe_flops_per_token, moe_memory_fit,
                             moe_param_count, moe_step_all_to_all_bytes, palm_flops_per_token)


class RunPlan(Section):
    """One run of a plan.

    Fields:
        name: label ("pretrain", "cpt").
        tokens: D, training tokens.
        devices: accelerators in the run.
        device: a key of ``DEVICE_PEAK_BF16`` (peak and memory come from it).
        rate: sustained FLOP/s per device for time estimates (docs/methods.md §1 planning rate 4e14).
        mfu: utilisations at which elapsed days are also shown.
        zero_stage / micro_batch / grad_accum: the data-parallel layout; global batch = mb × accum × devices.
        checkpointing: full activation checkpointing.
        headroom: share of device memory kept free in the fit verdict.
        pipeline_stages / pipeline_micro_batches: for the bubble (1 stage = no pipeline).
        save_seconds / mtbf_hours: checkpoint save time δ and mean time between failures M (Young).
        model: the run's own shape when it differs from the plan's ``[model]`` (a context extension trains the same
            weights at a longer seq_len); None = the plan's. A different seq_len adds a context-window table.
        notes: label → value rows shown at the end of the run's compute table (what the tokens are made of).
        state_bytes_per_param: B, model-state bytes per parameter (docs/methods.md §3): 16 mixed-precision Adam,
            18 with fp32 gradients, 10 with 8-bit moments; ZeRO shards its optimiser share B − 4.
        shard_group: G, hybrid sharding (HSDP): ZeRO shards within groups of G devices and replicates across the
            devices/G groups, so states divide by G and the gradients cross groups as an all-reduce of 1/G of them;
            None = shard over all devices. Must divide devices.
        expert_parallel: EP, devices one MoE layer's experts are spread over (needs the plan's ``[moe]``; divides
            the shard group and the experts).
        comm_bytes: bytes per element of the gradient, weight and all-to-all traffic (2 = bf16).
        intra_node_gb_s / inter_node_gb_s / devices_per_node: per-device bandwidth per direction in GB/s, inside a
            node (NVLink 4 on H100 SXM: 450) and between nodes (one 400 Gb/s NDR adapter per GPU: 50), and devices
            per node (8): a collective over ≤ devices_per_node consecutive devices runs at the first, else the second.
        flop_conventions: extra counts shown beside the architecture-aware one: ``"palm"`` (6N + 12·L·T·d per
            token, Chowdhery et al. 2022 App. B) and ``"hfu"`` (hardware FLOPs utilisation, recomputation counted).
    """

    name: str
    tokens: float = Field(gt=0, allow_inf_nan=False)
    devices: int = Field(gt=0)
    device: Literal["H100-SXM", "H200", "H100-PCIe", "A100", "L40S"] = "H100-SXM"
    rate: float = Field(default=PLANNING_RATE, gt=0)
    mfu: list[Annotated[float, Field(gt=0, le=1)]] = [0.3, 0.4, 0.5]
    zero_stage: Literal[0, 1, 2, 3] = 3
    micro_batch: int = Field(default=1, gt=0)
    grad_accum: int = Field(default=1, gt=0)
    checkpointing: bool = False
    headroom: float = Field(default=0.0, ge=0.0, lt=1.0)
    pipeline_stages: int = Field(default=1, gt=0)
    pipeline_micro_batches: int = Field(default=1, gt=0)
    save_seconds: float = Field(default=60.0, gt=0)
    mtbf_hours: float = Field(default=3.09, gt=0)
    check_this_machine: bool = Field(default=False, description="also judge the fit on the detected device")
    model: ModelConfig | None = None
    notes: dict[str, str] = {}
    state_bytes_per_param: int = Field(default=16, gt=4)
    shard_group: int | None = Field(default=None, gt=0)
    expert_parallel: int = Field(default=1, gt=0)
    comm_bytes: Literal[1, 2, 4] = 2
    intra_node_gb_s: float = Field(default=INTRA_NODE_BANDWIDTH / GB, gt=0)
    inter_node_gb_s: float = Field(default=INTER_NODE_BANDWIDTH / GB, gt=0)
    devices_per_node: int = Field(default=DEVICES_PER_NODE, gt=0)
    flop_conventions: list[Literal["palm", "hfu"]] = []

    @model_validator(mode="after")
    def _groups_divide_devices(self) -> "RunPlan":
        if self.shard_group is not None and (self.shard_group > self.devices or self.devices % self.shard_group):
            raise ValueError(f"shard_group = {self.shard_group} must divide devices = {self.devices}; use one of "
                             f"{[g for g in range(1, self.devices + 1) if self.devices % g == 0]}")
        shard = self.shard
        if shard % self.expert_parallel:
            raise ValueError(f"expert_parallel = {self.expert_parallel} must divide the {shard} devices a model "
                             "state is sharded over (shard_group, else devices)")
        return self

    @property
    def shard(self) -> int:
        """Devices one copy of the model states is sharded over: G with HSDP, else all devices."""
        return self.devices if self.shard_group is None else self.shard_group

    @property
    def links(self) -> Links:
        return Links(self.intra_node_gb_s * GB, self.inter_node_gb_s * GB, self.devices_per_node)


class MoEPlan(Section):
    """``[moe]``: route the FFN of some blocks of the plan's model to experts (Lepikhin et al. 2020, GShard;
    Fedus et al. 2022, Switch Transformer).

    Fields:
        experts: E experts per MoE layer.
        top_k: k experts per token (Switch 1, GShard 2).
        capacity_factor: C; an expert accepts C·tokens·k/E tokens of a routed group (Fedus et al. 2022 train at
            1.0–1.25).
        every: route every n-th block, indices n − 1, 2n − 1, ... (1 = every block, 2 = every other block as in
            GShard and Switch); ignored when ``layers`` is given.
        layers: explicit 0-based indices of the routed blocks.
        d_ff_expert: hidden width of one expert; None = the model's d_ff.
        aux_loss_coef: α of the load-balancing loss α·E·Σ f_i·P_i (Fedus et al. 2022: 1e-2).
    """

    experts: int = Field(ge=2)
    top_k: int = Field(default=2, ge=1)
    capacity_factor: float = Field(default=1.25, gt=0)
    every: int = Field(default=1, ge=1)
    layers: list[Annotated[int, Field(ge=0)]] | None = None
    d_ff_expert: int | None = Field(default=None, gt=0)
    aux_loss_coef: float = Field(default=0.01, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> "MoEPlan":
        if self.top_k > self.experts:
            raise ValueError(f"moe.top_k = {self.top_k} exceeds moe.experts = {self.experts}; lower it")
        if self.layers is not None and self.every != 1:
            raise ValueError("moe.layers and moe.every both choose the routed blocks; give one of them")
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)):
            raise ValueError(f"moe.layers = {self.layers} must list distinct block indices")
        return self

    def shape(self, cfg: ModelConfig) -> MoEShape:
        """The routed layers of ``cfg`` as a ``models.scaleout.MoEShape``.

        Raises:
            ConfigError: a block index outside the model, or ``every`` longer than the model.
        """
        layers = self.layers if self.layers is not None else \
            [i for i in range(cfg.n_layers) if i % self.every == self.every - 1]
        if not layers or max(layers) >= cfg.n_layers:
            raise ConfigError(f"moe: routed blocks {layers if layers else '(none)'} do not fit a model of "
                              f"{cfg.n_layers} blocks (0..{cfg.n_layers - 1}); fix moe.layers or moe.every")
        return MoEShape(self.experts, self.top_k, tuple(layers), self.d_ff_expert or cfg.d_ff,
                        self.capacity_factor, self.aux_loss_coef)

    def describe_layers(self, cfg: ModelConfig) -> str:
        n = len(self.shape(cfg).moe_layers)
        if self.layers is not None:
            return f"{n} of {cfg.n_layers}: blocks {self.layers}"
        which = "every block" if self.every == 1 else f"every {_ordinal(self.every)} block"
        return f"{n} of {cfg.n_layers} ({which})"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class PlanConfig(Section):
    """A plan file: the model shape, its runs and, optionally, ``[moe]`` routed layers."""

    model: ModelConfig
    runs: list[RunPlan] = Field(min_length=1)
    moe: MoEPlan | None = None

    @model_validator(mode="after")
    def _experts_fit_layout(self) -> "PlanConfig":
        for i, run in enumerate(self.runs):
            if self.moe is None and run.expert_parallel > 1:
                raise ValueError(f"runs.{i}.expert_parallel = {run.expert_parallel} needs a [moe] section; "
                                 "remove it or declare the experts")
            if self.moe is not None:
                if self.moe.experts % run.expert_parallel:
                    raise ValueError(f"runs.{i}.expert_parallel = {run.expert_parallel} must divide moe.experts = "
                                     f"{self.moe.experts}")
                self.moe.shape(run.model or self.model)  # the routed blocks exist in every run's shape
        return self


@dataclass
class PlanTable:
    title: str
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, label: str, value: str, note: str = "") -> None:
        self.rows.append((label, value, note))


def load_plan(path: Path) -> PlanConfig:
    """A plan file, or the ``[main]`` run of an experiment config on the detected device.

    Raises:
        ConfigError: unreadable TOML or invalid fields (named with their path).
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from err
    if "runs" not in raw and "main" in raw:
        from flows.config import parse_config

        return experiment_plan(parse_config(raw, origin=str(path)))
    return PlanConfig.validate_strict(raw, str(path))


def experiment_plan(cfg) -> PlanConfig:
    """The plan of an experiment config (``flows.config.ExperimentConfig``) on the detected device: its ``[main]``
    run, and with ``[cpt] kind = "context_extension"`` the extension grid at ``cpt.context.target_seq_len``. The
    model is ``[main] model`` with the tokenizer's vocab_size padded to ``pad_multiple`` (docs/methods.md §8).

    Raises:
        ConfigError: a position recipe cannot extend the main model.
    """
    main = cfg.main
    model = main.model.build(-(-cfg.tokenizer.vocab_size // cfg.tokenizer.pad_multiple) * cfg.tokenizer.pad_multiple)
    tokens = main.budget.steps * main.budget.batch_size * main.model.seq_len
    runs = [RunPlan(name="main", tokens=tokens, devices=1, zero_stage=0, micro_batch=main.budget.batch_size,
                    check_this_machine=True)]
    if cfg.cpt.kind == "context_extension":
        runs.append(_context_extension_run(cfg.cpt, model))
    return PlanConfig(model=model, runs=runs)


def _context_extension_run(cpt, base: ModelConfig) -> RunPlan:
    """The ``[cpt]`` context-extension grid as one run at ``target_seq_len`` T' (docs/methods.md §15): every
    candidate (recipe × replay fraction × peak LR × seed) trains ``steps × batch_size`` rows of T' tokens.

    The shape is ``extended_config(base, T', recipe)``; RoPE has no parameters and the FLOPs and memory do not depend
    on the recipe, so the first recipe's config stands for all of them.

    Raises:
        ConfigError: a recipe that cannot extend ``base`` (``models.context.extended_config``'s reason).
    """
    from models.context import extended_config

    context = cpt.context
    target = context.target_seq_len
    try:
        lines = {f"recipe {r.name}": r.describe(base, target) for r in context.recipes}
        model = extended_config(base, target, context.recipes[0])
    except ValueError as err:
        raise ConfigError(f"cpt.context.recipes: {err}") from None
    grid = (len(context.recipes), len(cpt.replay_fractions), len(cpt.peak_lrs), len(cpt.seeds))
    candidates = grid[0] * grid[1] * grid[2] * grid[3]
    factors = " × ".join(f"{n} {noun}{'s' if n != 1 else ''}" for n, noun in
                         zip(grid, ("recipe", "replay fraction", "peak LR", "seed")))
    notes = {"candidates": f"{candidates} = {factors}, each {cpt.budget.steps} steps × {cpt.budget.batch_size} rows "
                           f"× {target} tokens", **lines}
    if cpt.base_checkpoint:
        notes["base"] = (f"planned on the [main] model; cpt.base_checkpoint {cpt.base_checkpoint} trains its own "
                         "shape")
    tokens = candidates * cpt.budget.steps * cpt.budget.batch_size * target
    return RunPlan(name="cpt context extension", tokens=tokens, devices=1, zero_stage=0,
                   micro_batch=cpt.budget.batch_size, check_this_machine=True, model=model, notes=notes)


@dataclass(frozen=True)
class FittedLaw:
    """A scaling law fitted by an experiment's ladder (``tasks.ladder``): its constants, the artifact they come
    from and the form fitted (``full`` or a reduced form, whose forecast is not trusted)."""

    law: Chinchilla
    artifact_key: str
    form: str
    verdict: str
    reason: str = ""  # why the ladder's forecast is undetermined ("" when decided)


def ladder_law(path: Path, layout: Any) -> tuple[FittedLaw | None, str]:
    """The law fitted by the ladder artifact of the experiment config at ``path`` in the runs folder ``layout``
    (``infra.runs.RunsLayout``), found by the config's own chain of keys; None and the reason when there is none
    (a plan file, a disabled ladder, no such artifact, or keys that cannot be computed here). Reads only.
    """
    from flows.config import load_config
    from flows.keys import chain_keys
    from infra.artifacts import ArtifactStore
    from infra.errors import PretrainError

    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from err
    if "runs" in raw or "main" not in raw:
        return None, "a plan file has no ladder"
    cfg = load_config(path)
    if not cfg.ladder.enabled:
        return None, "[ladder] is not enabled in this config"
    try:
        key = chain_keys(cfg, until="ladder")["ladder"].key
    except PretrainError as err:
        return None, f"the ladder's key cannot be computed here: {err}"
    artifact = ArtifactStore(layout.artifacts).get("ladder", key)
    if artifact is None or not (artifact.path / "forecast.json").is_file():
        return None, f"no complete ladder artifact {key} in {layout.artifacts} (run `pretrain run CONFIG`)"
    forecast = json.loads((artifact.path / "forecast.json").read_text())
    fitted = forecast["law"]
    if min(fitted["alpha"], fitted["beta"], fitted["A"], fitted["B"]) <= 0:
        return None, (f"the law of ladder artifact {key} has a zero exponent or coefficient (α {fitted['alpha']:.3g}, "
                      f"β {fitted['beta']:.3g}): no compute-optimal allocation to plan with")
    law = Chinchilla(E=fitted["E"], A=fitted["A"], B=fitted["B"], alpha=fitted["alpha"], beta=fitted["beta"])
    reasons = forecast.get("assessment", {}).get("reasons")
    reason = ("; ".join(r["problem"] for r in reasons) if reasons is not None
              else forecast["decision"].get("resolve", ""))
    return FittedLaw(law, key, fitted["form"], forecast["decision"]["verdict"], reason), f"ladder artifact {key}"


def build_plan(plan: PlanConfig, law: FittedLaw | None = None, law_note: str = "") -> list[PlanTable]:
    """The tables of a plan: shape (and its routed layers with ``[moe]``), then per run compute/time, memory,
    parallelism and recovery (and expert parallelism), then the scaling allocation: with ``law`` the ladder's
    fitted constants (N non-embedding), else the published Chinchilla ones (``law_note``: why no fitted law was
    used, shown in the table). A fitted law whose forecast is not decided is not planned on: the published
    constants are, and the ``law`` row says why."""
    cfg = plan.model
    counts = param_count(cfg)
    shape = PlanTable("Model" if plan.moe is None else "Model: the dense shape, before routing")
    shape.add("parameters", f"{counts.total:,}", "docs/methods.md §2 closed form")
    shape.add("blocks", f"{counts.blocks:,}")
    shape.add("embedding", f"{counts.embedding:,}", "untied: input + output" if not cfg.tied_embeddings else "tied")
    tables = [shape]
    if plan.moe is not None:
        tables.append(_moe_table(cfg, plan.moe))
    for run in plan.runs:
        tables += _run_tables(cfg, run, plan.moe)
    if law is not None and law.verdict != "decided":
        # An undetermined fit's constants can sit on their bounds (α = 4): its allocation would be meaningless.
        law_note = (f"ladder artifact {law.artifact_key} fitted a law whose forecast is {law.verdict} "
                    f"({law.reason or 'see its forecast.json'}): its constants are not used")
        law = None
    if law is None:
        table = _chinchilla(cfg, plan.runs[0].tokens, Chinchilla(), param_count(cfg).total,
                            "Chinchilla allocation (L = 1.69 + 406.4/N^0.34 + 410.7/D^0.28, C6 = 6ND)")
        table.rows.insert(0, ("law", "published (Hoffmann et al. 2022)", law_note))
    else:
        c = law.law
        table = _chinchilla(cfg, plan.runs[0].tokens, c, param_count(cfg).blocks,
                            f"Fitted scaling law of the ladder (L = {c.E:.4g} + {c.A:.4g}/N^{c.alpha:.3g} + "
                            f"{c.B:.4g}/D^{c.beta:.3g}, N non-embedding, C6 = 6ND)")
        table.rows.insert(0, ("law", f"fitted by ladder artifact {law.artifact_key}",
                              f"{law.form} form, decided; used instead of the published Chinchilla constants"))
    if plan.moe is not None:
        table.rows.insert(1, ("mixture of experts", "not covered", "the allocation is the dense [model]'s; routed "
                              "models follow laws of their own (Clark et al. 2022)"))
    tables.append(table)
    return tables


def _moe_table(cfg: ModelConfig, moe: MoEPlan) -> PlanTable:
    """Total and active parameters, FLOPs per token from the active ones, the load-balancing loss and the bounds
    on dropped tokens of the routed model (docs/methods.md §2, §4)."""
    shape = moe.shape(cfg)
    counts = moe_param_count(cfg, shape)
    e, k = shape.experts, shape.top_k
    table = PlanTable(f"Mixture of experts ({e} experts, top-{k})")
    table.add("MoE layers", moe.describe_layers(cfg), "their dense FFN replaced by E experts and a d × E router")
    table.add("experts", f"{e} × d_ff {shape.d_ff_expert:,}, top-{k}",
              f"each token runs {k} of {e} SwiGLU experts (Lepikhin et al. 2020; Fedus et al. 2022)")
    table.add("total parameters", f"{counts.total:,}",
              "N − n_moe·3·d·d_ff + n_moe·(E·3·d·d_ff_e + d·E): stored and checkpointed")
    table.add("active parameters", f"{counts.active:,}",
              f"{counts.active / counts.total:.1%} of total: dense + router + k experts per MoE layer")
    table.add("expert parameters", f"{counts.expert:,}",
              f"E·3·d·d_ff_e per MoE layer; dense (replicated) {counts.dense:,}, routers {counts.router:,}")
    per_token = moe_flops_per_token(cfg, shape)
    table.add("FLOPs per token", f"{per_token:,.0f}", "6·N_active_matmul + 6·L·d·T, docs/methods.md §1 on active "
              "parameters")
    table.add("6·N_active per token", f"{6 * counts.active:,}", "the 6N shortcut on active parameters")
    alpha = shape.aux_loss_coef
    table.add("load-balancing loss", f"α·E·Σ f_i·P_i, α = {alpha:g}",
              f"= α = {alpha:g} at perfect balance (f_i = P_i = 1/E); α·E = {alpha * e:g} with every token on one "
              "expert (Fedus et al. 2022)")
    least, most = dropped_share_bounds(shape)
    c = shape.capacity_factor
    table.add("tokens dropped", "0 at perfect balance" if least == 0 else f"at least {least:.1%}",
              f"capacity C·tokens·k/E, C = {c:g}: at most max(0, 1 − C·k/E) = {most:.1%} (every token on the same "
              f"{k} experts); an expert overflows past {c:g}× its balanced load")
    return table


def _elapsed(seconds: float) -> str:
    """A time under a day, in the unit that shows it: 3.2 h, 41.0 min, 12.50 s, 3.1 ms, 7.6 µs."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else _duration(seconds)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _traffic(traffic, links: Links) -> str:
    return f"{traffic.total / GB:,.2f} GB per step, {_duration(traffic.seconds(links))}"


def _link_note(links: Links, span: int) -> str:
    return f"{links.where(span)} {links.bandwidth(span) / GB:g} GB/s"


def _window_table(base: ModelConfig, run: RunPlan) -> PlanTable:
    """How a run at its own window T' compares with the plan's T: FLOPs per token (6·N_matmul + 6·L·d·T, so
    + 6·L·d·(T' − T)), the attention share 6·L·d·T / FLOPs per token, and the activations of one micro-batch
    (linear in T with fused attention) (docs/methods.md §1, §3)."""
    cfg = run.model
    table = PlanTable(f"{run.name}: context window {base.seq_len} → {cfg.seq_len} tokens")
    per_token = {}
    for label, shape in (("T", base), ("T'", cfg)):
        per_token[label] = flops_per_token(shape)
        attention = 6 * shape.n_layers * shape.d_model * shape.seq_len
        note = "6·N_matmul + 6·L·d·T, docs/methods.md §1"
        if label == "T'":
            note = f"{per_token[label] - per_token['T']:+,.0f} = 6·L·d·(T' − T)"
        table.add(f"FLOPs per token at {label} = {shape.seq_len}", f"{per_token[label]:,.0f}", note)
        table.add(f"attention FLOPs share at {label} = {shape.seq_len}", f"{attention / per_token[label]:.2%}",
                  f"6·L·d·{label} = {attention:,} of the FLOPs per token")
    for label, shape in (("T", base), ("T'", cfg)):
        table.add(f"activations at {label} = {shape.seq_len}",
                  f"{activation_bytes(shape, run.micro_batch, checkpointing=run.checkpointing):,.0f} B",
                  f"micro-batch {run.micro_batch}, bf16, fused attention, docs/methods.md §3")
    return table


def _run_tables(plan_cfg: ModelConfig, run: RunPlan, moe: MoEPlan | None = None) -> list[PlanTable]:
    cfg = plan_cfg if run.model is None else run.model
    routed = None if moe is None else moe.shape(cfg)
    if routed is None:
        n = n_flops = param_count(cfg).total
        flops, c6 = training_flops(cfg, run.tokens), flops_6nd(cfg, run.tokens)
        flops_note, c6_note = "(6·N_matmul + 6·L·d·T)·D, docs/methods.md §1", "scaling-law convention"
    else:
        counts = moe_param_count(cfg, routed)
        n, n_flops = counts.total, counts.active
        flops, c6 = moe_flops_per_token(cfg, routed) * run.tokens, 6.0 * counts.active * run.tokens
        flops_note = "(6·N_active_matmul + 6·L·d·T)·D, docs/methods.md §1 on active parameters"
        c6_note = "6·N_active·D"
    compute = PlanTable(f"{run.name}: compute and time ({run.tokens:.3g} tokens, {run.devices} × {run.device})")
    compute.add("training FLOPs", f"{flops:.4g}", flops_note)
    compute.add("6ND shortcut", f"{c6:.4g}", f"{(c6 / flops - 1):+.1%} ({c6_note})")
    compute.add("GPU-hours", f"{gpu_hours(flops, run.rate):,.1f}", f"at {run.rate:.3g} FLOP/s per device")
    hours = elapsed_hours(flops, run.devices, run.rate)
    compute.add("elapsed", f"{hours:,.2f} h = {hours / 24:.2f} days" if hours >= 1 else _elapsed(hours * 3600))
    peak = DEVICE_PEAK_BF16[run.device]
    for mfu in run.mfu:
        days = elapsed_hours(flops, run.devices, rate_at_mfu(mfu, peak)) / 24
        compute.add(f"elapsed at MFU {mfu:.0%}", f"{days:.1f} days" if days >= 1 else _elapsed(days * 86400),
                    f"of {peak / 1e12:.0f} TFLOP/s bf16 peak")
    if run.flop_conventions:
        _conventions(compute, cfg, run, n_flops, flops, peak)
    for label, text in run.notes.items():
        compute.add(label, text)
    tables = [compute]
    if cfg.seq_len != plan_cfg.seq_len:
        tables.append(_window_table(plan_cfg, run))
    tables.append(_memory_table(cfg, run, routed))
    parallel = PlanTable(f"{run.name}: parallelism and recovery")
    parallel.add("global batch", f"{run.micro_batch * run.grad_accum * run.devices:,} sequences",
                 f"{run.micro_batch} × {run.grad_accum} × {run.devices} (micro-batch × accumulation × DP)")
    if run.pipeline_stages > 1:
        parallel.add("pipeline bubble", f"{pipeline_bubble(run.pipeline_stages, run.pipeline_micro_batches):.1%}",
                     f"p = {run.pipeline_stages}, m = {run.pipeline_micro_batches}")
    each, per_step = tensor_parallel_traffic(cfg, run.micro_batch)
    parallel.add("if tensor-parallel", f"{each:,.0f} B per all-reduce, {per_step / GB:.2f} GB per micro-batch",
                 f"{per_step / 450e9 * 1e3:.1f} ms at 450 GB/s, {per_step / 50e9 * 1e3:.0f} ms at 50 GB/s")
    if run.devices > 1:
        _data_parallel_rows(parallel, cfg, run, routed, flops / run.tokens)
    tau, overhead = young_interval(run.save_seconds, run.mtbf_hours * 3600)
    young = f"δ = {run.save_seconds:g} s, M = {run.mtbf_hours:g} h"
    if tau < hours * 3600:
        parallel.add("checkpoint interval", f"{tau / 60:.1f} min", f"Young, {young}: overhead {overhead:.1%}")
    else:  # a run shorter than the interval needs no checkpoint before its end
        parallel.add("checkpoint interval", "none: the run is shorter than one",
                     f"Young's interval {tau / 60:.1f} min ({young}) > the run's {_elapsed(hours * 3600)}")
    states, with_weights = checkpoint_bytes(n)
    parallel.add("checkpoint size", f"{states / GB:.1f} GB master + moments; {with_weights / GB:.1f} GB with bf16 "
                 "weights",
                 f"{states / 2e9:.0f}–{with_weights / 2e9:.0f} s at 2 GB/s")
    tables.append(parallel)
    if routed is not None:
        tables.append(_expert_parallel_table(cfg, run, routed))
    return tables


def _conventions(compute: PlanTable, cfg: ModelConfig, run: RunPlan, n_flops: int, flops: float,
                 peak: float) -> None:
    """The PaLM count and HFU beside the architecture-aware MFU (docs/methods.md §1): at a fixed step time a
    utilisation scales with the FLOPs its count charges."""
    mfu = run.rate / peak
    compute.add("MFU at the planning rate", f"{mfu:.1%}", f"{run.rate:.3g} ÷ {peak:.3g} FLOP/s, architecture-aware "
                "count")
    if "palm" in run.flop_conventions:
        palm = palm_flops_per_token(n_flops, cfg.n_layers, cfg.seq_len, cfg.d_model) * run.tokens
        compute.add("PaLM FLOPs", f"{palm:.4g}", f"(6·N + 12·L·T·d)·D (Chowdhery et al. 2022, App. B): "
                    f"{palm / flops - 1:+.1%} vs the architecture-aware count")
        compute.add("MFU at the planning rate, PaLM count", f"{mfu * palm / flops:.1%}",
                    "the same step time charged PaLM's FLOPs")
    if "hfu" in run.flop_conventions:
        hardware = hardware_flops_per_token(flops, run.checkpointing)
        why = ("full checkpointing recomputes the forward: 8·N_matmul + 8·L·d·T per token (× 8/6)"
               if run.checkpointing else "no recomputation: HFU = MFU")
        compute.add("hardware FLOPs", f"{hardware:.4g}", why)
        compute.add("HFU at the planning rate", f"{hfu_from_mfu(mfu, run.checkpointing):.1%}",
                    "MFU × 8/6" if run.checkpointing else "= MFU")
        compute.add("HFU at " + " / ".join(f"MFU {m:.0%}" for m in run.mfu),
                    " / ".join(f"{hfu_from_mfu(m, run.checkpointing):.1%}" for m in run.mfu),
                    "HFU = MFU · hardware FLOPs ÷ model FLOPs")


def _memory_table(cfg: ModelConfig, run: RunPlan, routed: MoEShape | None) -> PlanTable:
    """Model states by ZeRO stage over the shard group (all devices, or G with HSDP; experts also over EP), the
    chosen layout's fit, and the other checkpointing choice (docs/methods.md §3)."""
    layout = "" if run.shard_group is None else f", sharded within {run.shard_group} of {run.devices} (HSDP)"
    layout += "" if routed is None else f", experts over EP {run.expert_parallel}"
    memory = PlanTable(f"{run.name}: memory per device (ZeRO-{run.zero_stage}, micro-batch {run.micro_batch}"
                       f"{layout})")
    device_gb = DEVICE_MEMORY_GB[run.device]

    def fit(stage: int, checkpointing: bool, gb: float = device_gb, headroom: float = run.headroom,
            activation_dtype_bytes: int = 2):
        common = dict(micro_batch=run.micro_batch, device_gb=gb, zero_stage=stage, checkpointing=checkpointing,
                      headroom=headroom, bytes_per_param=run.state_bytes_per_param,
                      activation_dtype_bytes=activation_dtype_bytes)
        if routed is None:
            return memory_fit(cfg, ranks=run.shard, **common)
        return moe_memory_fit(cfg, routed, shard=run.shard, expert_parallel=run.expert_parallel, **common)

    for stage in range(4):
        chosen = fit(stage, run.checkpointing)
        memory.add(f"model states, ZeRO-{stage}", f"{chosen.states / GB:.2f} GB",
                   "← chosen: " + chosen.describe() if stage == run.zero_stage else "")
    other = fit(run.zero_stage, not run.checkpointing)
    memory.add("total without checkpointing" if run.checkpointing else "total with full checkpointing",
               f"{other.total / GB:.2f} GB", other.describe())
    if run.state_bytes_per_param != 16:
        memory.add("state bytes per parameter", f"{run.state_bytes_per_param}",
                   f"instead of 16; ZeRO-1 shards its optimiser share of {run.state_bytes_per_param - 4} "
                   "(docs/methods.md §3)")
    if routed is not None:
        memory.add("MoE activations", "estimate",
                   "per routed block 12·d + 4·n_kv·d_h + C·k·(6·d_ff_e + 2·d) + 4·E "
                   "bytes per token (docs/methods.md §3 with the FFN routed)")
    if run.check_this_machine:
        name, memory_gb = detected_device()
        here = fit(run.zero_stage, run.checkpointing, memory_gb, 0.1, 4 if name == "cpu" else 2)
        memory.add(f"on this machine ({name})", f"{here.total / GB:.2f} GB",
                   here.describe() + ("; fp32 activations on CPU" if name == "cpu" else "") +
                   " (the check `pretrain run` applies)")
    return memory


def _data_parallel_rows(parallel: PlanTable, cfg: ModelConfig, run: RunPlan, routed: MoEShape | None,
                        flops_per_token_: float) -> None:
    """Gradient and weight traffic per step and device for DDP/ZeRO-1/2, ZeRO-3 and HSDP, timed on the declared
    links, beside the step's compute (docs/methods.md §4; Rajbhandari et al. 2020)."""
    links, d, b = run.links, run.devices, run.comm_bytes
    counts = None if routed is None else moe_param_count(cfg, routed)

    def traffic(stage: int, shard_group: int | None, micro_batches: int = 1):
        if counts is None:
            return data_parallel_traffic(param_count(cfg).total, stage, d, shard_group=shard_group, comm_bytes=b,
                                         micro_batches=micro_batches)
        return moe_data_parallel_traffic(counts, stage, d, expert_parallel=run.expert_parallel,
                                         shard_group=shard_group, comm_bytes=b, micro_batches=micro_batches)

    step = run.micro_batch * run.grad_accum * cfg.seq_len * flops_per_token_ / run.rate
    parallel.add("compute per step", _duration(step),
                 f"{run.micro_batch} × {run.grad_accum} × {cfg.seq_len:,} tokens per device at {run.rate:.3g} "
                 "FLOP/s: what the traffic below can overlap with")
    experts = "" if counts is None else "; experts' 1/EP over D/EP ranks"
    flat_chosen = run.shard_group is None
    low, full = traffic(1, None), traffic(3, None)
    mark = "← chosen; " if flat_chosen and run.zero_stage < 3 else ""
    parallel.add("DDP / ZeRO-1 / ZeRO-2 traffic", _traffic(low, links),
                 f"{mark}2·(D − 1)/D·N·bytes, reduce-scatter + all-gather, D = {d}, {b} B per element, "
                 f"{_link_note(links, d)} (Rajbhandari et al. 2020){experts}")
    mark = "← chosen; " if flat_chosen and run.zero_stage == 3 else ""
    parallel.add("ZeRO-3 traffic", _traffic(full, links),
                 f"{mark}3·(D − 1)/D·N·bytes: weights all-gathered in forward and backward + gradient "
                 f"reduce-scatter; {full.total / low.total:.2f}× ZeRO-1/2")
    if run.grad_accum > 1:
        again = traffic(3, None, run.grad_accum)
        parallel.add("ZeRO-3 traffic, per micro-batch", _traffic(again, links),
                     f"3·a·(D − 1)/D·N·bytes, a = {run.grad_accum}: weights re-gathered and gradients "
                     "reduce-scattered for every micro-batch (the ZeRO-3/FSDP default under accumulation)")
    group = run.shard_group
    if group is None and d > run.devices_per_node and d % run.devices_per_node == 0 and \
            run.devices_per_node % run.expert_parallel == 0:
        group = run.devices_per_node  # the usual alternative: shard within a node, replicate across nodes
    if group is not None and group != d:
        hybrid = traffic(run.zero_stage, group)
        label = "HSDP traffic" if run.shard_group is not None else f"if HSDP within a node (G = {group})"
        mark = "← chosen; " if run.shard_group is not None else ""
        note = (f"{mark}within G = {group}: {hybrid.within / GB:,.2f} GB ({_link_note(links, group)}); across "
                f"D/G = {d // group}: all-reduce of 1/G, 2·(R − 1)/R·N·bytes/G = {hybrid.across / GB:,.2f} GB "
                f"({_link_note(links, d)}); ZeRO-{run.zero_stage} within the group")
        if run.shard_group is None:
            if routed is None:
                states = memory_fit(cfg, micro_batch=run.micro_batch, device_gb=DEVICE_MEMORY_GB[run.device],
                                    zero_stage=run.zero_stage, ranks=group,
                                    bytes_per_param=run.state_bytes_per_param).states
            else:
                states = moe_memory_fit(cfg, routed, micro_batch=run.micro_batch,
                                        device_gb=DEVICE_MEMORY_GB[run.device], zero_stage=run.zero_stage,
                                        shard=group, expert_parallel=run.expert_parallel,
                                        bytes_per_param=run.state_bytes_per_param).states
            note += f"; states {states / GB:.2f} GB per device (÷ G instead of ÷ D)"
        parallel.add(label, _traffic(hybrid, links), note)


def _expert_parallel_table(cfg: ModelConfig, run: RunPlan, routed: MoEShape) -> PlanTable:
    """Experts per device, capacity, and the all-to-all of dispatch and combine (docs/methods.md §4; Lepikhin
    et al. 2020; Fedus et al. 2022)."""
    ep, e, k = run.expert_parallel, routed.experts, routed.top_k
    table = PlanTable(f"{run.name}: expert parallelism (EP {ep})")
    table.add("experts per device", f"{e // ep} of {e} per MoE layer",
              f"expert weights sharded over EP = {ep}; the same experts on {run.shard // ep} devices per shard group")
    tokens = run.micro_batch * cfg.seq_len
    table.add("expert capacity", f"{expert_capacity(tokens, routed):,.0f} tokens per expert per micro-batch",
              f"C·tokens·k/E = {routed.capacity_factor:g} × {tokens:,} × {k} / {e} (Fedus et al. 2022)")
    per_token = 2 * k * cfg.d_model * run.comm_bytes
    table.add("all-to-all per token per MoE layer", f"{per_token:,} B forward",
              "2·k·d·bytes: dispatch + combine, before the (EP − 1)/EP share on other devices "
              "(docs/methods.md §4)")
    step = moe_step_all_to_all_bytes(cfg, routed, micro_batch=run.micro_batch, micro_batches=run.grad_accum,
                                     expert_parallel=ep, dtype_bytes=run.comm_bytes)
    links = run.links
    table.add("all-to-all per step", f"{step / GB:,.2f} GB per device, {_duration(step / links.bandwidth(ep))}",
              f"4 × {len(routed.moe_layers)} MoE layers × {run.grad_accum} micro-batches × "
              "tokens·d·bytes·k·(EP − 1)/EP "
              f"(dispatch + combine, forward and backward; Lepikhin et al. 2020), {_link_note(links, ep)}")
    return table


def _chinchilla(cfg: ModelConfig, tokens: float, law: Chinchilla, n: int, title: str) -> PlanTable:
    """The allocation table of ``law`` for this run of ``n`` parameters (its convention) and ``tokens``."""
    c6 = 6.0 * n * tokens
    table = PlanTable(title)
    loss = law.loss(n, tokens)
    table.add("this run", f"N {_si(n)}, D {_si(tokens)}", f"loss {loss:.3f}")
    n_opt, d_opt = law.optimum(c6)
    table.add("same-compute optimum", f"N {_si(n_opt)}, D {_si(d_opt)}", f"loss {law.loss(n_opt, d_opt):.3f}")
    n20, d20 = tokens_per_param_allocation(c6)
    table.add("20 tokens/param", f"N {_si(n20)}, D {_si(d20)}", f"loss {law.loss(n20, d20):.3f}")
    try:
        n_eq, d_eq = law.equal_loss_optimum(loss)
    except ValueError as err:  # far outside the fit's range (a toy model): say so instead of a wrong answer
        table.add("equal-loss optimum", "outside the fit's range", str(err))
        return table
    table.add("equal-loss optimum", f"N {_si(n_eq)}, D {_si(d_eq)}", f"C6 {6 * n_eq * d_eq:.4g}")
    breakeven = served_token_break_even(n, tokens, n_eq, d_eq)
    verdict = ("never" if breakeven == float("inf") else "already optimal" if breakeven == 0
               else f"{breakeven:.4g} tokens")
    table.add("served-token break-even", verdict, "extra training FLOPs ÷ serving FLOPs saved (2N per token)")
    return table


def _si(x: float) -> str:
    """3 significant digits in the largest unit ≥ 1: 9.55B, 2.00T, 126M; past 1000T as 1.14e+34; below 1k plain."""
    rounded = float(f"{x:.3g}")
    if rounded >= 1e15:
        return f"{rounded:.3g}"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if rounded >= scale:
            return f"{rounded / scale:#.3g}".rstrip(".") + unit  # '#' keeps the zeros of 15.0B and 2.00T
    return f"{x:.3g}"


def as_rows(tables: list[PlanTable]) -> list[dict[str, Any]]:
    """Flat rows (section, label, value, note), e.g. for JSON output."""
    return [dict(section=t.title, label=label, value=value, note=note) for t in tables for label, value, note in t.rows]
