"""The ``pretrain`` command.

    pretrain run configs/demo.toml                     # the whole chain on this machine (CPU)
    pretrain run configs/demo.toml --dry-run           # resolved config and stage graph, nothing runs
    pretrain run configs/demo.toml --refresh cpt       # recompute CPT and everything after it
    pretrain run configs/demo.toml --until tokenizer   # stop after the tokenizer stage
    pretrain serve configs/demo.toml --cron "0 3 * * *"  # a scheduled Prefect deployment, served from this process
    pretrain gate declare configs/demo.toml            # declare a new gate explicitly (old record kept)
    pretrain gate show configs/demo.toml               # declarations and the decision table with intervals
    pretrain status configs/demo.toml --explain        # each stage's key, cached or not, and why not
    pretrain gc --dry-run                              # artifacts no MLflow run or registered version refers to
    pretrain eval runs/artifacts/main/<key>/checkpoint # held-out loss per source and cloze, no training
    pretrain eval CHECKPOINT --harness TASKS           # lm-evaluation-harness tasks (names or local YAML)
    pretrain export CHECKPOINT OUT                     # a verified Hugging Face folder (transformers loads it)
    pretrain generate CHECKPOINT --prompt TEXT         # sample from a checkpoint, streamed (KV cache)
    pretrain fetch configs/demo.toml                   # download/unpack the configured Debian sources only
    pretrain lsh-design --s1 0.8 --p1 0.95 --s2 0.5 --p2 0.05   # LSH bands x rows meeting both, fewest hashes
    pretrain plan configs/plan_case_study.toml         # FLOPs, time, memory per device, checkpoints, Chinchilla
    pretrain stability configs/demo.toml               # stability grid: LR × interventions, attention-logit growth
    pretrain report configs/demo.toml                  # report.md + report.html of the evidence, with figures

Everything is written under the runs folder: ``--runs-dir``, else $PRETRAIN_RUNS_DIR, else ./runs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from flows.registry import check_stage_options, stage_names
from flows.runlog import run_log_path, write_traceback
from infra.errors import PretrainError
from infra.runs import RUNS_ENV, TRACKING_ENV, RunsLayout

# The stack (torch, MLflow, Prefect, pandas) is imported inside the commands that use it, so `--help` and a config
# error answer at once; benchmarks/cli_latency.py measures it and tests/unit/test_cli_imports.py keeps it so.


def load_config(path: Path):
    """``flows.config.load_config`` (pydantic and the config sections only)."""
    from flows.config import load_config as load

    return load(path)


def preflight(cfg, *args, **kwargs) -> None:
    """``flows.preflight.preflight``: the checks before any stage runs (imports the stores)."""
    from flows.preflight import preflight as check

    check(cfg, *args, **kwargs)


# Click's plain help (rich_markup_mode=None): flags show as flags, not `<bool>`, and docstring paragraphs are reflowed
# to the terminal (at most 120 columns) instead of keeping the source's line breaks.
HELP = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}
app = typer.Typer(add_completion=False, no_args_is_help=True, help="LLM pretraining experiments, end to end.",
                  rich_markup_mode=None, context_settings=HELP)
gate_app = typer.Typer(no_args_is_help=True, help="The experiment's gate: declare it, show its declarations and "
                       "decisions.", rich_markup_mode=None, context_settings=HELP)
app.add_typer(gate_app, name="gate", short_help="Declare the gate; show its declarations and decisions.")


class _Command(typer.core.TyperCommand):
    """Usage lines name a required argument as CONFIG, not in braces as Typer writes it ({CONFIG})."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"pretrain {version('pretrain')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="print the installed version and exit")) -> None:
    """LLM pretraining experiments, end to end."""


def make_console(terminal: bool, **kwargs) -> Console:
    """The console of a terminal (rich's width and word wrapping), or, for a log file or pipe, one that never wraps a
    line (``soft_wrap``: a long path or URL stays whole and greppable) and lays tables out 160 columns wide (rich
    would take 80). Lines are printed without a ``soft_wrap`` of their own, so this choice holds for each."""
    return Console(**kwargs) if terminal else Console(width=160, soft_wrap=True, **kwargs)


console = make_console(sys.stdout.isatty())

def stores_wait_line(who: dict | None, layout: RunsLayout) -> str:
    """What a run waits for when another holds the stores lock: that run (pid, since) and the lock, which it holds
    only while it opens MLflow's and Prefect's databases and the DuckDB file (creating or migrating them)."""
    from infra.leases import describe

    return (f"waiting for {describe(who)}: it holds the lock on this runs folder's stores ({layout.stores_lock}) "
            "while it opens them (MLflow, DuckDB, Prefect's server); this run goes on when it lets go")


