"""Checkpoint cost as a training run feels it: wall time of real runs with async, sync and no checkpoints, in one run.

    python benchmarks/checkpoint_stall.py                   # 6-layer d 512 model (≈ 29M parameters), 30 steps
    python benchmarks/checkpoint_stall.py --rounds 5 --d-model 768

Each arm is the in-process main run's training loop (``tasks.train.runner.run_training`` on
``loop.local_accelerator()`` with the main run's default ``StabilityConfig`` and its rewind hook) on random tokens,
with the main run's checkpointer (``tasks.train.checkpoint.Checkpointer``, keeping the newest 3, as ``[main]``
does) saving every ``--checkpoint-every`` steps and at the end (step 0 included, as the loop does), into a folder
under ``--dir``. Arms: ``async`` (CPU snapshot, write in a background thread), ``sync`` (the
training thread writes), ``none`` (no checkpointer). An arm's wall time runs from the start of training to the
end of the last write (the main run waits for it before recording ``train_wall_s``). Every arm starts from the
same seed, model and batches; the arms run in rotating order for ``--rounds`` rounds after an untimed warm-up, so
load on the machine falls on all three alike.

Added wall time per checkpoint = (arm wall − ``none`` wall of the same round) / checkpoints, median over rounds.
Step times are per optimiser step as the loop sees it (a step's time includes the checkpoint call before it).
Target: async added time ≤ 0.1 × sync added time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.threads import apply_wait_policy  # noqa: E402

apply_wait_policy()  # a training process's thread policy (infra.threads), set before torch loads

ARMS = ("async", "sync", "none")
PEAK_LR = 1e-3


class StepClock:
    """Records the wall time at the end of every optimiser step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, state, metrics) -> None:
        self.ends.append(time.perf_counter())


def run_arm(arm: str, args, cfg, tokens, folder: Path) -> dict:
    from tasks.train.checkpoint import Checkpointer
    from tasks.train.config import OptimConfig
    from tasks.train.data import MixtureSampler
    from tasks.train.loop import local_accelerator
    from tasks.train.optim import build_optimizer
    from tasks.train.parallel import parallelize
    from tasks.train.runner import build_model, run_training
    from tasks.train.sections import RunBudget, StabilityConfig

    budget = RunBudget(steps=args.steps, batch_size=args.batch_size, warmup_steps=max(1, args.steps // 10))
    accelerator = local_accelerator()
    model = parallelize(build_model(cfg, seed=0), accelerator)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=PEAK_LR, warmup_steps=budget.warmup_steps))
    sampler = MixtureSampler({"random": tokens}, {"random": 1.0}, seq_len=cfg.seq_len, batch_size=args.batch_size,
                             seed=0)
    clock = StepClock()
    callbacks = [clock]
    checkpointer = None
    if arm != "none":
        checkpointer = Checkpointer(folder, accelerator=accelerator, keep_last=3, asynchronous=arm == "async")
        callbacks.append(checkpointer)
    started = time.perf_counter()
    run_training(model, sampler, peak_lr=PEAK_LR, budget=budget, seed=0, callbacks=callbacks,
                 checkpoint_every=args.checkpoint_every if checkpointer else 0, stability=StabilityConfig(),
                 optimizer=optimizer, rewind=(lambda: checkpointer.rewind(model, optimizer)) if checkpointer else None,
                 accelerator=accelerator)
    if checkpointer is not None:
        checkpointer.wait()
    wall = time.perf_counter() - started
    steps = [b - a for a, b in zip([started, *clock.ends], clock.ends)]
    saves = len(checkpointer.stall_seconds) if checkpointer else 0
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / max(1, len(list(folder.glob("step_*"))))
    shutil.rmtree(folder, ignore_errors=True)
    blocked = list(checkpointer.stall_seconds) if checkpointer else []
    return {"wall": wall, "steps": steps, "saves": saves, "bytes_per_save": size, "blocked": blocked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="write checkpoints under this folder (default: a "
                        "temporary folder; put it on the disk runs/ lives on)")
    args = parser.parse_args()

    import numpy as np
    import torch

    from models.arithmetic import param_count
    from models.config import ModelConfig

    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=8, n_kv_heads=8, d_ff=4 * args.d_model,
                      vocab_size=8192, seq_len=64)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 200_000).astype(np.uint16)
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ckpt-stall-") as tmp:
        warm = argparse.Namespace(**{**vars(args), "steps": 3, "checkpoint_every": 1})
        for arm in ("async", "sync"):  # allocator, kernels, the matmul reference, first file creation
            run_arm(arm, warm, cfg, tokens, Path(tmp) / f"warm-{arm}")
        for r in range(args.rounds):
            order = ARMS[r % 3:] + ARMS[:r % 3]
            for arm in order:
                results[arm].append(run_arm(arm, args, cfg, tokens, Path(tmp) / f"{arm}-{r}"))

    n = param_count(cfg).total
    saves = results["sync"][0]["saves"]
    tokens_per_step = args.batch_size * cfg.seq_len
    print(f"model {n:,} parameters, {results['sync'][0]['bytes_per_save'] / 1e6:,.0f} MB per checkpoint on disk; "
          f"{args.steps} steps of {tokens_per_step} tokens, a checkpoint every {args.checkpoint_every} steps and at "
          f"the end ({saves} per run); torch threads {torch.get_num_threads()}; {args.rounds} rounds, arms rotated")
    added = {arm: [(a["wall"] - b["wall"]) / saves for a, b in zip(results[arm], results["none"])]
             for arm in ("async", "sync")}
    print(f"{'arm':<6} {'wall s (per round)':>22} {'median step ms':>15} {'mean step ms':>13} {'s per token':>12} "
          f"{'blocked ms':>10} {'added ms / checkpoint':>22}")
    for arm in ARMS:
        walls = [x["wall"] for x in results[arm]]
        median_step = statistics.median(s for x in results[arm] for s in x["steps"])
        mean_step = statistics.median(statistics.fmean(x["steps"]) for x in results[arm])
        per_token = statistics.median(x["wall"] for x in results[arm]) / (args.steps * tokens_per_step)
        blocked = [b for x in results[arm] for b in x["blocked"]]
        blocked_ms = f"{statistics.median(blocked) * 1e3:>10.0f}" if blocked else f"{'-':>10}"
        extra = (f"{statistics.median(added[arm]) * 1e3:>9.0f} (rounds: "
                 f"{', '.join(f'{a * 1e3:.0f}' for a in added[arm])})") if arm in added else f"{'-':>9}"
        print(f"{arm:<6} {' / '.join(f'{w:.2f}' for w in walls):>22} {median_step * 1e3:>15.1f} "
              f"{mean_step * 1e3:>13.1f} {per_token:>12.2e} {blocked_ms} {extra:>22}")
    sync, asyn = statistics.median(added["sync"]), statistics.median(added["async"])
    if sync <= 0 or asyn < 0:  # an arm beat the no-checkpoint arm: load noise is larger than the cost measured
        print(f"async / sync added wall time per checkpoint = {asyn * 1e3:.0f} / {sync * 1e3:.0f} ms: no verdict "
              f"(noise on this machine exceeds the checkpoint cost; rerun with more --rounds)")
        return
    ratio = asyn / sync
    print(f"async / sync added wall time per checkpoint = {asyn * 1e3:.0f} / {sync * 1e3:.0f} ms = {ratio:.2f} "
          f"(target ≤ 0.10): {'PASS' if ratio <= 0.1 else 'FAIL'}")


if __name__ == "__main__":
    main()
