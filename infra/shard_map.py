"""Shard maps: run one function over many shards, locally as Prefect tasks or on a Ray cluster.

A stage function receives a ``shard_map(fn, calls, label)`` and never imports Prefect or Ray itself. The engine
(``infra.execution.ExecutionConfig.engine``) says where the calls run:

- ``sequential``: a plain loop in the calling process, no Prefect tasks (library use and tests).
- ``threads``: each call one Prefect task run named ``{label}-{i}`` (visible in the Prefect UI, with its own state)
  on Prefect's ThreadPoolTaskRunner; the work runs in the task's thread (good for I/O-bound shards).
- ``processes``: the same Prefect tasks, each handing its work to a shared pool of worker processes, so
  CPU-bound shards run in parallel without each worker process starting its own Prefect API.
- ``ray``: each call one Ray task (``num_cpus=1``) on the cluster at ``address``, submitted from inside the stage;
  the stage itself stays one Prefect task. Every node must see the runs folder at the same path.

``fn`` must be a module-level function and its keyword arguments picklable (strings and numbers); every engine
returns the results in call order. A failed call is run again up to ``retries`` times, unless it raised a
``PretrainError`` (bad input, which a retry cannot fix); once its attempts are spent, the map raises the first
failure in call order, as a ``ShardCallError`` naming the call, after the other submitted calls have finished, so
no shard is left half-written by a call still running.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from infra.errors import ConfigError, PretrainError, RayHeadLostError, ShardCallError
from infra.execution import ENGINES, RAY_INSTALL_HINT, ExecutionConfig
from infra.threads import thread_policy, worker_environment

ShardMap = Callable[[Callable[..., Any], list[dict[str, Any]], str], list[Any]]


def sequential_map(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
    return [fn(**kwargs) for kwargs in calls]


def retriable(err: BaseException) -> bool:
    """Whether a failed call is worth another attempt: any exception but a ``PretrainError`` (bad input, named with
    its fix, fails the same way every time)."""
    return isinstance(err, Exception) and not isinstance(err, PretrainError)


def call_failed(label: str, index: int, n_calls: int, kwargs: dict[str, Any], err: BaseException,
                attempts: int) -> BaseException:
    """The error a map raises for call ``index`` that failed with ``err`` on its last of ``attempts``: ``err`` itself
    when it is a ``PretrainError`` (its message is already the one to show), else a :class:`ShardCallError` naming
    the pass, the call's partition (``part``), shard (``shard``) or output folder, and the attempts."""
    if isinstance(err, PretrainError) or not isinstance(err, Exception):
        return err
    if isinstance(kwargs.get("part"), int):
        what = f"partition {kwargs['part']}"
    elif isinstance(kwargs.get("shard"), int):
        what = f"shard {kwargs['shard']}"
    else:
        out = kwargs.get("out_dir") or kwargs.get("out_path")
        what = f"output {Path(out).name}" if out else "no partition or shard"
    times = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    message = " ".join(str(err).split()) or "(no message)"
    wrapped = ShardCallError(f"{label}: call {index + 1} of {n_calls} ({what}) failed after {times}: "
                             f"{type(err).__name__}: {message[:2000]}")
    wrapped.__cause__ = err  # the traceback in the run log goes down to the call's own
    return wrapped


