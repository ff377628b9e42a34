"""Shard maps: run one function over many shards as Prefect tasks on a chosen task runner.

A stage function receives a ``shard_map(fn, calls, label)`` and never imports Prefect itself. Each call becomes one
Prefect task run named ``{label}-{i}`` (visible in the Prefect UI, with its own state), submitted to:

- ``threads``: Prefect's ThreadPoolTaskRunner; the work runs in the task's thread (good for I/O-bound shards).
- ``processes``: the same thread runner, each task handing its work to a shared pool of worker processes, so
  CPU-bound shards run in parallel without each worker process starting its own Prefect API.
- ``dask`` / ``ray``: prefect-dask's DaskTaskRunner / prefect-ray's RayTaskRunner, for a cluster.
- ``sequential``: a plain loop in the calling process, no Prefect tasks (library use and tests).

``fn`` must be a module-level function and its keyword arguments picklable (strings and numbers).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

from infra.errors import ConfigError

ShardMap = Callable[[Callable[..., Any], list[dict[str, Any]], str], list[Any]]


def sequential_map(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
    return [fn(**kwargs) for kwargs in calls]


def _run_here(f: Callable[..., Any], kw: dict[str, Any]) -> Any:
    return f(**kw)


def _run_in(pool: Executor, f: Callable[..., Any], kw: dict[str, Any]) -> Any:
    return pool.submit(f, **kw).result()


def _task_runner(kind: str, workers: int):
    if kind in ("threads", "processes"):
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as err:
            raise ConfigError("task_runner='dask' needs prefect-dask: pip install prefect-dask") from err
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers})
    if kind == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError as err:
            raise ConfigError("task_runner='ray' needs prefect-ray: pip install prefect-ray") from err
        return RayTaskRunner()
    raise ConfigError(f"unknown task_runner {kind!r}; use sequential, threads, processes, dask or ray")


def process_pool(workers: int, fn: Callable[..., Any]) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes started by a forkserver that preloads ``fn``'s module.

    forkserver, not fork: the submitting process runs Prefect's event-loop threads; the preloaded server makes each
    worker start in milliseconds. Workers are not recycled (``max_tasks_per_child`` can deadlock the pool on
    Python 3.11).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([fn.__module__])
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def process_map(workers: int) -> ShardMap:
    """A shard map over a local process pool without Prefect (library use, benchmarks); results in order."""
    def run(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
        if not calls:
            return []
        with process_pool(workers, fn) as pool:
            return list(pool.map(_call, [fn] * len(calls), calls))
    return run


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)


def prefect_shard_map(kind: str, workers: int, on_done: Callable[[], None] | None = None) -> ShardMap:
    """A shard map running each call as a Prefect task on the ``kind`` task runner with ``workers`` slots.

    ``on_done`` is called (in the submitting thread) after each finished shard, for progress bars.

    Raises:
        ConfigError: ``kind`` is unknown or its integration package is not installed.
        Exception: the first shard failure, re-raised after the other submitted shards finish.
    """
    if kind == "sequential":
        def run_sequential(fn, calls, label):
            results = []
            for kwargs in calls:
                results.append(fn(**kwargs))
                if on_done:
                    on_done()
            return results
        return run_sequential

    from prefect import task
    from prefect.cache_policies import NO_CACHE

    def run(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
        if not calls:
            return []
        pool = None
        if kind == "processes":
            # forkserver, not fork: the submitting process runs Prefect's event-loop threads. The server
            # preloads the shard function's module once, so each pass's workers start in milliseconds.
            pool = process_pool(workers, fn)
        try:
            body = (lambda f, kw: _run_in(pool, f, kw)) if pool is not None else _run_here
            shard_task = task(body, name=label, cache_policy=NO_CACHE, persist_result=False)
            with _task_runner(kind, workers) as runner:
                futures = [runner.submit(shard_task.with_options(task_run_name=f"{label}-{i}"),
                                         {"f": fn, "kw": kwargs}) for i, kwargs in enumerate(calls)]
                results, first_error = [], None
                for future in futures:
                    try:
                        results.append(future.result())
                    except Exception as err:  # wait for the others so no shard is left half-written
                        first_error = first_error or err
                        results.append(None)
                    if on_done:
                        on_done()
            if first_error is not None:
                raise first_error
            return results
        finally:
            if pool is not None:
                pool.shutdown()

    return run
