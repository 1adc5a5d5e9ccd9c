"""Host time per call of the grouped-GEMM entry points, with the GPU kept busy so the host never
waits on it: what a caller's CPU pays per one-shot call, per prepared launch, and per
``torch._grouped_mm`` call, and where the one-shot path spends it (cProfile).

    python ci/host_overhead.py [--tokens 4096] [--calls 200] [--profile fwd|dgrad|wgrad|none]

The problem is the demo's (H = 2048, I = 768, E = 16, w13): where a one-shot call's host time
exceeds the kernel's device time, a loop of one-shot calls runs at the host's pace.
"""
import argparse
import cProfile
import pstats
import time

import torch

import cake_moe
from cake_moe import demo


def host_us(fn, calls: int) -> float:
    """Mean host microseconds per call of fn() while the GPU spins on a long kernel queued first
    (the calls only enqueue: none can wait for the GPU to drain)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU spin ahead of the calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", default="fwd", choices=("fwd", "dgrad", "wgrad", "none"))
    args = ap.parse_args()
    x, w, gy, offs = demo._grouped_problem(args.tokens, "cuda")
    one_shot = {
        "fwd": lambda: cake_moe.grouped_gemm_fwd(x, w, offs),
        "dgrad": lambda: cake_moe.grouped_gemm_dgrad(gy, w, offs),
        "wgrad": lambda: cake_moe.grouped_gemm_wgrad(gy, x, offs),
    }
    prepared = {
        "fwd": cake_moe.prepare_grouped_gemm_fwd(x, w, offs).launch,
        "dgrad": cake_moe.prepare_grouped_gemm_dgrad(gy, w, offs).launch,
        "wgrad": cake_moe.prepare_grouped_gemm_wgrad(gy, x, offs).launch,
    }
    peer = {
        "fwd": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
        "dgrad": lambda: torch._grouped_mm(gy, w, offs=offs),
        "wgrad": lambda: torch._grouped_mm(gy.t(), x, offs=offs),
    }
    print(f"host us per call, T={args.tokens}, {args.calls} calls each (GPU busy throughout)")
    print(f"{'op':6} {'one-shot':>9} {'prepared':>9} {'torch':>9}")
    for op in ("fwd", "dgrad", "wgrad"):
        row = [host_us(d[op], args.calls) for d in (one_shot, prepared, peer)]
        print(f"{op:6} " + " ".join(f"{v:9.1f}" for v in row))
    if args.profile != "none":
        fn = one_shot[args.profile]
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e8))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\none-shot {args.profile}: cProfile of {args.calls} calls (tottime)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
