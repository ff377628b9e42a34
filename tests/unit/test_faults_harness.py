"""The fault-injection harness's (benchmarks/faults.py) own logic: the stage list, main's resume rule, what counts as
an artifact's content, the kill plan and what counts as a covered stage."""

import json
import random
import sys
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import faults  # noqa: E402


def test_the_stages_are_the_registrys_in_order():
    from flows.registry import stage_names

    assert faults.registry_stages() == stage_names()


def test_main_resumes_from_newest_scratch_else_stable_phase_at_or_before_the_decay_start():
    assert faults.expected_resume([0, 8], [6, 10, 13], 13) == (8, "scratch")
    assert faults.expected_resume([], [6, 10, 13], 13) == (13, "stable")
    assert faults.expected_resume([], [6, 10, 13], 9) == (6, "stable")
    assert faults.expected_resume([], [], 13) == (0, "")
    assert faults.expected_resume([], [6], None) == (0, "")  # cosine: no stable phase


def test_content_leaves_out_when_how_long_and_how_a_rerun_got_there_but_not_data_keys():
    run = {"steps": 16, "train_wall_s": 4.3, "resumed_from_step": 13, "resumed_from": "stable", "decided_at": "x",
           "host": "debian.org", "doc_id": 3, "base": "/tmp/r1/artifacts/main/k", "rungs": {"trained": 1, "reused": 3}}
    assert faults.normalise(run, "/tmp/r1") == {"steps": 16, "host": "debian.org", "doc_id": 3,
                                                "base": "<runs>/artifacts/main/k", "rungs": {}}
    vocab = {f"t{i}": i for i in range(faults.RECORD_KEYS)} | {"_at": 999}  # a vocabulary's keys are content
    assert faults.normalise(vocab)["_at"] == 999


def test_a_table_is_the_multiset_of_its_rows_without_timing_columns():
    a = pd.DataFrame({"doc_id": [1, 2], "text": ["a", "b"], "wall_s": [0.1, 0.2], "tags": [[1], [2]]})
    b = pd.DataFrame({"doc_id": [2, 1], "text": ["b", "a"], "wall_s": [9.0, 9.0], "tags": [[2], [1]]})
    assert faults.frame_digest(a) == faults.frame_digest(b)
    assert faults.frame_digest(a) != faults.frame_digest(b.assign(text=["b", "z"]))


def test_a_rerun_after_a_kill_may_reuse_rungs_and_redo_sweep_trials_but_not_change_them():
    """A ladder rung read back from the cache, and a sweep trial redone after a kill (its retry count, its number in
    the Optuna journal) are how the rerun got there; the rung's loss and the trial's slot, LR and value are content."""
    ref = pd.DataFrame({"width": [16, 24], "loss_nats": [6.1, 5.9], "wall_s": [0.3, 0.2], "cached": [False, False]})
    rerun = ref.assign(wall_s=[0.0, 3.4], cached=[True, False])
    assert faults.frame_digest(rerun) == faults.frame_digest(ref)
    assert faults.frame_digest(rerun.assign(loss_nats=[6.1, 5.8])) != faults.frame_digest(ref)
    trials = pd.DataFrame({"number": [0, 1, 2], "peak_lr": [0.03, 0.001, 0.01], "value": [5.9, 6.8, 6.0],
                           "optuna_number": [0, 1, 2], "retries": [0, 0, 0]})
    redone = trials.assign(optuna_number=[0, 2, 3], retries=[0, 1, 0])
    assert faults.frame_digest(redone) == faults.frame_digest(trials)
    assert faults.frame_digest(redone.assign(number=[0, 2, 3])) != faults.frame_digest(trials)
    assert faults.frame_digest(redone.assign(peak_lr=[0.03, 0.01, 0.001])) != faults.frame_digest(trials)