def _runs_dir(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise typer.BadParameter("is empty; name a folder (it is created if missing), or leave the option out for "
                                 "$PRETRAIN_RUNS_DIR or ./runs")
    return value


RunsDir = typer.Option(None, "--runs-dir", metavar="DIR", callback=_runs_dir,
                       help="runs folder (default: $PRETRAIN_RUNS_DIR or ./runs)")
TrackingUri = typer.Option(None, "--tracking-uri", metavar="URI",
                           help="MLflow tracking server, e.g. http://127.0.0.1:5000 (default: "
                           "$PRETRAIN_TRACKING_URI, else the SQLite file in the runs folder)")


def _set_tracking(uri: str | None) -> None:
    if uri:
        os.environ[TRACKING_ENV] = uri


def _quiet_libraries() -> None:
    """Keep the terminal for progress bars and the summary; library INFO chatter goes nowhere useful."""
    for name in ("great_expectations", "mlflow", "alembic", "optuna", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow logs each failed SQL statement (six lines) before raising it; the exception itself is reported.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


class _ExpectedFailures(logging.Filter):
    """Drops Prefect's records of a run that failed with a ``PretrainError``: its message is printed once, clearly,
    by ``_fail``. They are the traceback record and the run's later ``Finished in state Failed(...)`` record, which
    repeats the message in full (matched by the run's id, so another run's failure is still logged)."""

    def __init__(self) -> None:
        super().__init__()
        self._failed_runs: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        run = getattr(record, "task_run_id", None) or getattr(record, "flow_run_id", None)
        if record.exc_info and isinstance(record.exc_info[1], PretrainError):
            if run is not None:
                self._failed_runs.add(str(run))
            return False
        if run is not None and str(run) in self._failed_runs and record.getMessage().startswith(
                "Finished in state Failed"):
            self._failed_runs.discard(str(run))
            return False
        return True


def _quiet_expected_failures() -> None:
    """Call after importing Prefect (its logging setup runs then)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).addFilter(_ExpectedFailures())


def _fail(err: PretrainError) -> None:
    console.print(f"[bold red]error:[/] {type(err).__name__}: {escape(str(err))}")  # one line in a log file
    raise typer.Exit(code=2)


def first_error(err: BaseException) -> BaseException:
    """The error a failure is reported by: ``err`` itself, or, for a third-party exception raised while handling a
    ``PretrainError`` (a full disk that then made recording the failure fail too), that ``PretrainError``: the first
    one down the chain of causes and contexts. ``err`` when the chain holds none."""
    seen, depth = err, 0
    while seen is not None and depth < 50:
        if isinstance(seen, PretrainError):
            return seen
        seen, depth = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__), depth + 1
    return err


def _fail_run(err: Exception, log_path: Path, runs: Path | None = None) -> None:
    """One ``error:`` line for a failed run, its traceback in the run's log file. Exit 2 for a ``PretrainError``
    (also when a later failure was raised while handling it, which is logged as a warning), else 1.

    A failure that is no ``PretrainError`` but comes from a full disk under the runs folder ``runs`` (the MLflow,
    Prefect or DuckDB store could not write) is reported as the ``DiskFullError`` it is
    (``infra.artifacts.runs_disk_full_error``)."""
    cause, found = first_error(err), None
    if not isinstance(cause, PretrainError) and runs is not None:
        from infra.artifacts import runs_disk_full_error

        found = runs_disk_full_error(err, runs)
    if found is not None or isinstance(cause, PretrainError):
        if log_path.parent.is_dir():  # a run that got as far as its runs folder; a bad config creates nothing
            write_traceback(log_path, err)
        if found is not None:
            _fail(found)
        if cause is not err:
            logging.getLogger("pretrain").warning("while handling %s, a second error: %s: %s", type(cause).__name__,
                                                  type(err).__name__, _one_line(err, 500))
        _fail(cause)
    where = f" (traceback in {log_path})" if write_traceback(log_path, err) else \
        f" (its traceback could not be written to {log_path})"
    console.print(f"[bold red]error:[/] {type(err).__name__}: {escape(_one_line(err))}{escape(where)}")
    raise typer.Exit(code=1)


def _one_line(err: BaseException, limit: int = 2000) -> str:
    text = " ".join(str(err).split()) or "(no message)"
    return text if len(text) <= limit else text[:limit] + " ..."


@app.command(cls=_Command, short_help="Run the pipeline and print what the evidence says.")
def run(
    config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
    runs_dir: Optional[str] = RunsDir,
    refresh: list[str] = typer.Option([], "--refresh", metavar="STAGE",
                                      help="recompute this stage and everything downstream (repeatable)"),
    until: Optional[str] = typer.Option(None, "--until", metavar="STAGE", help="stop after this stage: "
                                 + ", ".join(stage_names())),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and stage graph; run nothing"),
    tracking_uri: Optional[str] = TrackingUri,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show other libraries' log records and progress "
                                 "bars too (Prefect, MLflow, Optuna, transformers); they always go to the run log"),
) -> None:
    """Run the pipeline: sources → quality_model → corpus → tokenizer → mixture → quality_ablation → sweep → ladder →
    main → branches → cpt → gate → export."""
    _set_tracking(tracking_uri)
    layout = RunsLayout.resolve(runs_dir)
    log_path = run_log_path(layout)
    from infra.lifetime import StopSignals

    stop = StopSignals()  # SIGINT and SIGTERM unwind the run as KeyboardInterrupt; the old handlers come back after
    try:
        check_stage_options(refresh, until)  # a misspelt stage fails before the config's imports
        cfg = load_config(config)
        from infra.warehouse import Warehouse

        preflight(cfg, refresh, Warehouse(layout.duckdb), until=until)
        if dry_run:
            _dry_run(cfg, layout)
            return
        from infra.lifetime import tie_to_this_process
        from infra.threads import thread_policy

        tie_to_this_process()  # the Prefect API server and every worker end with this process, even on SIGKILL
        threads = thread_policy(cfg.torch_threads)
        threads.announce()
        # Imports and store start-up take tens of seconds on a small machine: say what the wait is.
        console.print(f"Opening the stores in {layout.root} (Prefect API server, MLflow, DuckDB), then the stages")
        layout.prepare_environment()
        _quiet_libraries()
        from flows.pipeline import pipeline
        from flows.runlog import capture
        from flows.summary import print_summary
        from infra.stores import open_stores

        _quiet_expected_failures()
        capture(log_path, verbose=verbose)
        abandoned = open_stores(layout, cfg.name, server_log=log_path, on_wait=lambda who: console.print(
            escape(stores_wait_line(who, layout))))
        if abandoned:
            console.print(f"[yellow]note:[/] marked FAILED {len(abandoned)} MLflow run(s) left RUNNING by a process "
                          "that has ended")
        result = pipeline(str(config.resolve()), str(layout.root), list(refresh), until)
        print_summary(result, layout, console, max_epochs=cfg.mixture.max_epochs, cfg=cfg)
        console.print(f"Run log:     {log_path}   (every library's records; --verbose shows them here too)")
    except KeyboardInterrupt as err:
        from flows.interrupt import interrupted_line

        if log_path.parent.is_dir():
            write_traceback(log_path, err)
        console.print(f"[bold yellow]interrupted[/] {escape(interrupted_line(stop.name, layout, log_path))}")
        stop.before_exit()
        raise typer.Exit(code=stop.exit_code) from None
    except typer.Exit:
        raise
    except Exception as err:
        stop.before_exit()
        _fail_run(err, log_path, layout.root)
    finally:
        stop.restore()


@app.command(cls=_Command, short_help="Serve the pipeline as a scheduled Prefect deployment.")
def serve(
    config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
    cron: Optional[str] = typer.Option(None, "--cron", metavar="CRON",
                                       help="cron schedule, e.g. '0 3 * * *' (03:00 every day)"),
    interval: Optional[int] = typer.Option(None, "--interval", metavar="SECONDS",
                                           help="seconds between scheduled runs"),
    timezone: Optional[str] = typer.Option(None, "--timezone", metavar="TZ",
                                           help="IANA time zone of --cron (default UTC)"),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                       help="deployment name (default: the experiment name)"),
    until: Optional[str] = typer.Option(None, "--until", metavar="STAGE", help="scheduled runs stop after this "
                                 "stage (one of those `run --until` names)"),
    limit: int = typer.Option(1, "--limit", metavar="N", help="flow runs this process executes at once"),
    port: int = typer.Option(4200, "--port", metavar="PORT",
                             help="port of the local Prefect server (when PREFECT_API_URL is unset)"),
    runs_dir: Optional[str] = RunsDir,
    tracking_uri: Optional[str] = TrackingUri,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show every library's log records here too"),
) -> None:
    """Serve the pipeline as a scheduled Prefect deployment (pretrain-pipeline/NAME) until interrupted.

    Without PREFECT_API_URL a local Prefect server (UI + scheduler) is started on 127.0.0.1:PORT. Runs can also be
    triggered by hand from the UI, or with `PREFECT_API_URL=http://127.0.0.1:PORT/api prefect deployment run
    pretrain-pipeline/NAME` (without the URL the Prefect CLI would start a server of its own).
    """
    _set_tracking(tracking_uri)
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        preflight(cfg, until=until)
        from infra.lifetime import tie_to_this_process

        tie_to_this_process()  # the local Prefect server and the flow runs end with this process, even on SIGKILL
        layout.prepare_environment()
        _quiet_libraries()
        import prefect.runner  # noqa: F401  Prefect configures logging on import: the capture wraps its handlers

        from flows.runlog import capture
        from flows.serve import serve as serve_pipeline

        _quiet_expected_failures()
        log_path = capture(run_log_path(layout, "serve"), verbose=verbose)  # Prefect's runner's records
        console.print(f"Serve log: {log_path}   (each flow run logs to {layout.logs}/run-*.log; --verbose shows "
                      "every library's records here)")
        parameters = {"until": until} if until else {}
        serve_pipeline(config, layout, name=name or cfg.name, cron=cron, interval=interval, timezone=timezone,
                       parameters=parameters, limit=limit, port=port)
    except PretrainError as err:
        _fail(err)


def _dry_run(cfg, layout: RunsLayout) -> None:
    from flows.registry import STAGES

    console.print_json(cfg.model_dump_json())
    width = max(len(stage.name) for stage in STAGES)
    for stage in STAGES:
        inputs = ", ".join(stage.inputs) or "-"
        console.print(f"{stage.name:<{width}} ← {inputs:<28} → {layout.artifacts / stage.name}/<key>/")


@app.command(cls=_Command, short_help="Download and unpack the config's Debian sources.")
def fetch(config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
          runs_dir: Optional[str] = RunsDir) -> None:
    """Download and unpack the config's Debian sources into the runs folder's source cache."""
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        from tasks.sources.deb import fetch_deb

        for name, src in cfg.sources.items():
            if src.kind == "deb":
                pkg = fetch_deb(src.package, layout.source_cache, src.version)
                console.print(f"{name}: {pkg.package} {pkg.version} → {pkg.root}")
    except PretrainError as err:
        _fail(err)


@app.command(cls=_Command, short_help="Audit the corpus filters on injected, labelled junk.")
def audit(
    config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
    source: list[str] = typer.Option([], "--source", metavar="SOURCE",
                                     help="source to audit (repeatable; default: every source)"),
    runs_dir: Optional[str] = RunsDir,
    originals: Optional[int] = typer.Option(None, "--originals", metavar="N",
                                            help="first N documents per source (default 5000)"),
    review: Optional[int] = typer.Option(None, "--review", metavar="N",
                                         help="removed documents listed per rule (default 5)"),
    benchmark_items: Optional[int] = typer.Option(
        None, "--benchmark-items", metavar="N",
        help="planted documents per form of the mock benchmark on which near dedup and "
        "13-gram decontamination are compared (default 50; 0 skips the comparison)"),
    lsh_layout: list[str] = typer.Option(
        [], "--lsh-layout", metavar="BANDSxROWS",
        help="an LSH layout BANDSxROWS whose S-curve is drawn beside the configured one in "
        "lsh_layouts.png (repeatable), e.g. 20x10"),
    lsh_design: Optional[str] = typer.Option(
        None, "--lsh-design", metavar="CONSTRAINTS",
        help="constraints s1=..,p1=..,s2=..,p2=..[,max_hashes=..]: list and draw the layouts "
        "with P(s1) >= p1 and P(s2) <= p2 with the fewest hashes (see `pretrain lsh-design`)"),
) -> None:
    """Audit the corpus filters on labelled junk injected into each source (docs/methods.md §7 (TinyStories filter audit)).

    When the corpus scores with a trained quality classifier that the runs folder does not hold yet, it first
    runs `pretrain run CONFIG --until quality_model`, the same run, and says so.
    """
    layout = RunsLayout.resolve(runs_dir)
    options = {k: v for k, v in {"num_originals": originals, "review_per_rule": review,
                                 "benchmark_items": benchmark_items, "lsh_layouts": list(lsh_layout) or None,
                                 "lsh_design": lsh_design}.items() if v is not None}
    try:
        from infra.errors import ConfigError
        from tasks.audit.config import AuditConfig

        cfg = load_config(config)
        AuditConfig(**options)
        unknown = sorted(set(source) - set(cfg.sources))
        if unknown:
            raise ConfigError(f"--source {unknown} not in {config}; its sources are {list(cfg.sources)}")
        layout.prepare_environment()
        _quiet_libraries()
        from flows.audit import audit as audit_flow, print_audit, quality_model_missing

        if quality_model_missing(cfg, layout):
            console.print(escape(f"The audit scores with the trained quality classifier, which {layout.root} does "
                                 f"not hold for this config yet: running `pretrain run {config} --until "
                                 "quality_model` first"))
            run(config, runs_dir=str(layout.root), refresh=[], until="quality_model", dry_run=False,
                tracking_uri=None, verbose=False)
        result = audit_flow(str(config.resolve()), str(layout.root), list(source) or None, options)
    except PretrainError as err:
        _fail(err)
    print_audit(result, console)


@app.command("lsh-design", cls=_Command, short_help="LSH bands x rows meeting two detection constraints.")
def lsh_design(
    s1: float = typer.Option(..., "--s1", metavar="S1", help="detect pairs at Jaccard >= s1 ..."),
    p1: float = typer.Option(..., "--p1", metavar="P1", help="... with probability >= p1"),
    s2: float = typer.Option(..., "--s2", metavar="S2", help="admit pairs at Jaccard <= s2 ..."),
    p2: float = typer.Option(..., "--p2", metavar="P2", help="... with probability <= p2"),
    max_hashes: int = typer.Option(1024, "--max-hashes", metavar="N", min=1,
                                   help="budget on bands x rows (the num_perm needed)"),
    top: int = typer.Option(10, "--top", metavar="N", min=1, help="layouts listed, fewest hashes first"),
    as_json: bool = typer.Option(False, "--json", help="print the layouts as JSON"),
) -> None:
    """LSH layouts (bands x rows) meeting P(s1) >= p1 and P(s2) <= p2 with the fewest hashes, P(s) = 1-(1-s^r)^b
    (docs/methods.md §7; Leskovec, Rajaraman & Ullman, Mining of Massive Datasets, ch. 3)."""
    from rich.table import Table

    from tasks.corpus.lsh_design import LshConstraints, design_layouts

    try:
        constraints = LshConstraints(s1=s1, p1=p1, s2=s2, p2=p2, max_hashes=max_hashes)
        layouts = design_layouts(constraints, limit=top)
    except PretrainError as err:
        _fail(err)
    if as_json:
        console.print_json(json.dumps([lay.as_row() for lay in layouts]))
        return
    out = Table(title=f"LSH layouts with P({s1:g}) >= {p1:g} and P({s2:g}) <= {p2:g} within {max_hashes} hashes, "
                      "fewest hashes first", title_justify="left")
    for column in ("bands x rows", "hashes", f"P({s1:g})", f"P({s2:g})", "(1/b)^(1/r)", "margin"):
        out.add_column(column, justify="right")
    for lay in layouts:
        out.add_row(lay.name, str(lay.hashes), f"{lay.p_at_s1:.4f}", f"{lay.p_at_s2:.4f}", f"{lay.threshold:.3f}",
                    f"{lay.margin:.4f}")
    console.print(out)
    best = layouts[0]
    console.print(escape(f"[corpus.near_dedup] bands = {best.bands}, rows = {best.rows}, num_perm = {best.hashes}"))


@app.command(cls=_Command, short_help="Stability grid: peak LR x training interventions.")
def stability(config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
              runs_dir: Optional[str] = RunsDir) -> None:
    """Stability grid: peak LR × cumulative interventions (warmup, clipping, z-loss, QK-norm) on the experiment's
    shards."""
    from rich.table import Table

    layout = RunsLayout.resolve(runs_dir)
    try:
        load_config(config)
        layout.prepare_environment()
        _quiet_libraries()
        from flows.stability import stability as stability_flow

        result = stability_flow(str(config.resolve()), str(layout.root))
    except PretrainError as err:
        _fail(err)
    out = Table(title=f"Stability grid ({result['experiment']}; MLflow run {result['mlflow_run_id']})")
    columns = ["lr", "interventions", "final_ce", "worst_ce", "max_attention_logit", "mean_log_z", "max_grad_norm",
               "diverged"]
    for column in columns:
        out.add_column(column)
    for row in result["rows"]:
        out.add_row(*(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in columns))
    console.print(out)


@app.command(cls=_Command, short_help="Pre-launch arithmetic: FLOPs, time, memory, scaling allocation.")
def plan(
    config: Path = typer.Argument(..., metavar="CONFIG",
                                  help="plan TOML ([model] + [[runs]]) or an experiment TOML (plans [main])"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of tables"),
    runs_dir: Optional[str] = RunsDir,
) -> None:
    """Pre-launch arithmetic: FLOPs, GPU-hours, memory per device by ZeRO stage, batch, checkpoints, and the
    scaling allocation (the experiment's fitted ladder law when its artifact is in the runs folder, else
    Chinchilla's)."""
    from rich.table import Table

    from flows.plan import as_rows, build_plan, ladder_law, load_plan

    try:
        planned = load_plan(config)
        law, note = ladder_law(config, RunsLayout.resolve(runs_dir))
        tables = build_plan(planned, law=law, law_note=note)
    except PretrainError as err:
        _fail(err)
    if as_json:
        print(json.dumps(as_rows(tables), indent=2))
        return
    for table in tables:
        out = Table(title=table.title, title_justify="left", show_header=False)
        for column in ("label", "value", "note"):
            out.add_column(column)
        for row in table.rows:
            out.add_row(*map(escape, row))
        console.print(out)


@gate_app.command("declare", cls=_Command, short_help="Declare the config's [gate] as the one in force.")
def gate_declare(config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML: its [gate] and name"),
                 runs_dir: Optional[str] = RunsDir,
                 as_json: bool = typer.Option(False, "--json", help="print the declaration in force as JSON")) -> None:
    """Record the config's [gate] as the experiment's gate from now on (earlier declarations are kept); a gate
    first declared after CPT results of the experiment exist is marked as declared after evidence."""
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        from flows.gates import declare_gate
        from infra.warehouse import Warehouse

        row, added = declare_gate(cfg, Warehouse(layout.duckdb))
    except PretrainError as err:
        _fail(err)
    if as_json:
        shown = {k: str(v) for k, v in row.items()} | {
            "gate": json.loads(row["gate_json"]), "declared_after_evidence": bool(row.get("declared_after_evidence")),
            "added": added}
        shown.pop("gate_json")
        print(json.dumps(shown, indent=2))
        return
    from tasks.gate.views import criteria_lines

    # The runs folder defaults to ./runs: say which one, so a declaration in the wrong place is noticed.
    console.print(f"runs folder: {layout.root}")
    what = "declared" if added else f"unchanged: already declared at {row['declared_at']}; nothing added"
    console.print(escape(f"gate {row['gate_hash'][:12]} of '{cfg.name}' {what} (DuckDB table gates in "
                         f"{layout.duckdb})"))
    if row.get("declared_after_evidence"):
        console.print("[yellow]declared after evidence:[/] " + escape(f"{row['evidence_before']}; decisions under "
                      "this gate are marked as no predeclaration (docs/methods.md §11)"))
    console.print("criteria:")
    for line in criteria_lines(cfg.gate):
        console.print(escape(f"  {line}"))


@app.command(cls=_Command, short_help="Each stage's key and whether a rerun would reuse it.")
def status(config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
           runs_dir: Optional[str] = RunsDir,
           explain: bool = typer.Option(False, "--explain", help="for stages that would run: what differs from "
                                        "the nearest stored artifact"),
           as_json: bool = typer.Option(False, "--json", help="print the statuses as JSON")) -> None:
    """Each stage's artifact key and whether a rerun would reuse it; with --explain, why not."""
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        from flows.status import stage_statuses

        statuses = stage_statuses(cfg, layout)
    except PretrainError as err:
        _fail(err)
    if as_json:
        from dataclasses import asdict

        print(json.dumps([asdict(s) for s in statuses], indent=2))
        return
    console.print(f"runs folder: {layout.root}")
    width = max((len(s.stage) for s in statuses), default=0)
    for s in statuses:
        state = "[green]cached[/]" if s.cached else "[yellow]would run[/]"
        if s.computing_by is not None:
            from infra.leases import describe

            state = f"[cyan]being computed[/] by {escape(describe(s.computing_by))}; a run now waits and reuses it"
        console.print(f"{s.stage:<{width}} {s.key}  {state}")
        if explain and not s.cached:
            pad = " " * (width + 1)  # under the key column
            if s.nearest:
                console.print(escape(f"{pad}nearest stored artifact {s.nearest}:"))
            for reason in s.reasons:
                console.print(escape(f"{pad}  {reason}"))
    if explain and all(s.cached for s in statuses):
        console.print("nothing changed since the cached artifacts: each stage's key names a complete artifact")


@app.command(cls=_Command, short_help="Remove artifacts that nothing refers to.")
def gc(runs_dir: Optional[str] = RunsDir,
       dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed; remove nothing")) -> None:
    """Remove artifacts that no active MLflow run and no registered model version refers to."""
    layout = RunsLayout.resolve(runs_dir)
    try:
        from flows.gc import apply, collect

        plan = collect(layout)
    except PretrainError as err:
        _fail(err)
    console.print(f"runs folder: {layout.root}")
    for stage, key, _, size in plan.remove:
        console.print(f"{'would remove' if dry_run else 'removing'} {stage}/{key} ({size / 1e6:,.1f} MB)")
    for path in plan.unfinished:
        console.print(f"{'would remove' if dry_run else 'removing'} unfinished {path.relative_to(layout.root)}")
    console.print(f"kept {len(plan.keep)} referenced artifact(s); "
                  f"{'would free' if dry_run else 'freed'} {plan.bytes_freed / 1e6:,.1f} MB")
    if not dry_run:
        apply(plan)


@gate_app.command("show", cls=_Command, short_help="Declarations and the decision table with intervals.")
def gate_show(config: Path = typer.Argument(..., metavar="CONFIG",
                                            help="experiment TOML: its name selects the gates shown, its "
                                             "[gate] is compared with the one in force"),
              runs_dir: Optional[str] = RunsDir,
              as_json: bool = typer.Option(False, "--json", help="print the rows as JSON")) -> None:
    """One experiment's gate declarations (the config's name; each marked when declared after evidence) and, for
    the one in force, the decision table with intervals."""
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        from flows.gates import decision_rows, declarations
        from infra.warehouse import Warehouse

        warehouse = Warehouse(layout.duckdb)
        gates = declarations(warehouse, cfg.name)
        decisions = decision_rows(warehouse, cfg.name, gates["gate_hash"].iloc[0] if len(gates) else None)
    except PretrainError as err:
        _fail(err)
    if as_json:
        shown = [{**{k: str(v) for k, v in r.items()}, "declared_after_evidence": bool(r["declared_after_evidence"])}
                 for r in gates.to_dict("records")]
        print(json.dumps({"gates": shown,
                          "decisions": decisions.astype(object).where(decisions.notna(), None).to_dict("records")},
                         indent=2, default=str))
        return
    from evals.gate import gate_hash
    from tasks.gate.views import gate_tables

    console.print(f"runs folder: {layout.root}")
    console.print(escape(f"experiment: {cfg.name} (its gates only)"))
    if len(gates) and gates["gate_hash"].iloc[0] != gate_hash(cfg.gate):
        console.print(f"[yellow]note:[/] the config's [gate] ({gate_hash(cfg.gate)[:12]}) differs from the one in "
                      f"force ({gates['gate_hash'].iloc[0][:12]}); the table below is under the one in force. "
                      "`pretrain gate declare CONFIG` makes the config's gate the one in force.")
    for table in gate_tables(gates, decisions, cfg.gate):
        console.print(table)


@app.command(cls=_Command, short_help="Report the evidence: terminal tables, report.md, report.html.")
def report(config: Path = typer.Argument(..., metavar="CONFIG", help="experiment TOML"),
           runs_dir: Optional[str] = RunsDir,
           out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="folder for the report (default: "
                                              "<runs>/reports/<experiment>/)"),
           fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT",
                                             help="md or html (default: both)")) -> None:
    """Report the evidence of the config's artifacts: terminal tables, report.md with plots/, report.html."""
    import tempfile

    layout = RunsLayout.resolve(runs_dir)
    try:
        if not layout.root.is_dir():
            from infra.errors import ConfigError

            raise ConfigError(f"runs folder {layout.root} does not exist or is not a folder; give the --runs-dir a "
                              "`pretrain run` wrote")
        cfg = load_config(config)
        from flows.report import build_report, print_report, resolve_formats, write_report

        formats = resolve_formats(fmt)
        folder = (out or layout.root / "reports" / cfg.name).resolve()
        _quiet_libraries()
        # Markdown links its figures in plots/ beside it; HTML alone embeds them, so they need no folder.
        with tempfile.TemporaryDirectory() as tmp:
            built = build_report(cfg, layout, folder / "plots" if "md" in formats else Path(tmp))
            print_report(built, console)
            written = write_report(built, folder, formats)
    except PretrainError as err:
        _fail(err)
    for path in written:
        console.print(f"wrote {path}")
    if built.missing:
        console.print(f"[yellow]missing stages:[/] {', '.join(built.missing)} (reported what exists)")


# `pretrain eval CHECKPOINT --harness TASKS` (flows/harness.py): options of the eval command.
HarnessTasks = typer.Option(None, "--harness", metavar="TASKS",
                            help="comma list of lm-evaluation-harness task names or task YAML paths "
                            "(e.g. pretrain_cloze_general,arc_easy)")
HarnessTokenizer = typer.Option(None, "--tokenizer", metavar="PATH",
                                help="with --harness: tokenizer folder (default: the one the "
                                "checkpoint was trained with)")
HarnessLimit = typer.Option(None, "--limit", metavar="N", help="with --harness: the first N documents of each task")
HarnessFewshot = typer.Option(None, "--num-fewshot", metavar="K",
                              help="with --harness: K examples in each prompt (default: the "
                              "task's)")
HarnessOut = typer.Option(None, "--out", metavar="DIR",
                          help="with --harness: folder for results.json and the per-document samples "
                          "(default: <runs>/harness/<key>/, in --runs-dir, else the runs folder holding the "
                          "checkpoint, else ./runs)")


@app.command("eval", cls=_Command, short_help="Score a checkpoint on held-out loss and cloze, or harness tasks.")
def evaluate(checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                               help="checkpoint directory (model.safetensors, state.json), "
                                               "or a named checkpoint of a main run: main@step_00000400, main@ema, "
                                               "runs/artifacts/main/<key>@average"),
             config: Optional[Path] = typer.Argument(None, metavar="CONFIG",
                                                     help="experiment TOML: its tokenizer, sources and cloze "
                                                     "sets (not with --harness)"),
             runs_dir: Optional[str] = RunsDir,
             as_json: bool = typer.Option(False, "--json", help="print the results as JSON"),
             harness: Optional[str] = HarnessTasks, tokenizer: Optional[Path] = HarnessTokenizer,
             limit: Optional[int] = HarnessLimit, num_fewshot: Optional[int] = HarnessFewshot,
             out: Optional[Path] = HarnessOut, tracking_uri: Optional[str] = TrackingUri) -> None:
    """Score any checkpoint on the experiment's held-out splits and cloze sets, without training; with --harness,
    on lm-evaluation-harness tasks instead (DuckDB harness_results, an MLflow run).

    Every cloze item and held-out window is scored; the gate instead leaves out those the CPT stage found in its
    training stream (13-gram overlap), so its figures for the same checkpoint can differ slightly.
    """
    if harness is not None or config is None:
        _eval_harness(checkpoint, config, harness, tokenizer, limit, num_fewshot, out, runs_dir, tracking_uri, as_json)
        return
    layout = RunsLayout.resolve(runs_dir)
    try:
        cfg = load_config(config)
        from flows.evaluate import evaluate_checkpoint

        result = evaluate_checkpoint(checkpoint, cfg, layout)
    except PretrainError as err:
        _fail(err)
    if as_json:
        print(json.dumps({"heldout": result["heldout"].to_dict("records"), "cloze": result["cloze"].to_dict("records"),
                          "tokenizer": str(result["tokenizer"])}, indent=2, default=str))
        return
    from infra.report_blocks import rich_table

    console.print(f"checkpoint {checkpoint} (tokenizer artifact {result['tokenizer']})")
    console.print(rich_table("Held-out loss per source", result["heldout"]))
    console.print(rich_table("Cloze accuracy per scoring (binomial SE in points, Wilson 95% interval; "
                             "docs/methods.md §10)", result["cloze"]))


@app.command("export", cls=_Command, short_help="Write a checkpoint as a verified Hugging Face folder.")
def export_hf(checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                                help="checkpoint directory (model.safetensors, state.json), "
                                                "or runs/artifacts/main/<key>@<name> (step_00000400, ema, "
                                                "average; main@<name> for the runs folder's only main run)"),
              out: Path = typer.Argument(..., metavar="OUT",
                                         help="new folder for the Hugging Face model (must not exist, or be "
                                                   "empty)"),
              tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", metavar="PATH",
                                                       help="tokenizer artifact folder "
                                                       "(default: the one the checkpoint was trained with)"),
              runs_dir: Optional[str] = RunsDir) -> None:
    """Write a checkpoint and its tokenizer as a folder transformers loads, verified against the checkpoint
    (logits within 1e-4 in fp32, equal greedy continuations, equal token ids); a failed check writes nothing."""
    try:
        from flows.export import export
        from flows.runlog import quiet_library_bars

        quiet_library_bars()  # the verification is this command's progress; transformers' bars would interleave
        record = export(checkpoint, out, tokenizer, RunsLayout.resolve(runs_dir))
    except PretrainError as err:
        _fail(err)
    console.print(f"wrote {out} ({record['architecture']}, tokenizer {record['tokenizer_dir']}): max |logit "
                  f"difference| {record['max_abs_logit_diff']:.2g} (tolerance {record['tolerance']:g}), greedy "
                  "continuations equal; verification in export.json")


