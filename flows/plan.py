"""``pretrain plan``: the pre-launch arithmetic of a run, before any device is booked (docs/methods.md §1–§5).

A plan file holds one ``[model]`` shape and one or more ``[[runs]]`` (pretraining, CPT, ...) with their tokens,
devices and layout; a run may train a shape of its own (``[runs.model]``, e.g. a context extension at a longer
seq_len). An experiment config is planned too, from its ``[main]`` section on the detected device, and, when its
``[cpt] kind = "context_extension"``, the extension grid at ``cpt.context.target_seq_len`` (docs/methods.md §15).
The plan is a list of tables (section, rows of label/value/note) so the CLI can print it and tests can read it.

    pretrain plan configs/plan_case_study.toml
    pretrain plan configs/demo.toml --runs-dir runs   # with the law its scaling ladder fitted, when there is one

The scaling table uses the published Chinchilla constants (Hoffmann et al. 2022), or, for an experiment config whose
``[ladder]`` artifact is in the runs folder, the constants that ladder fitted (``ladder_law``; N is then the
non-embedding parameter count, the ladder's convention). The table's title and its ``law`` row say which.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from infra.errors import ConfigError
from infra.section import Section
from models.arithmetic import flops_6nd, flops_per_token, param_count, training_flops
from models.config import ModelConfig
from models.planning import (DEVICE_MEMORY_GB, DEVICE_PEAK_BF16, GB, PLANNING_RATE, Chinchilla, activation_bytes,
                             checkpoint_bytes, detected_device, elapsed_hours, gpu_hours, memory_fit, pipeline_bubble,
                             rate_at_mfu, served_token_break_even, tensor_parallel_traffic,
                             tokens_per_param_allocation, young_interval)


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


class PlanConfig(Section):
    """A plan file: the model shape and its runs."""

    model: ModelConfig
    runs: list[RunPlan] = Field(min_length=1)


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
    return FittedLaw(law, key, fitted["form"], forecast["decision"]["verdict"]), f"ladder artifact {key}"


def build_plan(plan: PlanConfig, law: FittedLaw | None = None, law_note: str = "") -> list[PlanTable]:
    """The tables of a plan: shape, then per run compute/time, memory, parallelism and recovery, then the scaling
    allocation: with ``law`` the ladder's fitted constants (N non-embedding), else the published Chinchilla ones
    (``law_note``: why no fitted law was used, shown in the table)."""
    cfg = plan.model
    counts = param_count(cfg)
    shape = PlanTable("Model")
    shape.add("parameters", f"{counts.total:,}", "docs/methods.md §2 closed form")
    shape.add("blocks", f"{counts.blocks:,}")
    shape.add("embedding", f"{counts.embedding:,}", "untied: input + output" if not cfg.tied_embeddings else "tied")
    tables = [shape]
    for run in plan.runs:
        tables += _run_tables(cfg, run)
    if law is None:
        table = _chinchilla(cfg, plan.runs[0].tokens, Chinchilla(), param_count(cfg).total,
                            "Chinchilla allocation (L = 1.69 + 406.4/N^0.34 + 410.7/D^0.28, C6 = 6ND)")
        table.rows.insert(0, ("law", "published (Hoffmann et al. 2022)", law_note))
    else:
        c = law.law
        table = _chinchilla(cfg, plan.runs[0].tokens, c, param_count(cfg).blocks,
                            f"Fitted scaling law of the ladder (L = {c.E:.4g} + {c.A:.4g}/N^{c.alpha:.3g} + "
                            f"{c.B:.4g}/D^{c.beta:.3g}, N non-embedding, C6 = 6ND)")
        trust = "" if law.verdict == "decided" else f"; its forecast is {law.verdict}"
        table.rows.insert(0, ("law", f"fitted by ladder artifact {law.artifact_key}",
                              f"{law.form} form{trust}; used instead of the published Chinchilla constants"))
    tables.append(table)
    return tables


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


def _run_tables(plan_cfg: ModelConfig, run: RunPlan) -> list[PlanTable]:
    cfg = plan_cfg if run.model is None else run.model
    n = param_count(cfg).total
    flops, c6 = training_flops(cfg, run.tokens), flops_6nd(cfg, run.tokens)
    compute = PlanTable(f"{run.name}: compute and time ({run.tokens:.3g} tokens, {run.devices} × {run.device})")
    compute.add("training FLOPs", f"{flops:.4g}", "(6·N_matmul + 6·L·d·T)·D, docs/methods.md §1")
    compute.add("6ND shortcut", f"{c6:.4g}", f"{(c6 / flops - 1):+.1%} (scaling-law convention)")
    compute.add("GPU-hours", f"{gpu_hours(flops, run.rate):,.1f}", f"at {run.rate:.3g} FLOP/s per device")
    hours = elapsed_hours(flops, run.devices, run.rate)
    compute.add("elapsed", f"{hours:,.2f} h = {hours / 24:.2f} days")
    peak = DEVICE_PEAK_BF16[run.device]
    for mfu in run.mfu:
        days = elapsed_hours(flops, run.devices, rate_at_mfu(mfu, peak)) / 24
        compute.add(f"elapsed at MFU {mfu:.0%}", f"{days:.1f} days", f"of {peak / 1e12:.0f} TFLOP/s bf16 peak")
    for label, text in run.notes.items():
        compute.add(label, text)
    memory = PlanTable(f"{run.name}: memory per device (ZeRO-{run.zero_stage}, micro-batch {run.micro_batch})")
    device_gb = DEVICE_MEMORY_GB[run.device]
    for stage in range(4):
        fit = memory_fit(cfg, micro_batch=run.micro_batch, device_gb=device_gb, zero_stage=stage, ranks=run.devices,
                         checkpointing=run.checkpointing, headroom=run.headroom)
        memory.add(f"model states, ZeRO-{stage}", f"{fit.states / GB:.2f} GB",
                   "← chosen: " + fit.describe() if stage == run.zero_stage else "")
    other = memory_fit(cfg, micro_batch=run.micro_batch, device_gb=device_gb, zero_stage=run.zero_stage,
                       ranks=run.devices, checkpointing=not run.checkpointing, headroom=run.headroom)
    memory.add("total without checkpointing" if run.checkpointing else "total with full checkpointing",
               f"{other.total / GB:.2f} GB", other.describe())
    if run.check_this_machine:
        name, memory_gb = detected_device()
        here = memory_fit(cfg, micro_batch=run.micro_batch, device_gb=memory_gb, zero_stage=run.zero_stage,
                          ranks=run.devices, checkpointing=run.checkpointing, headroom=0.1,
                          activation_dtype_bytes=4 if name == "cpu" else 2)
        memory.add(f"on this machine ({name})", f"{here.total / GB:.2f} GB",
                   here.describe() + ("; fp32 activations on CPU" if name == "cpu" else "") +
                   " (the check `pretrain run` applies)")
    parallel = PlanTable(f"{run.name}: parallelism and recovery")
    parallel.add("global batch", f"{run.micro_batch * run.grad_accum * run.devices:,} sequences",
                 f"{run.micro_batch} × {run.grad_accum} × {run.devices} (micro-batch × accumulation × DP)")
    if run.pipeline_stages > 1:
        parallel.add("pipeline bubble", f"{pipeline_bubble(run.pipeline_stages, run.pipeline_micro_batches):.1%}",
                     f"p = {run.pipeline_stages}, m = {run.pipeline_micro_batches}")
    each, per_step = tensor_parallel_traffic(cfg, run.micro_batch)
    parallel.add("if tensor-parallel", f"{each:,.0f} B per all-reduce, {per_step / GB:.2f} GB per micro-batch",
                 f"{per_step / 450e9 * 1e3:.1f} ms at 450 GB/s, {per_step / 50e9 * 1e3:.0f} ms at 50 GB/s")
    tau, overhead = young_interval(run.save_seconds, run.mtbf_hours * 3600)
    parallel.add("checkpoint interval", f"{tau / 60:.1f} min", f"Young, δ = {run.save_seconds:g} s, "
                 f"M = {run.mtbf_hours:g} h: overhead {overhead:.1%}")
    states, with_weights = checkpoint_bytes(n)
    parallel.add("checkpoint size", f"{states / GB:.1f} GB master + moments; {with_weights / GB:.1f} GB with bf16 "
                 "weights",
                 f"{states / 2e9:.0f}–{with_weights / 2e9:.0f} s at 2 GB/s")
    window = [_window_table(plan_cfg, run)] if cfg.seq_len != plan_cfg.seq_len else []
    return [compute, *window, memory, parallel]


def _chinchilla(cfg: ModelConfig, tokens: float, law: Chinchilla, n: int, title: str) -> PlanTable:
    """The allocation table of ``law`` for this run of ``n`` parameters (its convention) and ``tokens``."""
    c6 = 6.0 * n * tokens
    table = PlanTable(title)
    loss = law.loss(n, tokens)
    table.add("this run", f"N {_si(n)}, D {_si(tokens)}", f"loss {loss:.6f}")
    n_opt, d_opt = law.optimum(c6)
    table.add("same-compute optimum", f"N {_si(n_opt)}, D {_si(d_opt)}", f"loss {law.loss(n_opt, d_opt):.6f}")
    n20, d20 = tokens_per_param_allocation(c6)
    table.add("20 tokens/param", f"N {_si(n20)}, D {_si(d20)}", f"loss {law.loss(n20, d20):.6f}")
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
    """3 decimals in the largest unit ≥ 1: 9.551B, 1.230T, 1.263M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3f}{unit}"
    return f"{x:.3g}"


def as_rows(tables: list[PlanTable]) -> list[dict[str, Any]]:
    """Flat rows (section, label, value, note), e.g. for JSON output."""
    return [dict(section=t.title, label=label, value=value, note=note) for t in tables for label, value, note in t.rows]