def _retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: retry unless the failed state holds a ``PretrainError``."""
    err = getattr(state, "data", None)
    return not isinstance(err, BaseException) or retriable(err)


def _run_here(f: Callable[..., Any], kw: dict[str, Any]) -> Any:
    return f(**kw)


def _run_in(pool: RecyclingPool, f: Callable[..., Any], kw: dict[str, Any]) -> Any:
    return pool.submit(f, **kw).result()


def _task_runner(kind: str, workers: int):
    if kind in ("threads", "processes"):
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    raise ConfigError(f"unknown engine {kind!r} for Prefect tasks; use sequential, threads or processes "
                      f"(shard_map_for gives engine 'ray' a Ray shard map; engines: {', '.join(ENGINES)})")


def process_pool(workers: int, fn: Callable[..., Any]) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes started by a forkserver that preloads ``fn``'s module.

    forkserver, not fork: the submitting process runs Prefect's event-loop threads; the preloaded server makes each
    worker start in milliseconds. The server is started shielded from the terminal's Ctrl-C, and so is every worker
    it forks (``infra.lifetime.shielded_from_terminal_interrupts``): an interrupted run stops its workers itself
    (``RecyclingPool.terminate``) rather than have each print a ``KeyboardInterrupt`` traceback.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([fn.__module__])
    _start_forkserver()
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def _start_forkserver() -> None:
    """Start this process's forkserver now (a no-op when it runs), with SIGINT blocked in its mask."""
    from multiprocessing import forkserver, resource_tracker

    from infra.lifetime import shielded_from_terminal_interrupts

    resource_tracker.ensure_running()  # first: starting it unblocks SIGINT in this thread (bpo-33613)
    with shielded_from_terminal_interrupts():
        forkserver.ensure_running()


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool``'s worker processes now (SIGTERM) and cancel its queued calls: their futures fail with
    ``BrokenProcessPool``."""
    stop = getattr(pool, "terminate_workers", None)  # Python 3.14+
    if stop is not None:
        with suppress(Exception):
            stop()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with suppress(Exception):
            process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


class RecyclingPool:
    """A process pool (:func:`process_pool`) replaced by a fresh one after every ``recycle_after × workers``
    submitted calls, so no worker process lives through more than about ``recycle_after`` shards.

    A long-lived worker's memory creeps with the shards it has run (allocator fragmentation, library caches); a
    fresh process starts from the forkserver's preloaded image. A pool broken by a worker that died is replaced at
    the next submit, so a retried call runs in a fresh pool. The replaced pool finishes the calls it was given and
    its processes then exit. ``ProcessPoolExecutor(max_tasks_per_child=...)`` would do the same per process but can
    hang the pool on Python 3.11. At most ``workers`` calls are in flight across the pools: :meth:`submit` blocks
    until one finishes, so a replaced pool's calls never run beside a full new pool. Safe to submit from several
    threads.
    """

    def __init__(self, workers: int, fn: Callable[..., Any], recycle_after: int = 0):
        self.workers, self.fn, self.recycle_after = workers, fn, recycle_after
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(workers)
        self._pool = process_pool(workers, fn)
        self._retired: list[ProcessPoolExecutor] = []
        self._submitted = 0
        self._terminated = False
        self.pools_started = 1

    def submit(self, f: Callable[..., Any], /, **kwargs: Any) -> Future:
        self._slots.acquire()
        try:
            with self._lock:
                if self._terminated:
                    raise BrokenProcessPool("the pool was terminated: the run is stopping")
                if getattr(self._pool, "_broken", False):  # a worker died (killed for memory): its calls failed
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = process_pool(self.workers, self.fn)
                    self._submitted = 0
                    self.pools_started += 1
                elif self.recycle_after and self._submitted >= self.recycle_after * self.workers:
                    self._pool.shutdown(wait=False)  # its running calls finish; then its processes exit
                    self._retired.append(self._pool)
                    self._pool = process_pool(self.workers, self.fn)
                    self._submitted = 0
                    self.pools_started += 1
                self._submitted += 1
                future = self._pool.submit(f, **kwargs)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            for pool in [*self._retired, self._pool]:
                pool.shutdown(wait=wait)
            self._retired = []

    def terminate(self) -> None:
        """Stop every worker process now, without waiting for the calls they run (an interrupted run): those calls
        and the queued ones fail with ``BrokenProcessPool``, and later submits raise it."""
        with self._lock:
            self._terminated = True
            for pool in [*self._retired, self._pool]:
                _terminate_workers(pool)

    def __enter__(self) -> "RecyclingPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def process_map(workers: int, recycle_after: int = 0) -> ShardMap:
    """A shard map over a local :class:`RecyclingPool` without Prefect (library use, benchmarks); results in
    order."""
    def run(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
        if not calls:
            return []
        with RecyclingPool(workers, fn, recycle_after) as pool:
            try:
                futures = [pool.submit(fn, **kwargs) for kwargs in calls]
                return [future.result() for future in futures]
            except BaseException as err:
                if not isinstance(err, Exception):  # interrupted: stop the workers rather than wait for them
                    pool.terminate()
                raise
    return run


def prefect_shard_map(kind: str, workers: int, on_done: Callable[[], None] | None = None,
                      recycle_after: int = 0, retries: int = 0) -> ShardMap:
    """A shard map running each call as a Prefect task on the ``kind`` engine (sequential, threads or processes)
    with ``workers`` slots; ``processes`` runs the work in a :class:`RecyclingPool` (``recycle_after`` calls per
    worker process, 0 = never replaced). A failed call is retried ``retries`` times (Prefect's task retries;
    a loop for ``sequential``) unless it raised a ``PretrainError``.

    ``on_done`` is called (in the submitting thread) after each finished shard, for progress bars.

    Raises:
        ConfigError: ``kind`` is unknown.
        ShardCallError: the first call in call order whose attempts all failed, raised after the other submitted
            calls finish (its ``__cause__`` is the call's last error).
        PretrainError: the first such call raised one itself (not retried).
    """
    if kind == "sequential":
        def run_sequential(fn, calls, label):
            results = []
            for i, kwargs in enumerate(calls):
                for attempt in range(retries + 1):
                    try:
                        results.append(fn(**kwargs))
                        break
                    except Exception as err:
                        if attempt == retries or not retriable(err):
                            raise call_failed(label, i, len(calls), kwargs, err, attempt + 1)
                        log.warning("%s: call %d of %d failed (%s: %s); attempt %d of %d", label, i + 1,
                                    len(calls), type(err).__name__, err, attempt + 2, retries + 1)
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
            pool = RecyclingPool(workers, fn, recycle_after)
        try:
            body = (lambda f, kw: _run_in(pool, f, kw)) if pool is not None else _run_here
            shard_task = task(body, name=label, cache_policy=NO_CACHE, persist_result=False, retries=retries,
                              retry_delay_seconds=0, retry_condition_fn=_retry_unless_bad_input)
            with _task_runner(kind, workers) as runner:
                try:
                    futures = [runner.submit(shard_task.with_options(task_run_name=f"{label}-{i}"),
                                             {"f": fn, "kw": kwargs}) for i, kwargs in enumerate(calls)]
                    results, first_error = [], None
                    for i, future in enumerate(futures):
                        try:
                            results.append(future.result())
                        except Exception as err:  # wait for the others so no shard is left half-written
                            attempts = retries + 1 if retriable(err) else 1
                            first_error = first_error or call_failed(label, i, len(calls), calls[i], err, attempts)
                            results.append(None)
                        if on_done:
                            on_done()
                except BaseException as err:
                    # Interrupted (Ctrl-C, SIGTERM): stop the workers before the runner waits for its threads,
                    # which wait for them. A shard cut short is redone by the next run (its work folder says so).
                    if pool is not None and not isinstance(err, Exception):
                        pool.terminate()
                    raise
            if first_error is not None:
                raise first_error
            return results
        finally:
            if pool is not None:
                pool.shutdown()

    return run


# --------------------------------------------------------------------------- Ray

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the folder holding the flows/, tasks/ and infra/ packages
RAY_CALLS_FILE = "ray_calls.jsonl"
log = logging.getLogger(__name__)

# How long a driver keeps retrying a GCS that does not answer before Ray ends the process (std::_Exit(1), after an
# ERROR line; Ray's default is 60 s). Ray reads it from this environment variable (documented with GCS fault
# tolerance); a shard map sets it to RAY_HEAD_TIMEOUT_S unless it is exported. The shard map itself gives the head up
# after a third of it (HEAD_LOST_FRACTION): it then fails the stage with a RayHeadLostError and leaves Ray the rest
# of the time to shut down, so the run ends with its own error line and cleanup.
RAY_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RAY_HEAD_TIMEOUT_S = 30
HEAD_LOST_FRACTION = 1 / 3
HEAD_POLL_S = 1.0  # how often a waiting shard map checks that the head still answers


def ray_worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables of every Ray task a shard map starts (its ``runtime_env``'s ``env_vars``).

    - ``PYTHONPATH``: this checkout, so a worker started by a ``ray start`` in another folder imports the project
      (it replaces that worker's own PYTHONPATH; the worker must run the same Python environment, with the
      project's dependencies installed).
    - ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` (``infra.threads``): one thread per task, since each task holds
      one CPU, and passive waiting, unless the user exported them here; ``TOKENIZERS_PARALLELISM`` as here
      (``false`` in the pipeline), so a task does not start a thread per core.

    Raises:
        ConfigError: an exported OMP_NUM_THREADS or OMP_WAIT_POLICY is invalid.
    """
    environ = os.environ if environ is None else environ
    threads = worker_environment(thread_policy(1, environ), environ={})
    return {"PYTHONPATH": str(PROJECT_ROOT), **threads,
            "TOKENIZERS_PARALLELISM": environ.get("TOKENIZERS_PARALLELISM", "false")}


def _call_on_node(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Runs inside a Ray worker: the call's result and where it ran."""
    import ray

    started = time.perf_counter()
    result = fn(**kwargs)
    where = {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
             "seconds": round(time.perf_counter() - started, 3)}
    return result, where


# Open connection scopes (``one_connection``), innermost last: True once a map inside it started Ray.
_SCOPES: list[bool] = []


@contextmanager
def one_connection() -> Iterator[None]:
    """Within the block, a Ray connection (or private ``"local"`` instance) that a Ray shard map starts is kept for
    the maps after it and shut down when the block ends: a stage's passes share one connection instead of paying
    ``ray.init`` (seconds; a fresh local instance each time) per map. Maps outside a block connect per map."""
    _SCOPES.append(False)
    try:
        yield
    finally:
        if _SCOPES.pop():
            import ray

            ray.shutdown()


def _connect(address: str, workers: int) -> bool:
    """Initialise Ray unless it already is; True when this call started the connection (or the local instance)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault(RAY_RECONNECT_ENV, str(RAY_HEAD_TIMEOUT_S))  # read by the driver that ray.init starts
    try:
        if address == "local":
            ray.init(address="local", num_cpus=workers or None, include_dashboard=False,
                     logging_level=logging.WARNING)
        else:
            _check_reachable(address)
            try:
                ray.init(address=address, logging_level=logging.WARNING)
            except ConnectionError as err:
                # Something answers at the address, yet Ray could not join it: most often token authentication
                # (on by default for `ray start` in this Ray version) without RAY_AUTH_MODE=token here.
                if os.environ.get("RAY_AUTH_MODE") != "token":
                    raise ConfigError(f"the Ray cluster at address = {address!r} answers but refused the connection "
                                      f"({err}); a cluster started by `ray start` uses token authentication: "
                                      "export RAY_AUTH_MODE=token (the token is read from ~/.ray/auth_token or "
                                      "RAY_AUTH_TOKEN) and run again") from None
                raise
    except ValueError as err:  # Ray's parser of "HOST:PORT"
        raise ConfigError(f"address = {address!r} is not a Ray address ({err}); write \"auto\", \"local\" or "
                          "\"HOST:PORT\" of the head node") from None
    except ConnectionError as err:
        raise ConfigError(f"no Ray cluster at address = {address!r} ({err}); start one with `ray start --head`, "
                          f'export RAY_ADDRESS=HOST:PORT, or write address = "local" for an in-process Ray') from None
    return True


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise ConnectionError at once when nothing listens at the GCS address Ray would use (``ray.init`` itself
    retries an unreachable address for minutes). Ray client addresses (``ray://``) are left to Ray."""
    if "://" in address:
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # another Ray layout: let ray.init find out
        return
    resolved = canonicalize_bootstrap_address(address)  # RAY_ADDRESS, "auto" discovery; ConnectionError if none
    if resolved is None:
        return
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as err:
        raise ConnectionError(f"nothing answers at {resolved}: {err}") from None


def head_timeout_s() -> float:
    """Seconds a Ray driver of this process retries an unanswering GCS before Ray ends it (``RAY_RECONNECT_ENV``)."""
    try:
        return max(1.0, float(os.environ.get(RAY_RECONNECT_ENV, RAY_HEAD_TIMEOUT_S)))
    except ValueError:
        return float(RAY_HEAD_TIMEOUT_S)


class HeadWatch:
    """Whether the Ray head (its GCS at ``address``, ``HOST:PORT``) still accepts connections; ``check`` raises
    ``RayHeadLostError`` once it has refused them (or not answered) for ``lost_after_s`` seconds in a row.

    A TCP connection is all it asks: a GCS that was killed, or whose machine is gone, refuses it or times out, while
    any other question to the GCS would be retried by Ray for up to ``head_timeout_s()``."""

    def __init__(self, address: str, label: str, lost_after_s: float | None = None, poll_s: float = HEAD_POLL_S):
        self.address, self.label, self.poll_s = address, label, poll_s
        self.lost_after_s = head_timeout_s() * HEAD_LOST_FRACTION if lost_after_s is None else lost_after_s
        self._checked = float("-inf")
        self._since: float | None = None

    def answers(self) -> bool:
        if not self.address:  # unknown (a Ray client connection): left to Ray
            return True
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=min(2.0, self.poll_s * 2)).close()
        except (OSError, ValueError):
            return False
        return True

    def check(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.poll_s:
            return
        self._checked = now
        if self.answers():
            self._since = None
            return
        self._since = self._since if self._since is not None else now
        if now - self._since >= self.lost_after_s:
            raise RayHeadLostError(
                f"lost the Ray head at {self.address}: its GCS has not answered for {now - self._since:.0f} s while "
                f"{self.label} ran on the cluster, and the calls in flight cannot finish. Check the head node "
                f"(`ray status --address {self.address}`; its gcs_server.out log), start the cluster again "
                "(`ray start --head ...`, then the other nodes), or run this stage locally (engine = \"processes\" "
                "in its [<stage>.execution]); then run the same command again: the completed stages are kept and "
                "the finished shards are reused")

    def confirm(self) -> None:
        """Return once the head answers; raise ``RayHeadLostError`` if it stays silent for ``lost_after_s``."""
        self._checked = float("-inf")
        while True:
            self.check()
            if self._since is None:
                return
            time.sleep(self.poll_s)
            self._checked = float("-inf")


def ray_shard_map(workers: int, address: str = "auto", on_done: Callable[[], None] | None = None,
                  record: Path | None = None, recycle_after: int = 0, retries: int = 0) -> ShardMap:
    """A shard map running each call as a Ray task (``num_cpus=1``) with at most ``workers`` in flight.

    Each map call connects with ``ray.init(address=...)`` unless Ray is already initialised in this process, and
    shuts down only a connection it made (``address = "local"``: the private instance it started), or leaves it to
    the enclosing :func:`one_connection` block (a stage's maps share one connection). Tasks get
    :func:`ray_worker_env` through their ``runtime_env``. Every node must see the paths in the calls' keyword
    arguments (on a multi-node cluster the runs folder on a shared filesystem, at the same path everywhere).

    Args:
        workers: calls in flight at once; 0 = the cluster's CPUs when the map starts.
        address: ``"auto"``, ``"local"`` or ``"HOST:PORT"`` (``infra.execution.ExecutionConfig``).
        on_done: called in the submitting thread after each finished call (progress bars).
        record: a JSON-lines file to append one line to per successful call: label, call index, Ray node id,
            host, worker pid and seconds.
        recycle_after: calls a Ray worker process runs before it exits and Ray starts a fresh one (Ray's
            ``max_calls``; 0 = Ray's default for tasks, reuse).
        retries: times a call that raised is submitted again (not for a ``PretrainError``); a worker or node lost
            under a call is Ray's own ``max_retries``.

    Raises:
        ConfigError: the ray package is missing, or no cluster answers at ``address``.
        ShardCallError: the first call (in call order) whose attempts all failed, raised after every submitted
            call has finished; no further calls are submitted after a failure. Its ``__cause__`` is the call's own
            exception, whose ``__cause__`` is the Ray error with the remote traceback.
        PretrainError: the first failed call raised one itself (not retried).
        RayHeadLostError: the head's GCS stopped answering for ``HeadWatch.lost_after_s`` while calls were in
            flight (the calls are not cancelled: the cluster is gone).
    """

    def run(fn: Callable[..., Any], calls: list[dict[str, Any]], label: str) -> list[Any]:
        if not calls:
            return []
        try:
            import ray
        except ImportError as err:
            raise ConfigError(f'engine = "ray" needs the ray package: {RAY_INSTALL_HINT}') from err
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        started = False

        def restore_sigterm() -> None:
            # ray.init installs a SIGTERM handler that calls sys.exit: SIGTERM must keep unwinding the run as the
            # caller's handler does (a KeyboardInterrupt in `pretrain run`, Prefect's TerminationSignal in a flow).
            if main and signal.getsignal(signal.SIGTERM) is not sigterm:
                signal.signal(signal.SIGTERM, sigterm)

        try:
            started = _connect(address, workers)
            if started and _SCOPES:  # the scope shuts it down, after the stage's last map
                _SCOPES[-1], started = True, False
            restore_sigterm()
            return _run_tasks(ray, fn, calls, label, workers, on_done, record, recycle_after, retries)
        finally:
            if started:
                ray.shutdown()
            restore_sigterm()

    return run


def _run_tasks(ray: Any, fn: Callable[..., Any], calls: list[dict[str, Any]], label: str, workers: int,
               on_done: Callable[[], None] | None, record: Path | None, recycle_after: int = 0,
               retries: int = 0) -> list[Any]:
    limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    # max_calls is a ray.remote argument only (Ray refuses it in .options()).
    task = ray.remote(max_calls=recycle_after)(_call_on_node) if recycle_after else ray.remote(_call_on_node)
    runtime_env = {"env_vars": ray_worker_env()}
    results: list[Any] = [None] * len(calls)
    failures: dict[int, tuple[BaseException, BaseException]] = {}
    pending: dict[Any, int] = {}
    nodes: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    again: list[int] = []  # failed calls to run once more (retries left, not bad input)
    submitted = 0
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # a Ray client (ray://) connection has none to give
        gcs = ""
    head = HeadWatch(gcs, label)
    try:
        while pending or again or (submitted < len(calls) and not failures):
            while (again or submitted < len(calls)) and len(pending) < limit and not failures:
                if again:
                    i = again.pop(0)
                else:
                    i, submitted = submitted, submitted + 1
                attempts[i] += 1
                ref = task.options(num_cpus=1, runtime_env=runtime_env, name=f"{label}-{i}").remote(fn, calls[i])
                pending[ref] = i
            if not pending:  # a failure stopped new submissions and nothing is left in flight
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEAD_POLL_S)
            if not ready:  # nothing finished meanwhile: is the head still there?
                head.check()
                continue
            ref = ready[0]
            i = pending.pop(ref)
            try:
                results[i], where = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if isinstance(err.cause, BaseException) else err
                if attempts[i] <= retries and retriable(cause) and not failures:
                    log.warning("%s: call %d of %d failed (%s: %s); attempt %d of %d", label, i + 1, len(calls),
                                type(cause).__name__, cause, attempts[i] + 1, retries + 1)
                    again.append(i)
                    continue
                failures[i] = (cause, err)
            except ray.exceptions.RayError as err:  # the worker or its node died, past Ray's own retries: the head?
                head.confirm()
                failures[i] = (err, err)
            else:
                nodes[where["node_id"]] += 1
                if record is not None:
                    _append(record, {"label": label, "call": i, **where})
            if on_done:
                on_done()
    except RayHeadLostError:
        raise  # nothing to cancel on a cluster that is gone
    except BaseException:
        for ref in pending:  # interrupted: do not leave the cluster writing shards nobody waits for
            with suppress(Exception):
                ray.cancel(ref)
        raise
    log.info("%s: %d calls on %d Ray node(s) %s", label, len(calls), len(nodes), dict(nodes))
    if failures:
        first = min(failures)
        cause, err = failures[first]
        if cause is not err and cause.__cause__ is None:
            cause.__cause__ = err  # the remote traceback
        raise call_failed(label, first, len(calls), calls[first], cause, attempts[first])
    return results


def _append(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- choosing one


def shard_map_for(execution: ExecutionConfig, on_done: Callable[[], None] | None = None, *,
                  record: Path | None = None) -> ShardMap:
    """The shard map of an ``[<stage>.execution]`` section: :func:`ray_shard_map` for ``engine = "ray"``
    (``record``: its per-call JSON lines), else :func:`prefect_shard_map`.

    Raises:
        ConfigError: as those functions.
    """
    if execution.engine == "ray":
        return ray_shard_map(execution.workers, execution.address, on_done=on_done, record=record,
                             recycle_after=execution.recycle_after, retries=execution.retries)
    return prefect_shard_map(execution.engine, execution.workers, on_done=on_done,
                             recycle_after=execution.recycle_after, retries=execution.retries)


def sequential_map_for(execution: ExecutionConfig, on_done: Callable[[], None] | None = None,
                       **_: Any) -> ShardMap:
    """The shard map outside the pipeline (library use, tests): a loop in this process whatever the engine."""
    return prefect_shard_map("sequential", 1, on_done=on_done)