def _eval_harness(checkpoint: Path, config: Optional[Path], harness: Optional[str], tokenizer: Optional[Path],
                  limit: Optional[int], num_fewshot: Optional[int], out: Optional[Path], runs_dir: Optional[str],
                  tracking_uri: Optional[str], as_json: bool) -> None:
    """`pretrain eval CHECKPOINT --harness TASKS`: harness tasks (flows/harness.py), results printed and recorded
    in the runs folder given, else in the one holding the checkpoint (its DuckDB and MLflow), else ./runs."""
    from flows.export import owning_runs

    _set_tracking(tracking_uri)
    layout = RunsLayout.resolve(runs_dir or os.environ.get(RUNS_ENV) or owning_runs(checkpoint))
    try:
        from infra.errors import ConfigError

        if harness is None:
            raise ConfigError("give an experiment CONFIG (held-out loss and cloze) or --harness TASKS")
        if config is not None:
            raise ConfigError(f"--harness scores lm-evaluation-harness tasks and takes no CONFIG ({config}); run the "
                              "two evaluations as two commands")
        _quiet_libraries()
        from flows.harness import harness_eval

        result = harness_eval(checkpoint, [t.strip() for t in harness.split(",")], layout, tokenizer=tokenizer,
                              limit=limit, num_fewshot=num_fewshot, out=out)
    except PretrainError as err:
        _fail(err)
    if as_json:
        print(json.dumps({"results": result["results"].to_dict("records"), "out": str(result["out"]),
                          "mlflow_run_id": result["mlflow_run_id"], "tokenizer": str(result["tokenizer"])},
                         indent=2, default=str))
        return
    from infra.report_blocks import rich_table

    console.print(f"checkpoint {checkpoint} (tokenizer {result['tokenizer']})")
    console.print(rich_table("Harness results (DuckDB harness_results)", result["results"]))
    console.print(f"samples and results.json in {result['out']}; MLflow run {result['mlflow_run_id']} in experiment "
                  f"'{result['experiment']}'")


