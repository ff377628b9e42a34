"""Where a stage's shard work runs: the ``[<stage>.execution]`` settings shared by the corpus build and the tokenizer.

The stage itself always runs as one Prefect task in the pipeline's process; these settings only say where the
functions it maps over its shards run (``infra.shard_map``). They never change a result, so stages mark the field
``NOT_IN_KEY`` and changing them reuses the cached artifact.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.errors import ConfigError, ConfigWarning
from infra.section import Section

_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}")
Engine = Literal["sequential", "threads", "processes", "ray"]
ENGINES: tuple[str, ...] = Engine.__args__  # type: ignore[attr-defined]
RAY_INSTALL_HINT = "pip install 'ray==2.60.0' (it is in the test extra: pip install -e '.[test]')"

_RENAMED = {
    "dask": 'task_runner = "dask" is no longer supported: write engine = "ray" (with address = "auto" or '
            '"HOST:PORT" of a running Ray cluster) for a cluster, or engine = "processes" on one machine',
    "ray": 'task_runner = "ray" is now engine = "ray" (Ray tasks started from inside the stage; address = "auto" '
           'connects to a running cluster, address = "local" starts one in-process)',
}


class ExecutionConfig(Section):
    """How a stage runs its shard functions; never part of a cache key (results do not depend on it).

    Fields:
        engine: ``sequential`` (a loop in the stage's process), ``threads`` (Prefect tasks on a thread pool),
            ``processes`` (Prefect tasks whose work runs in a pool of ``workers`` local processes; the default) or
            ``ray`` (Ray tasks, one CPU each, started from inside the stage on the cluster at ``address``; needs
            the ``ray`` package). With ``ray`` every node must see the runs folder at the same path (a shared
            filesystem such as NFS on a multi-node cluster), since shard functions read and write files there.
        workers: shard calls in flight at once (threads or processes for the local engines, Ray tasks for
            ``ray``). ``0`` is for ``ray`` only and means all the cluster's CPUs when the map starts.
        address: used by ``ray`` only. ``"auto"``: a running cluster found by Ray's usual discovery
            (``RAY_ADDRESS`` if set, else the latest ``ray start`` on this machine); ``"local"``: a private Ray
            instance started in-process for the stage and stopped after it; ``"HOST:PORT"``: that cluster's
            head (the GCS port of ``ray start --head``).
        recycle_after: shard calls a worker process runs before a fresh process replaces it (``processes``: a new
            pool after every ``recycle_after × workers`` calls; ``ray``: Ray's ``max_calls``), so a worker's memory
            does not creep with the number of shards; 0 = never replaced.
        retries: times a failed shard or partition call is run again before the stage fails (a worker killed for
            memory, a lost node, a transient read error). A ``PretrainError`` raised by the call itself (bad input,
            named with its fix) is not retried. On ``processes`` and ``threads`` these are Prefect task retries (a
            worker process that died is replaced first); on ``ray`` the call is resubmitted, and Ray's own
            ``max_retries`` still covers a worker or node lost under it. Once spent, the stage fails with a
            ``ShardCallError`` naming the pass, the partition or shard, and the attempts.

    Raises:
        ConfigError: the old ``task_runner`` key (names what to write instead), ``engine = "ray"`` without the
            ``ray`` package, ``workers = 0`` with a local engine, or an empty ``address``.
    """

    engine: Engine = "processes"
    workers: int = Field(default=2, ge=0)
    address: str = "auto"
    recycle_after: int = Field(default=16, ge=0)
    retries: int = Field(default=2, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed_task_runner(cls, data: Any) -> Any:
        if isinstance(data, dict) and "task_runner" in data:
            old = data["task_runner"]
            raise ConfigError(_RENAMED.get(old, f'task_runner was renamed engine: write engine = "{old}" '
                                                f'(one of {", ".join(ENGINES)})'))
        return data

    @field_validator("engine")
    @classmethod
    def _ray_installed(cls, engine: str) -> str:
        if engine == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(f'engine = "ray" needs the ray package, which is not installed: {RAY_INSTALL_HINT}')
        return engine

    @field_validator("workers")
    @classmethod
    def _all_cpus_only_on_ray(cls, workers: int, info: ValidationInfo) -> int:
        engine = info.data.get("engine", "processes")
        if workers == 0 and engine != "ray":
            raise ConfigError(f'must be greater than or equal to 1 (got 0) with engine = "{engine}"; workers = 0 '
                              '(all the cluster\'s CPUs) is for engine = "ray"')
        return workers

    @field_validator("address")
    @classmethod
    def _address_given(cls, address: str) -> str:
        address = address.strip()
        if not address:
            raise ConfigError('address is empty: write "auto" (a running cluster), "local" (an in-process Ray) or '
                              '"HOST:PORT" of the head node')
        if address not in ("auto", "local") and "://" not in address and not _HOST_PORT.fullmatch(address):
            raise ConfigError(f'address = "{address}" is not "auto", "local", "HOST:PORT" (the head node\'s GCS '
                              'port, e.g. "10.0.0.1:6379") or a "ray://HOST:PORT" client address')
        return address

    @model_validator(mode="after")
    def _address_needs_ray(self) -> "ExecutionConfig":
        if self.engine != "ray" and self.address != "auto":
            warnings.warn(f'address = "{self.address}" is used only by engine = "ray"; with engine = '
                          f'"{self.engine}" the shard work runs on this machine', ConfigWarning, stacklevel=2)
        return self
