"""CPU utilisation proxy of the training loop: model FLOP/s ÷ large-matmul FLOP/s, interleaved step by step.

    python benchmarks/train_utilisation.py                 # the 5.8M-parameter shape, 2 threads
    python benchmarks/train_utilisation.py --threads 4 --steps 30

On a CPU there is no published peak, so the reference is the FLOP/s of a large fp32 matmul
(``tasks.train.instruments.matmul_peak_flops``, n = 2,048, one untimed and one timed product). It is measured
after every training step, inside the training loop (a step-end callback), in the same process and with the same
thread count, so the two sides share the machine's load at each moment and get the same statistic (the median
over the timed steps). Model FLOP/s = (6·N_matmul + 6·L·d·T) × the loop's own ``tokens_per_s`` of each step
(batch, forward, backward, AdamW; the figure the loop's ``utilisation_proxy`` metric uses) of the 5.8M-parameter
shape of docs/methods.md §2 (L 6, d 256, n_h 8, d_ff 688, V 4,096, T 256, batch 16) on random tokens, after
``--warmup`` untimed steps. Target: proxy ≥ 0.6 with 2 threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.threads import apply_wait_policy  # noqa: E402

apply_wait_policy()  # a training process's thread policy (infra.threads), set before torch loads


class MatmulBetweenSteps:
    """After each optimiser step: record the step's tokens/s and time one large matmul."""

    def __init__(self) -> None:
        self.tokens_per_s: list[float] = []
        self.matmul_flops: list[float] = []

    def on_step_end(self, state, metrics) -> None:
        from tasks.train.instruments import matmul_peak_flops

        self.tokens_per_s.append(metrics["tokens_per_s"])
        self.matmul_flops.append(matmul_peak_flops(repeats=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import torch

    from models.arithmetic import flops_per_token, param_count
    from models.config import ModelConfig
    from models.decoder import Decoder
    from tasks.train.config import OptimConfig
    from tasks.train.data import MixtureSampler
    from tasks.train.loop import train

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, d_ff=688, vocab_size=4096, seq_len=256)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 2_000_000).astype(np.uint16)
    torch.manual_seed(0)
    model = Decoder(cfg)
    sampler = MixtureSampler({"random": tokens}, {"random": 1.0}, seq_len=cfg.seq_len, batch_size=16, seed=0)
    probe = MatmulBetweenSteps()
    started = time.perf_counter()
    train(model, sampler, OptimConfig(peak_lr=3e-3, warmup_steps=2), total_steps=args.warmup + args.steps,
          callbacks=[probe])
    wall = time.perf_counter() - started
    per_tok = flops_per_token(cfg)
    tps = probe.tokens_per_s[args.warmup:]
    ref = probe.matmul_flops[args.warmup:]
    model_flops = statistics.median(per_tok * t for t in tps)
    matmul = statistics.median(ref)
    paired = statistics.median(per_tok * t / r for t, r in zip(tps, ref))
    print(f"threads {args.threads}, 5.8M shape ({param_count(cfg).total:,} parameters), batch 16 × T 256, "
          f"{args.steps} timed steps after {args.warmup}, a 2,048² matmul after each ({wall:.0f} s in all):")
    print(f"  tokens/s                {statistics.median(tps):,.0f}  (median; {1e3 / statistics.median(tps):.2f} ms "
          f"per token; range {min(tps):,.0f}–{max(tps):,.0f})")
    print(f"  model FLOP/s            {model_flops / 1e9:,.1f} GFLOP/s  ((6·N_matmul + 6·L·d·T) = "
          f"{per_tok / 1e6:.1f} MFLOP per token)")
    print(f"  large-matmul FLOP/s     {matmul / 1e9:,.1f} GFLOP/s  (median; range {min(ref) / 1e9:.1f}–"
          f"{max(ref) / 1e9:.1f})")
    ratio = model_flops / matmul
    print(f"  utilisation proxy       {ratio:.2f} (median of step/next-matmul pairs {paired:.2f}; target ≥ 0.60): "
          f"{'PASS' if ratio >= 0.6 else 'FAIL'}")


if __name__ == "__main__":
    main()
