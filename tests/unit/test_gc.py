"""`pretrain gc`: artifacts of deleted runs go; those of active runs or registered versions stay."""

import os

from mlflow import MlflowClient

from flows.gc import apply, collect
from infra.artifacts import ArtifactStore
from infra.runs import RunsLayout


def test_gc_removes_only_unreferenced_artifacts_and_stale_attempts(tmp_path):
    layout = RunsLayout(tmp_path / "runs")
    store = ArtifactStore(layout.artifacts)
    for stage, key in (("main", "aaaa"), ("main", "bbbb"), ("cpt", "cccc"), ("main", "ffff")):
        tmp = store.begin(stage, key)
        (tmp / "weights.bin").write_bytes(b"x" * 1000)
        store.commit(stage, key, tmp, {})
    stale = store.begin("cpt", "dddd")
    os.utime(stale, (0, 0))  # an abandoned attempt from long ago
    fresh = store.begin("cpt", "eeee")  # one being written right now
    (layout.artifacts / "main" / "ffff" / "weights.bin").write_bytes(b"y")
    assert store.verify("main", "ffff")[0] is None  # moved aside as corrupt
    (corrupt,) = (layout.artifacts / "main").glob(".corrupt-ffff-*")

    client = MlflowClient(tracking_uri=layout.tracking_uri, registry_uri=layout.tracking_uri)
    experiment = client.create_experiment("t")
    client.create_run(experiment, tags={"artifact_key": "aaaa"})
    deleted = client.create_run(experiment, tags={"artifact_key": "bbbb"})
    client.delete_run(deleted.info.run_id)
    client.create_registered_model("t-cpt-candidates")
    client.create_model_version("t-cpt-candidates", source=str(layout.artifacts / "cpt" / "cccc" / "candidates" / "x"))

    plan = collect(layout)
    assert [(stage, key) for stage, key, *_ in plan.remove] == [("main", "bbbb")]
    assert sorted(plan.keep) == [("cpt", "cccc"), ("main", "aaaa")]
    assert sorted(plan.unfinished) == sorted([stale, corrupt]) and plan.bytes_freed >= 1000
    apply(plan)
    assert not (layout.artifacts / "main" / "bbbb").exists() and not stale.exists() and not corrupt.exists()
    assert store.get("main", "aaaa") is not None and store.get("cpt", "cccc") is not None and fresh.exists()
