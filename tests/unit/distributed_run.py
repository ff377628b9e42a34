"""A small training run for the distributed tests, started by ``accelerate launch`` (or called in-process).

    accelerate launch --config_file infra/accelerate/local_processes.yaml --num_processes 2 \
        tests/unit/distributed_run.py --strategy fsdp --steps 8 --checkpoint-every 4 --ckpt DIR --out losses.json

Rank 0 writes {"step": [...], "loss_nats": [...], "grad_norm_preclip": [...], "update_weight_ratio": {...},
"world_size": N, "resumed_from": step} to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from models.config import ModelConfig
from models.decoder import Decoder
from tasks.train.checkpoint import Checkpointer, latest_checkpoint
from tasks.train.config import OptimConfig
from tasks.train.data import MixtureSampler
from tasks.train.loop import seed_everything, train
from tasks.train.optim import build_optimizer
from tasks.train.parallel import parallelize, run_worker

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=16)


def tokens() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.integers(0, 64, 6_000).astype(np.uint16),
            "b": np.tile(np.arange(64, dtype=np.uint16), 100)}


class Recorder:
    def __init__(self):
        self.rows = []

    def on_step_end(self, state, metrics):
        self.rows.append(metrics)


def run(strategy: str, steps: int, *, checkpoint_every: int = 0, ckpt: Path | None = None, resume: bool = False,
        micro_batches: int = 1, shard_size: int = 0, activation_checkpointing: bool = False) -> dict:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    seed_everything(0)
    model = parallelize(Decoder(CFG), accelerator, strategy, shard_size=shard_size,
                        activation_checkpointing=activation_checkpointing)
    optim = OptimConfig(peak_lr=1e-2, warmup_steps=2, micro_batches=micro_batches)
    optimizer = build_optimizer(model, optim)
    sampler = MixtureSampler(tokens(), {"a": 0.5, "b": 0.5}, seq_len=16, batch_size=8, seed=0)
    state = None
    if resume:
        saved = Checkpointer(ckpt, accelerator=accelerator).load(latest_checkpoint(ckpt), model=model,
                                                                 optimizer=optimizer)
        sampler.load_state_dict(saved["sampler_state"])
        state = saved["state"]
    recorder = Recorder()
    callbacks = [recorder]
    if ckpt is not None and checkpoint_every:
        callbacks.append(Checkpointer(ckpt, keep_last=None, accelerator=accelerator))
    resumed_from = state.step if state else 0
    train(model, sampler, optim, total_steps=steps, callbacks=callbacks, state=state, optimizer=optimizer,
          accelerator=accelerator, seed=0, checkpoint_every=checkpoint_every, instrument_every=2)
    return {"step": [r["step"] for r in recorder.rows], "loss_nats": [r["loss_nats"] for r in recorder.rows],
            "grad_norm_preclip": [r["grad_norm_preclip"] for r in recorder.rows],
            "update_weight_ratio": {r["step"]: r["update_weight_ratio"] for r in recorder.rows
                                    if "update_weight_ratio" in r},
            "max_attention_logit": [r.get("max_attention_logit") for r in recorder.rows],
            "world_size": accelerator.num_processes, "resumed_from": resumed_from,
            "is_main": accelerator.is_main_process}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--ckpt", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--shard-size", type=int, default=0)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = run(args.strategy, args.steps, checkpoint_every=args.checkpoint_every, ckpt=args.ckpt,
                 resume=args.resume, micro_batches=args.micro_batches, shard_size=args.shard_size,
                 activation_checkpointing=args.activation_checkpointing)
    if result.pop("is_main"):
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    run_worker(main)  # leaves like a launched training worker (no interpreter finalisation)
