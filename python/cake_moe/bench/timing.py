"""CUDA-event timing and the copy-bandwidth ceiling, shared by every benchmark."""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_cuda(fn: Callable[[], object], *, warmup: int = 5, iters: int = 20) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
