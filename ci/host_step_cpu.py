"""The Python side of eager grouped-GEMM calls, timed on a machine without a GPU.

CPU tensors stand in for CUDA ones and every one-shot call finds a kept launch that enqueues
nothing (the kernel launches, the stream query and the capture check are stubbed), so what is
timed is this package's Python and torch's autograd machinery around the calls: an eager
``grouped_mm`` forward + backward (and the same with its backward's dgrad and wgrad each looking
up its own kept launch instead of the pair's), the same step through an autograd.Function with no kernel
(torch's share), and the three one-shot calls, each alone in a tight loop ("hot") and between
steps of the no-kernel Function ("cold": the state a training step leaves them in, which costs
them 1.5-2.5x their tight-loop time on a server CPU).

    PYTHONPATH=python python ci/host_step_cpu.py [--rounds 15] [--calls 400]

The shapes are small so that torch.empty stays in the CPU allocator's fast path (a large CPU
allocation costs page faults a CUDA caching allocator never pays). To compare two trees, run
each in turn several times (their medians drift with the host together):
    for i in 1 2 3 4; do for t in OLD NEW; do PYTHONPATH=$t/python python ci/host_step_cpu.py; done; done
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import cake_moe
from cake_moe import _runtime
from cake_moe.grouped_gemm import _ops
from host_overhead import StandIn   # (ci/, this script's directory, is on sys.path)

T, H, N, E = 64, 64, 64, 4


class _NoKernel:
    """A bound launch that enqueues nothing."""

    def launch(self, stream):
        pass

    def launch_to(self, stream, out_ptr):
        pass


def _stub_launch(op: str, out: torch.Tensor, device: torch.device) -> _ops.GroupedGemmLaunch:
    return _ops.GroupedGemmLaunch(op, _NoKernel(), device, out, (None, None, None, None))


def stub_kernels() -> None:
    """CPU tensors take the CUDA path, whose preparation binds a launch that does nothing."""
    _ops._is_cuda = lambda t: isinstance(t, torch.Tensor)
    _runtime.stream_handle = lambda device: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    _ops.prepare_grouped_gemm_fwd = lambda x, w, offs, out, zero_unrouted_rows=False: _stub_launch(
        "fwd", torch.empty(x.shape[0], w.shape[1], dtype=x.dtype), x.device)
    _ops.prepare_grouped_gemm_dgrad = lambda g, w, offs, out, zero_unrouted_rows=False: _stub_launch(
        "dgrad", torch.empty(g.shape[0], w.shape[2], dtype=g.dtype), g.device)
    _ops.prepare_grouped_gemm_wgrad = lambda g, x, offs, out, dtype, e, variant, workspace=None: _stub_launch(
        "wgrad", torch.empty(e, g.shape[1], x.shape[1], dtype=dtype), g.device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15, help="rounds of every column in turn (host times drift)")
    ap.add_argument("--calls", type=int, default=400, help="calls per column per round")
    args = ap.parse_args()
    stub_kernels()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    w = torch.randn(E, N, H, generator=gen).to(torch.bfloat16)
    gy = torch.randn(T, N, generator=gen).to(torch.bfloat16)
    offs = torch.tensor([10, 30, 30, T], dtype=torch.int32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def eager():
        cake_moe.grouped_mm(xr, wr, offs).backward(gy)
        xr.grad = wr.grad = None

    def stand():
        StandIn.apply(xr, wr, offs, "det").backward(gy)
        xr.grad = wr.grad = None

    calls = {
        "fwd": lambda: cake_moe.grouped_gemm_fwd(x, w, offs),
        "dgrad": lambda: cake_moe.grouped_gemm_dgrad(gy, w, offs),
        "wgrad": lambda: cake_moe.grouped_gemm_wgrad(gy, x, offs),
    }

    def cold(fn):
        def run():
            stand()
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        return run

    paired = _ops._eager_grads

    def separate(g, x, w, offs, need_dx, need_dw, variant):
        return (_ops.dgrad_impl(g, w, offs, zero_unrouted_rows=True) if need_dx else None,
                _ops.wgrad_impl(g, x, offs, w.shape[0], w.dtype, variant) if need_dw else None)

    def eager_separate():   # the backward's two calls each looking up their own launch
        _ops._eager_grads = separate
        try:
            eager()
        finally:
            _ops._eager_grads = paired

    columns = {"eager grouped_mm step": eager, "  its backward as 2 lookups": eager_separate,
               "no-kernel Function step": stand}
    columns.update({f"{op} one-shot, hot": fn for op, fn in calls.items()})
    colds = {f"{op} one-shot, cold": cold(fn) for op, fn in calls.items()}
    calls["fwd"]()
    key = next(iter(_ops._kept))
    colds.update({   # the pieces of a kept call, cold
        "  nothing, cold": cold(lambda: None),
        "  torch.empty, cold": cold(lambda: torch.empty((T, N), dtype=torch.bfloat16, device=x.device)),
        "  3 operand identities, cold": cold(lambda: (_ops._identity(x), _ops._identity(w), _ops._identity(offs))),
        "  kept-launch lookup, cold": cold(lambda: _ops._kept.get(key)),
        "  3 switch reads, cold": cold(lambda: tuple(map(_runtime.env, ("A_", "B_", "C_")))),
    })
    for fn in [*columns.values(), *colds.values()]:
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in [*columns, *colds]}
    for _ in range(args.rounds):
        for name, fn in columns.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / args.calls)
        for name, fn in colds.items():   # only the call is timed, not the step before it
            times[name].append(statistics.median(fn() for _ in range(args.calls)))
    print(f"host us (CPU tensors, no kernels), median of {args.rounds} rounds of {args.calls} calls")
    for name, v in times.items():
        print(f"{name:28} {statistics.median(v) * 1e6:8.2f}")


if __name__ == "__main__":
    main()
