"""Two CPU processes (gloo, started by ``accelerate launch``) against one: same global batch, same trajectory;
sharded checkpoints resume on the same and on a different world size; a rank leaves cleanly even while gloo is
still finishing its last collective."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from infra.errors import CheckpointError, ConfigError, DataError
from tasks.train.checkpoint import Checkpointer, load_model, verify_checkpoint
from tasks.train.parallel import check_layout, parallelize, rank_rows
from tests.unit import distributed_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(distributed_run.__file__)
LAUNCH_CONFIG = ROOT / "infra" / "accelerate" / "local_processes.yaml"
# Two processes reduce the same sums in a different order: float32 rounding, not a different computation.
TOLERANCE = 2e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp: Path, name: str, processes: int, *args: str) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIG),
           "--num_processes", str(processes), "--main_process_port", str(free_port()), str(SCRIPT), "--out", str(out),
           *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One in-process reference and the launched runs every test below compares (launched once per module)."""
    tmp = tmp_path_factory.mktemp("dist")
    single = distributed_run.run("ddp", 8)
    ddp = launch(tmp, "ddp", 2, "--strategy", "ddp", "--steps", "8", "--micro-batches", "2")
    fsdp = launch(tmp, "fsdp", 2, "--strategy", "fsdp", "--steps", "8", "--checkpoint-every", "4",
                  "--ckpt", str(tmp / "ckpt"), "--activation-checkpointing")
    hybrid = launch(tmp, "hybrid", 2, "--strategy", "hybrid", "--shard-size", "1", "--steps", "8")
    # Keep only the step-4 checkpoint, then resume from it on two processes and on one.
    for later in (tmp / "ckpt").glob("step_0000000[5-9]"):
        shutil.rmtree(later)
    resumed_2 = launch(tmp, "resumed_2", 2, "--strategy", "fsdp", "--steps", "8", "--ckpt", str(tmp / "ckpt"),
                       "--resume")
    resumed_1 = distributed_run.run("ddp", 8, ckpt=tmp / "ckpt", resume=True)
    return {"single": single, "ddp": ddp, "fsdp": fsdp, "hybrid": hybrid, "resumed_2": resumed_2, "resumed_1": resumed_1,
            "ckpt": tmp / "ckpt"}


def test_two_processes_follow_the_one_process_trajectory(runs):
    single = runs["single"]["loss_nats"]
    assert runs["ddp"]["world_size"] == runs["fsdp"]["world_size"] == 2
    assert runs["ddp"]["loss_nats"] == pytest.approx(single, abs=TOLERANCE)  # DDP with 2 micro-batches per rank
    assert runs["fsdp"]["loss_nats"] == pytest.approx(single, abs=TOLERANCE)  # FSDP2 full shard + recompute
    assert runs["fsdp"]["grad_norm_preclip"] == pytest.approx(runs["single"]["grad_norm_preclip"], rel=1e-4)
    # Global norms under sharding: the update/weight ratio is the same figure as on one process.
    for step, ratio in runs["single"]["update_weight_ratio"].items():
        assert runs["fsdp"]["update_weight_ratio"][str(step)] == pytest.approx(ratio, rel=1e-3)
    # Hybrid shard on a 2 × 1 mesh (replicated across the two ranks): replicas are not counted twice in the norms.
    assert runs["hybrid"]["loss_nats"] == pytest.approx(single, abs=TOLERANCE)
    for step, ratio in runs["single"]["update_weight_ratio"].items():
        assert runs["hybrid"]["update_weight_ratio"][str(step)] == pytest.approx(ratio, rel=1e-3)
    assert single[-1] < single[0]  # and it learns


def test_sharded_checkpoint_resumes_on_the_same_and_a_different_world_size(runs):
    record = verify_checkpoint(runs["ckpt"] / "step_00000004")
    assert record["format"] == "sharded" and record["world_size"] == 2
    assert len(list((runs["ckpt"] / "step_00000004" / "shards").glob("*.distcp"))) == 2  # one shard per rank
    uninterrupted = runs["fsdp"]["loss_nats"][4:]
    assert runs["resumed_2"]["resumed_from"] == runs["resumed_1"]["resumed_from"] == 4
    assert runs["resumed_2"]["step"] == [5, 6, 7, 8]
    assert runs["resumed_2"]["loss_nats"] == pytest.approx(uninterrupted, abs=1e-6)
    assert runs["resumed_1"]["world_size"] == 1
    assert runs["resumed_1"]["loss_nats"] == pytest.approx(uninterrupted, abs=TOLERANCE)


