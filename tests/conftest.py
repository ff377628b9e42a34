"""Every test process trains under the thread policy the product uses (infra.threads): set before torch loads."""

from infra.threads import apply_wait_policy

apply_wait_policy()
