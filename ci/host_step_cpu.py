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
    PYTHONPATH=python python ci/host_step_cpu.py --moe

``--moe`` times ``CakeMxfp4MoEWrapper.plan()`` instead (tp8 geometry, T = 1, the binding stood
in): with the same tensors again (the plan the wrapper keeps) and checked and bound on every
call (CAKE_MOE_ONE_SHOT_CACHE=0; the extension's own cost, its DLPack imports of 15 tensors and
the plan it builds, is not in it: 15 ``__dlpack__`` exports are timed beside it as a floor).

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
from cake_moe.grouped_gemm import _kept_launches, _ops
from host_overhead import StandIn   # (ci/, this script's directory, is on sys.path)

T, H, N, E = 64, 64, 64, 4


class _NoKernel:
    """A bound launch that enqueues nothing."""

    def launch(self, stream):
        pass

    def launch_to(self, stream, out_ptr):
        pass


def _stub_launch(op: str, out: torch.Tensor, device: torch.device) -> cake_moe.GroupedGemmLaunch:
    return cake_moe.GroupedGemmLaunch(op, _NoKernel(), device, out, (None, None, None, None))


def stub_kernels() -> None:
    """CPU tensors take the CUDA path, whose preparation binds a launch that does nothing."""
    _kept_launches._is_cuda = lambda t: isinstance(t, torch.Tensor)
    _runtime.stream_handle = lambda device: 0
    _runtime.capturing = lambda device: False
    _ops.prepare_grouped_gemm_fwd = lambda x, w, offs, out, zero_unrouted_rows=False: _stub_launch(
        "fwd", torch.empty(x.shape[0], w.shape[1], dtype=x.dtype), x.device)
    _ops.prepare_grouped_gemm_dgrad = lambda g, w, offs, out, zero_unrouted_rows=False: _stub_launch(
        "dgrad", torch.empty(g.shape[0], w.shape[2], dtype=g.dtype), g.device)
    _ops.prepare_grouped_gemm_wgrad = lambda g, x, offs, out, dtype, e, variant, workspace=None: _stub_launch(
        "wgrad", torch.empty(e, g.shape[1], x.shape[1], dtype=dtype), g.device)


class _NoPlan:
    forms, split_width = "", False

    def run(self, stream):
        pass


def moe_plan(rounds: int, calls: int) -> None:
    """Host us of plan(): kept, and checked and bound (binding stood in), in turn."""
    import os

    from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper
    from cake_moe.mxfp4_moe._prepare import LAYOUT
    _runtime.ext = lambda: type("Ext", (), {"mxfp4_moe_plan": staticmethod(lambda *a, **k: _NoPlan())})
    _runtime.require_served = lambda device, what: None
    torch.cuda.get_device_properties = lambda device: type("Props", (), {"multi_processor_count": 132})()
    torch.cuda.get_device_capability = lambda device: (9, 0)
    e, k, h, i, t = 896, 16, 7168, 384, 1      # tp8
    moe = CakeMxfp4MoEWrapper(e, k, h, i, sm_count=132)
    moe.device = torch.device("cpu")           # CPU tensors, the kernel path's checks
    u8 = torch.uint8
    weights = dict(layout=LAYOUT, num_local_experts=e, hidden_size=h, intermediate_shard=i,
                   w1=torch.empty(e, 2 * i, h // 2, dtype=u8), w1_sf=torch.empty(e, 2 * i, h // 32, dtype=u8),
                   w2=torch.empty(e, h, i // 2, dtype=u8), w2_sf=torch.empty(e, h, i // 32, dtype=u8),
                   w1_sf_max=torch.zeros(e, dtype=u8), w2_sf_max=torch.zeros(e, dtype=u8))
    need = moe.get_workspace_size(t)
    raw = torch.empty(need + 256, dtype=u8)
    ws = raw[(-raw.data_ptr()) % 256:][:need]
    x, x_sf = torch.zeros(t, h, dtype=torch.float8_e4m3fn), torch.zeros(t, h // 32, dtype=u8)
    ids, w = torch.zeros(t, k, dtype=torch.int32), torch.zeros(t, k)
    beta, out = torch.zeros(e), torch.empty(t, h, dtype=torch.bfloat16)
    tensors = [x.view(u8), x_sf, ids, w, *(weights[n] for n in ("w1", "w1_sf", "w2", "w2_sf", "w1_sf_max",
                                                                 "w2_sf_max")), beta, beta, ws, out, ids]

    def plan():
        moe.plan(x, x_sf, ids, w, weights, beta=beta, linear_beta=beta, workspace=ws, output=out)

    def timed(fn, env: str | None = None) -> float:
        if env is not None:
            os.environ["CAKE_MOE_ONE_SHOT_CACHE"] = env
        try:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t0) / calls * 1e6
        finally:
            os.environ.pop("CAKE_MOE_ONE_SHOT_CACHE", None)

    columns = {"plan(), kept": lambda: timed(plan), "plan(), checked and bound": lambda: timed(plan, "0"),
               "15 __dlpack__ exports": lambda: timed(lambda: [t.__dlpack__() for t in tensors])}
    plan()
    times: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(rounds):
        for name, fn in columns.items():
            times[name].append(fn())
    print(f"MXFP4 MoE plan() host us (tp8, T = 1, CPU tensors, binding stood in), median of {rounds} rounds")
    for name, v in times.items():
        print(f"{name:28} {statistics.median(v):8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15, help="rounds of every column in turn (host times drift)")
    ap.add_argument("--calls", type=int, default=400, help="calls per column per round")
    ap.add_argument("--moe", action="store_true", help="time the MXFP4 MoE plan() instead")
    args = ap.parse_args()
    if args.moe:
        moe_plan(args.rounds, args.calls)
        return
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
    key = next(iter(_kept_launches._kept))
    colds.update({   # the pieces of a kept call, cold
        "  nothing, cold": cold(lambda: None),
        "  torch.empty, cold": cold(lambda: torch.empty((T, N), dtype=torch.bfloat16, device=x.device)),
        "  3 operand identities, cold": cold(lambda: (_runtime.tensor_identity(x), _runtime.tensor_identity(w), _runtime.tensor_identity(offs))),
        "  kept-launch lookup, cold": cold(lambda: _kept_launches._kept.get(key)),
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
