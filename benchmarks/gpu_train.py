"""Training throughput on one GPU: tokens/s, MFU against the device's bf16 peak, peak memory (docs/methods.md §1).

    python benchmarks/gpu_train.py                       # 350M-class shape, bf16 autocast, SDPA (flash on CUDA)
    python benchmarks/gpu_train.py --compile             # the same under torch.compile
    python benchmarks/gpu_train.py --shape tiny --steps 3    # a smoke check that runs anywhere, CPU included

Shapes: ``350m`` (L 24, d 1024, n_h 16, n_kv 8, d_ff 3072, V 32,000, T 2,048, untied: 367,576,064 parameters) and
``tiny`` (2 layers, d 64). Steps run the project's own loop pieces (``forward_backward`` + ``apply_update``: AdamW,
clipping, loss over real targets) on random tokens, after warm-up steps that are not timed. MFU = (6·N_matmul +
6·L·d·T) × tokens/s ÷ the published dense bf16 peak of the detected device; on a CPU or an unknown GPU the
reference is a measured large-matmul rate instead (printed as a utilisation proxy).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "350m": dict(n_layers=24, d_model=1024, n_heads=16, n_kv_heads=8, d_ff=3072, vocab_size=32_000, seq_len=2048,
                 tied_embeddings=False),
    "tiny": dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=176, vocab_size=512, seq_len=128),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="350m")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    args = parser.parse_args()

    import torch
    from accelerate import Accelerator

    from models.arithmetic import flops_per_token, param_count
    from models.config import ModelConfig
    from models.decoder import Decoder
    from tasks.train.config import OptimConfig
    from tasks.train.data import Batch
    from tasks.train.instruments import device_peak_flops, peak_memory_mb
    from tasks.train.loop import apply_update, forward_backward
    from tasks.train.optim import build_optimizer

    cuda = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    cfg = ModelConfig(**SHAPES[args.shape])
    torch.manual_seed(0)
    model = Decoder(cfg).to(accelerator.device)
    optimizer = build_optimizer(model, OptimConfig(peak_lr=3e-4, warmup_steps=1))
    if args.compile:
        model = torch.compile(model)
    model.cfg = cfg  # torch.compile's wrapper hides attributes the loop reads
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        ids = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len + 1), generator=g)
        batch = Batch(ids[:, :-1], ids[:, 1:], ["random"] * args.batch)
        forward_backward(model, batch, accelerator=accelerator)
        apply_update(model, optimizer, lr=3e-4, grad_clip=1.0, accelerator=accelerator)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens_per_s = args.batch * cfg.seq_len * args.steps / seconds
    model_flops = flops_per_token(cfg) * tokens_per_s
    peak, kind = device_peak_flops(accelerator.device)
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{device}: shape {args.shape} ({param_count(cfg).total:,} parameters), batch {args.batch} × T {cfg.seq_len}, "
          f"{'bf16 autocast' if cuda else 'fp32'}, compile={args.compile}, {args.steps} timed steps")
    print(f"  tokens/s      {tokens_per_s:,.0f}")
    print(f"  model FLOP/s  {model_flops / 1e12:.2f} TFLOP/s (6·N_matmul + 6·L·d·T per token)")
    print(f"  {kind:<13} {model_flops / peak:.3f} of {peak / 1e12:.1f} TFLOP/s")
    print(f"  peak memory   {peak_memory_mb(accelerator.device):,.0f} MB")


if __name__ == "__main__":
    main()
