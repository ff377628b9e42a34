"""Orchestration: the Prefect flows, the stage registry, publishing, the CLI and the config schema."""

from infra.errors import ConfigError
from infra.threads import apply_wait_policy

try:
    apply_wait_policy()  # before anything imports torch: libgomp reads the wait policy once, when it loads
except ConfigError:
    pass  # a bad exported value is reported by the preflight, as one line, before anything runs
