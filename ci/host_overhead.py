"""Host time per call of the grouped-GEMM entry points, with the GPU kept busy so the host never
waits on it: what a caller's CPU pays per one-shot call (with the launch it keeps, and with
CAKE_MOE_ONE_SHOT_CACHE=0: validated and bound every call), per prepared launch, per call of the
``torch.ops.cake_moe`` op (what compiled code calls) and per ``torch._grouped_mm`` call, per
autograd step (forward + backward) of eager ``grouped_mm`` (kept launches, and with the cache
off), of its torch.library op and of ``torch._grouped_mm``, and where the one-shot path spends
it (cProfile).

    python ci/host_overhead.py [--tokens 4096] [--calls 200] [--profile fwd|dgrad|wgrad|none]
    python ci/host_overhead.py --breakdown
    python ci/host_overhead.py --moe ep8,tp8 [--moe-tokens 1,4096]

The problem is the demo's (H = 2048, I = 768, E = 16, w13): where a one-shot call's host time
exceeds the kernel's device time, a loop of one-shot calls runs at the host's pace. ``--moe``
times the MXFP4 MoE layer at the contract geometry instead: the host time of one ``plan()`` (with
the same tensors again, the plan the wrapper keeps; and checked and bound anew) and of one
``plan.run()`` (its launches, GPU busy) against the device time of a run.
"""
import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch

import cake_moe
from cake_moe import demo
from cake_moe.grouped_gemm import _ops


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


class CacheOff:
    """fn timed with one-shot calls and MoE plan() validating and binding every call
    (CAKE_MOE_ONE_SHOT_CACHE=0, set around the whole timing, not per call)."""
    def __init__(self, fn):
        self.fn = fn


def interleaved(fns, calls: int, rounds: int) -> list[float]:
    """Median host us per call of each of fns, timed in turn for `rounds` rounds: this machine's
    host times drift by up to 2x within a run, and taking turns spreads the drift alike."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            if isinstance(fn, CacheOff):
                os.environ["CAKE_MOE_ONE_SHOT_CACHE"] = "0"
                try:
                    times[i].append(host_us(fn.fn, calls))
                finally:
                    del os.environ["CAKE_MOE_ONE_SHOT_CACHE"]
            else:
                times[i].append(host_us(fn, calls))
    return [statistics.median(t) for t in times]


def moe(layouts: list[str], tokens: list[int], calls: int) -> None:
    """The MXFP4 MoE layer: host us of plan() (the same tensors again: the kept plan; and with
    CAKE_MOE_ONE_SHOT_CACHE=0: checked and bound) and of plan.run(), device us of a run."""
    from cake_moe.bench import mxfp4_moe as bench
    from cake_moe.bench import timing
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"MXFP4 MoE host us (GPU busy), {calls} calls each")
    print(f"{'layout':6} {'T':>6} {'plan()':>9} {'bound':>9} {'run()':>8} {'device':>9}  tile")
    for layout in layouts:
        r = bench.rank_layer(layout, gen)
        runner, prepared, beta, lbeta = r.runner, r.prepared, r.beta, r.linear_beta
        for t in tokens:
            x, x_sf, ids, w = bench.random_inputs(t, r.local, r.offset, gen)
            out = torch.empty(t, bench.H, dtype=torch.bfloat16, device="cuda")
            ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")

            def plan():
                return runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta, workspace=ws, output=out)

            bound = plan()
            kept_us, bind_us = interleaved([plan, CacheOff(plan)], calls, 3)
            print(f"{layout:6} {t:6} {kept_us:9.1f} {bind_us:9.1f} {host_us(bound.run, calls):8.1f} "
                  f"{timing.time_cuda(bound.run, warmup=1, iters=calls, reps=3) * 1e3:9.1f}  {bound.decision.tile}",
                  flush=True)


def _autograd_steps(x, w, gy, offs):
    """One training step's grouped GEMMs each: y = x w^T, y.backward(gy), grads dropped: eager
    cake_moe.grouped_mm, the cake_moe::grouped_mm op (what compiled code runs), torch._grouped_mm."""
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step(mm):
        def run():
            mm(xr, wr).backward(gy)
            xr.grad = wr.grad = None
        return run
    return (step(lambda a, b: cake_moe.grouped_mm(a, b, offs)),
            step(lambda a, b: torch.ops.cake_moe.grouped_mm(a, b, offs, "det")),
            step(lambda a, b: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)))


class StandIn(torch.autograd.Function):
    """grouped_mm's autograd shape with no kernel: the same saves, and outputs from torch.empty."""

    @staticmethod
    def forward(ctx, x, w, offs, variant):
        ctx.save_for_backward(x, w, offs)
        ctx.variant = variant
        return x.new_empty((x.shape[0], w.shape[1]))

    @staticmethod
    def backward(ctx, grad):
        x, w, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), None, None