def test_zip_containers_compare_by_member_content_not_dates_or_object_ids(tmp_path):
    def skops_like(path: Path, object_id: int, value: bytes) -> Path:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{object_id}.npy", value)
            archive.writestr("schema.json", json.dumps({"array": f"{object_id}.npy", "__id__": object_id}))
        return path

    one, two = skops_like(tmp_path / "a.skops", 1401, b"x"), skops_like(tmp_path / "b.skops", 9902, b"x")
    assert faults.file_digest(one) == faults.file_digest(two)
    assert faults.file_digest(one) != faults.file_digest(skops_like(tmp_path / "c.skops", 1401, b"y"))


def test_an_artifact_differs_by_the_files_named(tmp_path):
    for name, loss in (("a", 5.9), ("b", 6.1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"loss": 5.9, "train_wall_s": loss}))
        (tmp_path / name / "meta.json").write_text(json.dumps({"key": name}))
        (tmp_path / name / "heldout.bin").write_bytes(name.encode())
    a, b = faults.artifact_digest(tmp_path / "a"), faults.artifact_digest(tmp_path / "b")
    assert sorted(a) == ["heldout.bin", "run.json"]
    assert faults.digest_diff(b, a) == ["heldout.bin"]
    assert faults.digest_diff(None, a) == ["missing"]


def test_kills_are_spread_over_every_stage_and_replanned_where_they_did_not_land():
    stages = ("a", "b", "c")
    wanted = faults.wanted_kills(7, stages, random.Random(0))
    assert sum(wanted.values()) == 7 and min(wanted.values()) == 2
    assert faults.wanted_kills(2, stages, random.Random(0)) == {"a": 1, "b": 1, "c": 1}  # every stage, at least once
    assert faults.wanted_kills(0, stages, random.Random(0)) == {"a": 0, "b": 0, "c": 0}  # --only: no random kills
    assert faults.plan_rounds({"a": 2, "c": 1}, stages) == [["a", "c"], ["a"]]
    assert faults.plan_rounds({"b": 5}, stages, per_round=2, stage="b") == [["b", "b"], ["b", "b"], ["b"]]


def test_a_stage_is_covered_by_a_recovered_kill_whose_artifact_then_compared_equal():
    stages = ("a", "b", "c")
    kill = dict(kind=faults.RANDOM_KILL, target="a", outcome="recovered", compared=list(stages))
    found = [faults.Fault(**kill, landed="a"),
             faults.Fault(**kill, landed="b", mismatches=["b: run.json"]),
             faults.Fault(**{**kill, "outcome": "not recovered"}, landed="c"),
             faults.Fault(**kill, landed="between stages")]
    assert faults.covered_stages(found, stages) == ["a"]


def test_the_rerun_line_and_error_lines_are_read_from_the_console_output():
    assert faults.resume_line("x\nmain: resuming from step 8 (step_00000008)\ny") == \
        "main: resuming from step 8 (step_00000008)"
    assert faults.resume_line("interrupted: an unfinished one resumes from its last checkpoint") is None
    assert faults.resume_line("interrupted (SIGINT) during stage main: the completed stages are kept (sources) and "
                              "main resumes from its last checkpoint (scratch/main/k); to resume, run ...") is None
    output = "ok\nerror: DiskFullError: stage main ran out\nof space.\n\nerror: other"
    assert faults.error_lines(output) == ["error: DiskFullError: stage main ran out of space.", "error: other"]


def test_a_json_mismatch_names_its_keys_and_a_changed_key_is_told_apart_from_a_missing_artifact(tmp_path):
    ref, ours = tmp_path / "ref", tmp_path / "ours"
    for root, kept in ((ref, [6, 10]), (ours, [])):
        (root / "artifacts" / "main" / "k1").mkdir(parents=True)
        (root / "artifacts" / "main" / "k1" / "run.json").write_text(json.dumps(
            {"steps": 16, "stable_checkpoints": kept, "path": f"{root}/cache", "train_wall_s": len(kept)}))
    assert faults.json_keys_differing(ref / "artifacts/main/k1/run.json", ours / "artifacts/main/k1/run.json",
                                      ref, ours) == " (keys: stable_checkpoints)"
    other = ours / "artifacts" / "main" / "k2"
    other.mkdir()
    (other / "_COMPLETE").write_text("x")
    (other / "meta.json").write_text("{}")
    assert faults.other_keys(ours, "main", "k1") == ["k2"]


