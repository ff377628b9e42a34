"""Training stall of an asynchronous checkpoint against a synchronous one, side by side (SPEC §4, §9).

    python benchmarks/checkpoint_stall.py                 # 6-layer d 512 model (≈ 25M parameters), 3 saves each
    python benchmarks/checkpoint_stall.py --d-model 768

Both sides save the same model and AdamW state through ``CheckpointCallback`` (safetensors weights, optimiser
moments, loop and loader state, fsync, SHA-256 of every file, atomic rename). Synchronous: the training thread
waits for the whole write. Asynchronous: it waits only for the CPU snapshot; the write runs in a background thread
(the next save waits for the previous write). The stall is the time ``on_checkpoint`` blocks the caller; each
side's median over the saves counts. Target: asynchronous stall ≤ 0.1 × synchronous save time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import torch

    from models.arithmetic import param_count
    from models.config import ModelConfig
    from models.decoder import Decoder
    from tasks.train.checkpoint import CheckpointCallback
    from tasks.train.config import OptimConfig
    from tasks.train.data import MixtureSampler
    from tasks.train.loop import TrainState, train

    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=8, n_kv_heads=8, d_ff=4 * args.d_model,
                      vocab_size=8192, seq_len=64)
    torch.manual_seed(0)
    model = Decoder(cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 100_000).astype(np.uint16)
    sampler = MixtureSampler({"r": tokens}, {"r": 1.0}, seq_len=64, batch_size=2, seed=0)
    result = train(model, sampler, OptimConfig(peak_lr=1e-3, warmup_steps=1), total_steps=2)  # AdamW moments exist
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "async"):
            callback = CheckpointCallback(Path(tmp) / mode, keep_last=1, asynchronous=mode == "async")
            for i in range(args.saves):
                callback.on_checkpoint(TrainState(step=i + 1), model, result.optimizer, sampler)
                if mode == "async":
                    callback.wait()  # outside the timed stall: the next step's compute would overlap it
            medians[mode] = statistics.median(callback.stall_seconds)
    n = param_count(cfg).total
    print(f"model {n:,} parameters ({n * 16 / 1e9:.2f} GB of weights + AdamW state as fp32), {args.saves} saves each")
    print(f"  synchronous save      {medians['sync'] * 1e3:8.1f} ms (median)")
    print(f"  asynchronous stall    {medians['async'] * 1e3:8.1f} ms (median; snapshot to CPU memory)")
    ratio = medians["async"] / medians["sync"]
    print(f"  stall / sync = {ratio:.3f} (target ≤ 0.10): {'PASS' if ratio <= 0.1 else 'FAIL'}")


if __name__ == "__main__":
    main()
