"""The CPU thread policy: passive OpenMP waiting by default, what the user exported wins, workers share threads."""

import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import ConfigError

from infra.threads import ThreadPolicy, apply_wait_policy, thread_policy, usable_cpus, worker_environment

ROOT = Path(__file__).resolve().parents[2]


def test_passive_waiting_is_the_default_and_an_exported_policy_wins():
    env: dict[str, str] = {}
    assert apply_wait_policy(env) == ("PASSIVE", "default") and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert apply_wait_policy(env) == ("PASSIVE", "default")  # a child process keeps the origin
    exported = {"OMP_WAIT_POLICY": "active"}
    assert apply_wait_policy(exported) == ("ACTIVE", "exported") and exported["OMP_WAIT_POLICY"] == "active"


def test_thread_count_precedence():
    assert thread_policy(None, {}) == ThreadPolicy(usable_cpus(), "cpus", "PASSIVE", "default")
    assert thread_policy(3, {}).torch_threads == 3 and thread_policy(3, {}).threads_source == "config"
    user = thread_policy(3, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"})
    assert (user.torch_threads, user.threads_source, user.omp_wait_policy) == (1, "OMP_NUM_THREADS", "ACTIVE")
    assert thread_policy(None, {"OMP_NUM_THREADS": "4,2"}).torch_threads == 4  # nested levels: the first
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='two'"):
        thread_policy(None, {"OMP_NUM_THREADS": "two"})
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='0'"):
        thread_policy(None, {"OMP_NUM_THREADS": "0"})
    with pytest.raises(ConfigError, match="OMP_WAIT_POLICY='bogus' is not a wait policy"):
        thread_policy(None, {"OMP_WAIT_POLICY": "bogus"})


def test_workers_share_the_run_threads_unless_the_user_set_them_per_process():
    run = thread_policy(8, {})
    worker = run.split(4)
    assert worker.torch_threads == 2 and run.split(16).torch_threads == 1
    env = worker_environment(worker, {})
    assert (env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == ("2", "PASSIVE")
    # In the worker, the launcher's OMP_NUM_THREADS is not mistaken for a user's export.
    assert thread_policy(8, env).threads_source == "config"
    per_process = thread_policy(8, {"OMP_NUM_THREADS": "3"})
    assert per_process.split(4).torch_threads == 3
    assert worker_environment(per_process.split(4), {})["OMP_NUM_THREADS"] == "3"


def test_the_policy_is_in_place_before_torch_loads():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: importing the CLI package must set it first (the
    CLI itself imports torch only in the commands that need it)."""
    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); import flows.cli; "
            "assert 'torch' not in sys.modules; import flows.pipeline; "
            "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)")
    probe = ("import os, sys, builtins\n"
             "real = builtins.__import__\n"
             "def spy(name, *a, **k):\n"
             "    if name == 'torch' and 'torch' not in sys.modules:\n"
             "        print('torch loads with', os.environ.get('OMP_WAIT_POLICY'))\n"
             "    return real(name, *a, **k)\n"
             "builtins.__import__ = spy\n" + code)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("OMP_", "PRETRAIN_OMP"))}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.split("\n")
    assert lines[0] == "torch loads with PASSIVE", out.stdout
    assert lines[-2] == "PASSIVE True"


TRAIN = """
import hashlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from models.config import ModelConfig
from models.decoder import Decoder
torch.manual_seed(0)
model = Decoder(ModelConfig(vocab_size=256, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=160, seq_len=32))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for _ in range(3):
    x = torch.randint(0, 256, (4, 33), generator=g)
    logits = model(x[:, :-1])
    logits = logits if torch.is_tensor(logits) else logits[0]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
print(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
"""


def test_trained_weights_do_not_depend_on_the_thread_count():
    """Why ``torch_threads`` is not in any artifact key: the same steps give the same bytes at 1 and 2 threads."""
    digests = {subprocess.run([sys.executable, "-c", TRAIN, str(n)], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() for n in (1, 2)}
    assert len(digests) == 1
