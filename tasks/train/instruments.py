"""Hardware reference rates for utilisation figures (docs/methods.md §1).

On a GPU, MFU divides model FLOP/s by the device's published dense bf16 peak (``models.planning.DEVICE_PEAK_BF16``,
matched by device name). A CPU has no published peak, so its *utilisation proxy* divides by the FLOP/s of a large
fp32 matmul measured on the same machine, in the same process, with the same thread count.
"""

from __future__ import annotations

import functools
import time

import torch

from models.planning import DEVICE_PEAK_BF16


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an n × n fp32 matmul on the CPU over ``repeats`` timed runs (2·n³ FLOPs each), after one
    untimed warm-up. Measured anew on each call (benchmarks time it before and after a run).

    The operands come from a generator of their own: a draw from torch's global generator would move a training
    run's RNG stream by whether this process had measured before (``device_peak_flops`` measures once per process),
    so a resumed run's checkpoints would record other generator states than an uninterrupted run's."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2.0 * n ** 3 / best


def device_peak_flops(device: torch.device) -> tuple[float, str]:
    """(reference FLOP/s, kind) for utilisation on ``device``: the published bf16 peak of a known GPU ("mfu"),
    or a measured large-matmul rate on a CPU or an unknown GPU ("utilisation_proxy")."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in DEVICE_PEAK_BF16.items():
            if key.split("-")[0] in name and ("PCIe" in name) == ("PCIe" in key):
                return peak, "mfu"
    return _cpu_reference(torch.get_num_threads()), "utilisation_proxy"


@functools.cache
def _cpu_reference(threads: int) -> float:
    # Once per process and thread count: a training loop per sweep trial or stability cell need not re-time it.
    return matmul_peak_flops()


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far in MB: allocated CUDA memory on a GPU, the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
