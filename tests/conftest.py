"""Every test process trains under the thread policy the product uses (infra.threads): set before torch loads."""

from infra.threads import apply_wait_policy

apply_wait_policy()


# Files in the order they start, slowest first (longest-processing-time scheduling): under pytest-xdist's
# ``--dist loadfile --no-loadscope-reorder`` (the Makefile's) each file runs whole on one worker, in this order, so
# the suite does not end waiting on one long file. test_pipeline.py comes first because it makes the shared smoke
# runs; the files after it that need no smoke runs keep the other worker busy meanwhile. Files not listed follow
# in their usual order.
SLOW_FIRST = (
    "e2e/test_pipeline.py",
    "e2e/test_cpt_from_hf_base.py",
    "unit/test_toy_stage.py",
    "e2e/test_quality_budget_error.py",
    "unit/test_train_distributed.py",
    "unit/test_train_stage.py",
    "e2e/test_context_extension.py",
    "e2e/test_operating.py",
    "e2e/test_stops.py",
    "e2e/test_predeclaration_run.py",
    "e2e/test_launched_main.py",
    "e2e/test_ray.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}

    def position(item):
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return rank.get(path, len(SLOW_FIRST))

    items.sort(key=position)  # stable: tests keep their order within a file