def test_only_names_targeted_faults_by_kind_or_a_unique_part_of_one():
    assert faults.targeted_kinds(["disk full under the tracking store"]) == ["disk full under the tracking store"]
    assert faults.targeted_kinds(["Tracking Store", "corrupt", "tracking store"]) == [
        "disk full under the tracking store", "kill + corrupt checkpoint"]
    for name, words in (("disk full", "more than one"), ("power cut", "no targeted fault")):
        try:
            faults.targeted_kinds([name])
        except ValueError as err:
            assert words in str(err) and "two runs at once on a fresh folder" in str(err)
        else:
            raise AssertionError(f"--only {name!r} was accepted")


def test_the_targeted_faults_run_in_order_and_only_names_one_alone():
    calls = []

    class Stub(faults.Campaign):
        def __init__(self):
            self.stages, self.compared, self.h = ("a", "main"), ("a",), type("H", (), {"until": "a"})()
            self.ray = None

        def attempt(self, kind, target, inject):
            calls.append((kind, target, inject()))

    for _, _, method, needs_tmpfs in faults.TARGETED:
        setattr(Stub, method, (lambda name: (lambda self, tmpfs_ok: (name, tmpfs_ok)))(method) if needs_tmpfs
                else (lambda name: (lambda self: (name, None)))(method))
    campaign = Stub()
    campaign.targeted(True)
    assert [c[0] for c in calls] == [kind for kind, *_ in faults.TARGETED]
    assert ("disk full under the tracking store", "main", ("disk_full_runs", True)) in calls
    assert campaign.compared == ("a",) and campaign.h.until is None
    calls.clear()
    campaign.targeted(False, ["disk full under the tracking store"])
    assert calls == [("disk full under the tracking store", "main", ("disk_full_runs", False))]


def test_optuna_journal_trials_without_a_final_state_are_running(tmp_path):
    journal = tmp_path / "optuna_journal.log"
    assert faults.running_trials(journal) == []  # no journal yet
    ops = [{"op_code": 0}, {"op_code": 4}, {"op_code": 4}, {"op_code": 6, "trial_id": 0, "state": 1},
           {"op_code": 4}, {"op_code": 6, "trial_id": 2, "state": 3}, {"op_code": 4}]
    journal.write_text("\n".join(map(json.dumps, ops)) + '\n{"op_code": 6, "trial_id": 3, "st')  # torn last line
    assert faults.running_trials(journal) == [1, 3]


def test_the_warehouse_comparison_names_tables_that_differ_for_the_current_artifacts(tmp_path):
    import duckdb

    def warehouse(path, rows):
        with duckdb.connect(str(path)) as con:
            con.execute("CREATE TABLE removals (artifact_key VARCHAR, doc_id VARCHAR, recorded_at TIMESTAMP)")
            con.executemany("INSERT INTO removals VALUES (?, ?, now())", rows)
            con.execute("CREATE TABLE stage_runs (artifact_key VARCHAR, wall_s DOUBLE)")
            con.execute("INSERT INTO stage_runs VALUES ('k1', 1.0)")
        return path

    ref = warehouse(tmp_path / "ref.duckdb", [("k1", "a"), ("k1", "b"), ("old", "z")])
    same = warehouse(tmp_path / "same.duckdb", [("k1", "b"), ("k1", "a")])  # row order and other keys' rows aside
    torn = warehouse(tmp_path / "torn.duckdb", [("k1", "a")])
    assert faults.warehouse_diff(ref, same, {"corpus": "k1"}) == []
    assert faults.warehouse_diff(ref, torn, {"corpus": "k1"}) == ["removals: 1 rows vs 2 in the reference"]