def breakdown(x, w, gy, offs, calls: int, rounds: int) -> None:
    """Where one eager grouped_mm step's host time goes: the step against its parts (the forward
    alone with grad recording, each kernel call alone, the autograd machinery with no kernel)
    and torch's step against its own parts."""
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    eager, _, peer_step = _autograd_steps(x, w, gy, offs)

    def stand():
        StandIn.apply(xr, wr, offs, "det").backward(gy)
        xr.grad = wr.grad = None
    parts = {
        "eager step": eager,
        "eager fwd (records grad)": lambda: cake_moe.grouped_mm(xr, wr, offs),
        "fwd, zeroing": lambda: _ops.fwd_impl(x, w, offs, zero_unrouted_rows=True),
        "dgrad, zeroing": lambda: _ops.dgrad_impl(gy, w, offs, zero_unrouted_rows=True),
        "wgrad": lambda: cake_moe.grouped_gemm_wgrad(gy, x, offs),
        "no-kernel Function step": stand,
        "torch step": peer_step,
        "torch fwd (records grad)": lambda: torch._grouped_mm(xr, wr.transpose(-2, -1), offs=offs),
        "torch.empty x2": lambda: (torch.empty_like(x), torch.empty_like(w)),
    }
    for fn in parts.values():
        fn()
        fn()
    row = interleaved(list(parts.values()), min(calls, 50), rounds)
    print(f"\nhost us, median of {rounds} rounds (GPU busy throughout)")
    for name, v in zip(parts, row):
        print(f"{name:28} {v:8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every column in turn (host times drift)")
    ap.add_argument("--profile", default="fwd", choices=("fwd", "dgrad", "wgrad", "none"))
    ap.add_argument("--moe", default="", help="comma list of MXFP4 MoE layouts (ep8, tp8): time those instead")
    ap.add_argument("--moe-tokens", default="1,4096", help="comma list of token counts for --moe")
    ap.add_argument("--breakdown", action="store_true", help="only the parts of one eager grouped_mm step")
    args = ap.parse_args()
    if args.moe:
        # 50 runs of up to seven launches stay inside the launch queue while the GPU spins
        moe(args.moe.split(","), [int(t) for t in args.moe_tokens.split(",")], min(args.calls, 50))
        return
    x, w, gy, offs = demo._grouped_problem(args.tokens, "cuda")
    if args.breakdown:
        breakdown(x, w, gy, offs, args.calls, args.rounds)
        return
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
    ops = torch.ops.cake_moe   # what compiled code calls
    op = {
        "fwd": lambda: ops.grouped_gemm_fwd(x, w, offs),
        "dgrad": lambda: ops.grouped_gemm_dgrad(gy, w, offs),
        "wgrad": lambda: ops.grouped_gemm_wgrad(gy, x, offs, w.shape[0], torch.bfloat16, "det"),
    }
    peer = {
        "fwd": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
        "dgrad": lambda: torch._grouped_mm(gy, w, offs=offs),
        "wgrad": lambda: torch._grouped_mm(gy.t(), x, offs=offs),
    }
    print(f"host us per call, T={args.tokens}, {args.calls} calls each, median of {args.rounds} rounds "
          "(GPU busy throughout)")
    print(f"{'op':6} {'one-shot':>9} {'cache off':>9} {'prepared':>9} {'the op':>9} {'torch':>9}")
    for name in ("fwd", "dgrad", "wgrad"):
        row = interleaved([one_shot[name], CacheOff(one_shot[name]), prepared[name], op[name], peer[name]],
                          args.calls, args.rounds)
        print(f"{name:6} " + " ".join(f"{v:9.1f}" for v in row))
    print(f"\nhost us per forward + backward, T={args.tokens}, median of {args.rounds} rounds (GPU busy throughout)")
    print(f"{'eager grouped_mm':>17} {'cache off':>9} {'the op':>9} {'torch':>9}")
    eager, op, peer_step = _autograd_steps(x, w, gy, offs)
    steps = [eager, CacheOff(eager), op, peer_step]
    for step in (eager, op, peer_step):  # torch's autograd waits for the GPU in its first backward calls
        step()
        step()
    # 50 steps of three to five launches stay inside the launch queue while the GPU spins
    row = interleaved(steps, min(args.calls, 50), args.rounds)
    print(f"{row[0]:17.1f} " + " ".join(f"{v:9.1f}" for v in row[1:]))
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
