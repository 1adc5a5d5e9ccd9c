"""SM clock, power and throttle reasons while a GEMM runs back to back for a few seconds: which
rate the tensor cores keep under a real load (random operands, DRAM and L2 traffic), against
the boost clock the shared-memory microbenchmarks run at.

    python ci/clock_under_load.py [--seconds S]

Phases: a dense 8192^3 BF16 product on random data, the same on zeros, our grouped GEMM forward
and torch._grouped_mm on (N, K, E, T) = (4096, 7168, 8, 65536) random groups (the grouped-GEMM
grid's 7168 x 2048 w13 row), then the family-B layer at the contract geometry, T = 16384, on the
benchmark's inputs (tp8 and ep8: whether its prefill is held by the power cap too). nvidia-smi
samples every 100 ms; each phase reports its TFLOP/s (CUDA events) and the median SM clock and
power of the samples inside it.
"""
import argparse
import statistics
import subprocess
import time

import torch

from cake_moe.bench import grouped_gemm as b


def phase(name: str, fn, flops: float, seconds: float, marks: list) -> None:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, n = time.time(), 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()  # (keeps the wall clock and the GPU in step; idle gaps are tiny)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    marks.append((name, t0 + 0.5, time.time(), flops * n / (ms * 1e-3) / 1e12))


def moe_layer(layout: str, t: int):
    """One family-B plan on the benchmark's random weights and inputs, and its routed FLOPs."""
    from cake_moe.bench import mxfp4_moe as m
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = m.rank_layer(layout, gen)
    plans, _, _, _, routes = m._bind(t, r.runner, r.prepared, (None, None), r.beta, r.linear_beta, gen, r.local,
                                     r.offset)
    return plans[0].run, 2.0 * routes * m.H * 3 * r.i_shard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    fields = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"
    if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True).returncode:
        fields = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"  # older drivers' name
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    marks: list = []
    try:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        bm = torch.randn_like(a)
        phase("dense bf16 8192^3, random", lambda: a @ bm, 2.0 * 8192**3, args.seconds, marks)
        z = torch.zeros_like(a)
        phase("dense bf16 8192^3, zeros", lambda: z @ z, 2.0 * 8192**3, args.seconds, marks)
        n, k, e, t = 4096, 7168, 8, 65536
        _, offs, x, w, g = b._case(n, k, e, t, "random", 0)
        make, peer = b.op_callables("fwd", x, w, g, offs)
        ours = make("").launch
        phase("grouped fwd (ours) 4096x7168x8 T=65536", ours, 2.0 * t * n * k, args.seconds, marks)
        phase("torch._grouped_mm same", peer, 2.0 * t * n * k, args.seconds, marks)
        del x, w, g, offs, make, peer, ours
        for layout in ("tp8", "ep8"):
            run, flops = moe_layer(layout, 16384)
            phase(f"MXFP4 MoE {layout} T=16384 (whole layer)", run, flops, args.seconds, marks)
            del run
            torch.cuda.empty_cache()
    finally:
        time.sleep(0.3)
        smi.terminate()
    rows = []
    for line in smi.stdout.read().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            ts += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            rows.append((ts, float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            continue
    print(f"GPU: {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}")
    print("| phase | TFLOP/s | SM clock (MHz, median) | power (W, median) | throttle reasons seen | samples |")
    print("|---|---|---|---|---|---|")
    for name, t0, t1, tflops in marks:
        inside = [r for r in rows if t0 <= r[0] <= t1]
        if not inside:
            print(f"| {name} | {tflops:.0f} | - | - | - | 0 |")
            continue
        reasons = sorted({r[3] for r in inside})
        print(f"| {name} | {tflops:.0f} | {statistics.median(r[1] for r in inside):.0f} | "
              f"{statistics.median(r[2] for r in inside):.0f} | {' '.join(reasons)} | {len(inside)} |")


if __name__ == "__main__":
    main()
