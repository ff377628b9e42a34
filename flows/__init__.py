"""Orchestration: the Prefect flows, the stage graph, publishing, the CLI and the config schema."""

from infra.threads import apply_wait_policy

apply_wait_policy()  # before anything imports torch: libgomp reads the wait policy once, when it loads