@app.command(cls=_Command, short_help="Continue prompts with a checkpoint, streamed.")
def generate(checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                               help="checkpoint directory (model.safetensors, state.json) or "
                                               "a stage artifact folder holding checkpoint/"),
             prompt: list[str] = typer.Option([], "--prompt", metavar="TEXT", help="text to continue (repeatable)"),
             prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", metavar="FILE",
                                                         help="UTF-8 file, one prompt a line"),
             max_new_tokens: int = typer.Option(64, "--max-new-tokens", metavar="N",
                                                help="most tokens generated per prompt"),
             temperature: float = typer.Option(0.0, "--temperature", metavar="T",
                                               help="0 = greedy; > 0 samples from softmax(z/τ)"),
             top_p: float = typer.Option(1.0, "--top-p", metavar="P",
                                         help="nucleus: smallest set of mass ≥ p (1 = off)"),
             top_k: int = typer.Option(0, "--top-k", metavar="K",
                                       help="sample among the k most probable tokens (0 = off)"),
             seed: int = typer.Option(0, "--seed", metavar="SEED", help="seed of the sampling generator"),
             tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", metavar="PATH",
                                                      help="tokenizer folder or tokenizer.json "
                                                      "(default: the one the checkpoint was trained with)"),
             runs_dir: Optional[str] = RunsDir) -> None:
    """Continue prompts with a checkpoint, streaming the text as it is generated (KV cache; greedy by default).

    A context longer than the model's seq_len is cropped from the left. Each continuation stops at EOS or after
    --max-new-tokens; the prompt and its continuation go to stdout, the token count and stop reason to stderr.
    """
    err = make_console(sys.stderr.isatty(), stderr=True)
    try:
        from flows.generate import load_generator, read_prompts
        from models.generate import Sampling

        prompts = read_prompts(prompt, prompts_file)
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed)
        loaded = load_generator(checkpoint, tokenizer=tokenizer, runs_dir=runs_dir)
        err.print(escape(f"checkpoint {loaded.checkpoint}, tokenizer {loaded.tokenizer_path}, {sampling.describe()}"))
        for i, text in enumerate(prompts):
            if i:
                sys.stdout.write("\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            done = loaded.complete(text, sampling, on_text=lambda chunk: (sys.stdout.write(chunk), sys.stdout.flush()))
            sys.stdout.write("\n")
            sys.stdout.flush()
            reason = "EOS" if done.stop_reason == "eos" else "max_new_tokens"
            cropped = f", prompt cropped by {done.cropped} tokens on the left" if done.cropped else ""
            err.print(f"[dim]({len(done.tokens)} new tokens, stopped at {reason}{cropped})[/]")
    except PretrainError as error:
        _fail(error)


if __name__ == "__main__":
    app()
