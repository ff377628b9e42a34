"""CPU thread policy for every process that trains: how many intra-op threads, and how idle OpenMP threads wait.

PyTorch's CPU build on Linux runs its intra-op parallelism on GNU OpenMP (libgomp). With ``OMP_WAIT_POLICY``
unset, a libgomp thread that runs out of work spins for a while before it sleeps. On a machine where anything
else runs (the Prefect API server, a corpus worker, a browser), the spinning threads take the cores that the
thread with work needs: 2-thread CPU training measured 4–10× slower than 1 thread beside one busy process, and the
in-memory checkpoint snapshot 3–10× slower. ``PASSIVE`` makes idle threads sleep at once; on an idle machine it
costs a few percent (the OpenMP 5.2 specification, §6.7, defines the two policies).

libgomp reads ``OMP_WAIT_POLICY`` once, when it is loaded (on ``import torch``), so :func:`apply_wait_policy`
must run before that: the ``flows`` package calls it on import, and child processes (shard workers, ``accelerate
launch`` workers) inherit the environment.

Precedence, for both settings: what the user exported wins, then the experiment config, then the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import MutableMapping

from infra.errors import ConfigError

DEFAULT_WAIT_POLICY = "PASSIVE"
_WAIT_POLICIES = ("ACTIVE", "PASSIVE")
_EXPORTED_MARK = "PRETRAIN_OMP_WAIT_POLICY_SOURCE"  # set alongside our default so children report the true origin
_THREADS_MARK = "PRETRAIN_OMP_NUM_THREADS_SOURCE"  # OMP_NUM_THREADS set by a launcher, not exported by the user


_ANNOUNCED: set[str] = set()  # thread lines this process printed


@dataclass(frozen=True)
class ThreadPolicy:
    """The threads one process trains with.

    Attributes:
        torch_threads: intra-op threads (``torch.set_num_threads``) per process.
        threads_source: ``"OMP_NUM_THREADS"`` (exported), ``"config"`` (``torch_threads`` of the experiment) or
            ``"cpus"`` (the CPUs this process may run on).
        omp_wait_policy: ``ACTIVE`` or ``PASSIVE``.
        wait_policy_source: ``"exported"`` or ``"default"``.
    """

    torch_threads: int
    threads_source: str
    omp_wait_policy: str
    wait_policy_source: str

    def split(self, processes: int) -> "ThreadPolicy":
        """The policy of one of ``processes`` workers sharing this run's threads (an exported
        ``OMP_NUM_THREADS`` is per process already, as OpenMP defines it)."""
        if self.threads_source == "OMP_NUM_THREADS" or processes <= 1:
            return self
        return ThreadPolicy(max(1, self.torch_threads // processes), self.threads_source, self.omp_wait_policy,
                            self.wait_policy_source)

    def line(self) -> str:
        """One line for the user: the threads, the wait policy and where each came from."""
        return (f"CPU threads: {self.torch_threads} ({self.threads_source}), OMP_WAIT_POLICY {self.omp_wait_policy} "
                f"({self.wait_policy_source})")

    def announce(self) -> None:
        """Print ``line()`` unless this process printed the same line already (the CLI prints it before the
        pipeline flow starts; a served deployment's flow prints it itself)."""
        if self.line() not in _ANNOUNCED:
            _ANNOUNCED.add(self.line())
            print(self.line(), flush=True)

    def params(self) -> dict[str, str | int]:
        """The policy as run parameters (MLflow params, ``meta.json``)."""
        return {"torch_threads": self.torch_threads, "torch_threads_source": self.threads_source,
                "omp_wait_policy": self.omp_wait_policy, "omp_wait_policy_source": self.wait_policy_source}


def apply_wait_policy(environ: MutableMapping[str, str] = os.environ) -> tuple[str, str]:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless the user exported a policy.

    Returns:
        (policy in effect, ``"exported"`` or ``"default"``).

    Raises:
        ConfigError: the exported policy is neither ACTIVE nor PASSIVE (libgomp would ignore it silently and spin).
    """
    if _EXPORTED_MARK in environ:  # a child of a process that already decided
        return environ.get("OMP_WAIT_POLICY", DEFAULT_WAIT_POLICY).upper(), environ[_EXPORTED_MARK]
    exported = environ.get("OMP_WAIT_POLICY", "").strip()
    if exported:
        if exported.upper() not in _WAIT_POLICIES:
            raise ConfigError(f"OMP_WAIT_POLICY={exported!r} is not a wait policy: OpenMP ignores it and idle threads "
                              f"spin; export ACTIVE or PASSIVE, or unset it (PASSIVE is the default here)")
        environ[_EXPORTED_MARK] = "exported"
        return exported.upper(), "exported"
    environ["OMP_WAIT_POLICY"] = DEFAULT_WAIT_POLICY
    environ[_EXPORTED_MARK] = "default"
    return DEFAULT_WAIT_POLICY, "default"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which container and ``taskset`` limits narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_policy(configured: int | None, environ: MutableMapping[str, str] = os.environ) -> ThreadPolicy:
    """The intra-op threads of a run on this machine (:meth:`ThreadPolicy.split` shares them among workers).

    Args:
        configured: the experiment's ``torch_threads``, or None for the default (the usable CPUs).
        environ: where an exported ``OMP_NUM_THREADS`` is read.

    Raises:
        ConfigError: ``OMP_NUM_THREADS`` is exported but is not a positive integer, or ``OMP_WAIT_POLICY`` is not
            a policy.
    """
    policy, policy_source = apply_wait_policy(environ)
    exported = environ.get("OMP_NUM_THREADS", "").strip()
    if exported and environ.get(_THREADS_MARK) != "ours":
        # OpenMP allows a list ("4,2") for nested levels; the first level is the one torch uses.
        first = exported.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise ConfigError(f"OMP_NUM_THREADS={exported!r} is not a positive thread count; export e.g. "
                              "OMP_NUM_THREADS=2 or unset it")
        return ThreadPolicy(int(first), "OMP_NUM_THREADS", policy, policy_source)
    if configured is not None:
        return ThreadPolicy(configured, "config", policy, policy_source)
    return ThreadPolicy(usable_cpus(), "cpus", policy, policy_source)



def worker_environment(policy: ThreadPolicy, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a training worker process: its thread count and wait policy set as this process chose
    them (marked as ours, so the worker does not mistake them for a user's export)."""
    env = dict(environ)
    env["OMP_NUM_THREADS"] = str(policy.torch_threads)
    env["OMP_WAIT_POLICY"] = policy.omp_wait_policy
    env[_EXPORTED_MARK] = policy.wait_policy_source
    if policy.threads_source != "OMP_NUM_THREADS":
        env[_THREADS_MARK] = "ours"
    return env