def test_sharded_checkpoint_is_not_loaded_as_a_single_file_one(runs):
    with pytest.raises(CheckpointError, match="sharded checkpoint written by 2 processes"):
        load_model(runs["ckpt"] / "step_00000004")


def test_corrupt_shard_is_refused(runs, tmp_path):
    copy = tmp_path / "step_00000004"
    shutil.copytree(runs["ckpt"] / "step_00000004", copy)
    shard = next((copy / "shards").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    from models.decoder import Decoder
    from tasks.train.optim import build_optimizer
    from tasks.train.config import OptimConfig

    model = Decoder(distributed_run.CFG)
    with pytest.raises(CheckpointError, match="sha256"):
        Checkpointer(tmp_path, accelerator=Accelerator(cpu=True)).load(
            copy, model=model, optimizer=build_optimizer(model, OptimConfig(peak_lr=1e-3, warmup_steps=1)))
    verify_checkpoint(runs["ckpt"] / "step_00000004")  # the original is intact


def test_layout_errors_name_the_fix():
    with pytest.raises(ConfigError, match="multiple of 6"):
        check_layout(batch_size=8, micro_batches=3, processes=2)
    check_layout(batch_size=12, micro_batches=3, processes=2)
    with pytest.raises(DataError, match="multiple of 3"):
        rank_rows(8, Accelerator(cpu=True), micro_batches=3)
    assert rank_rows(8, Accelerator(cpu=True), micro_batches=2) == slice(0, 8)
    with pytest.raises(ConfigError, match="strategy"):
        parallelize(torch.nn.Linear(2, 2), Accelerator(cpu=True), "zero7")


# Two gloo ranks. Rank 0's last all-reduce completes while its main thread keeps the GIL (a long switch interval, a
# busy wait), so its gloo worker thread is still waiting for the GIL to drop that collective's tensors when the rank
# leaves: the state every rank is in for a moment after its last collective, held here long enough to be certain.
LATE_COLLECTIVE = """
import sys, time
import torch, torch.distributed as dist
from tasks.train.parallel import exit_worker

rank = int(sys.argv[1])
store = dist.TCPStore("127.0.0.1", int(sys.argv[2]) if rank else 0, 2, is_master=rank == 0, wait_for_workers=False)
if rank == 0:
    print(store.port, flush=True)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
if rank == 1:
    store.wait(["go"])
    dist.all_reduce(torch.ones(4))
    exit_worker(0)
world = dist.group.WORLD  # held, as torch's DTensor caches and default arguments hold it in a training run, so
# destroy_process_group unregisters the group but joins none of its threads
t = torch.zeros(4)
done = t.numpy()  # the same memory, read without a torch call
dist.all_reduce(t, async_op=True)
dist.destroy_process_group()
sys.setswitchinterval(60.0)  # from here the main thread keeps the GIL until it blocks
store.set("go", "1")
while done[0] == 0:
    pass
deadline = time.perf_counter() + 0.5  # the gloo thread is now waiting for the GIL
while time.perf_counter() < deadline:
    pass
exit_worker(0)
"""


def test_a_rank_leaves_cleanly_while_gloo_still_holds_its_last_collective():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = dict(cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank0 = subprocess.Popen([sys.executable, "-c", LATE_COLLECTIVE, "0"], **start)
    port = rank0.stdout.readline().strip()
    if not port.isdigit():
        rank0.kill()
        pytest.fail(f"rank 0 did not start: {rank0.communicate()[1][-3000:]}")
    rank1 = subprocess.Popen([sys.executable, "-c", LATE_COLLECTIVE, "1", port], **start)
    _, err0 = rank0.communicate(timeout=120)
    _, err1 = rank1.communicate(timeout=120)
    # Leaving by a plain interpreter exit instead aborts here: SIGABRT, "terminate called without an active exception".
    assert rank0.returncode == 0, err0[-3000:]
    assert rank1.returncode == 0, err1[-3000:]
