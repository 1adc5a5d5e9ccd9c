"""``cake-moe demo``: the default MoE layer's pieces, checked and timed.

1. Number formats at the family-B contract geometry (H = 7168, I = 3072; activations [T, H]):
   each quantizer is compared bit for bit with the pure-torch reference and timed against a
   device copy of the same bytes.
2. Family A: one expert projection of a training MoE layer (H = 2048, I = 768, E = 16, w13
   [E, 2I, H]) through ``grouped_mm`` forward and backward, checked against the FP64
   reference and timed against ``torch._grouped_mm``.
3. Family B: the MXFP4 x MXFP8 SiTU layer at its contract geometry (H = 7168, I = 3072, E = 896,
   top_k = 16, the ep8 rank: 112 local experts) on a decode step of 8 tokens, checked against
   the FP64 reference and timed against the copy bandwidth.
Without a GPU the references run on the CPU (and say so), on reduced layers where the full one
would take minutes. Later families add their layers here.
"""
from __future__ import annotations

import math
import time

import torch

from . import _runtime, formats
from .reference import formats as ref

H, I = 7168, 3072


def _steps(x: torch.Tensor, w: torch.Tensor):
    g = ref.nvfp4_global_scale(x)
    return [
        ("activations -> MXFP8 (family B input)", lambda: formats.mxfp8_quantize(x),
         lambda: ref.quantize_mx(x, "mxfp8")),
        ("expert w1 -> MXFP4, swizzled scales", lambda: formats.mxfp4_quantize(w, swizzled=True),
         lambda: ref.quantize_mx(w, "mxfp4", swizzled=True)),
        ("activations -> NVFP4 (family C input)", lambda: formats.nvfp4_quantize(x, g),
         lambda: ref.quantize_nvfp4(x, g)),
    ]


GG_H, GG_I, GG_E = 2048, 768, 16


def _grouped_problem(t: int, device: str, h: int = GG_H, i: int = GG_I, e: int = GG_E):
    g = torch.Generator().manual_seed(1)
    sizes = (torch.rand(e, generator=g) + 0.2)
    sizes = (sizes / sizes.sum() * t).floor().long()
    sizes[0] += t - int(sizes.sum())
    offs = sizes.cumsum(0).to(torch.int32).to(device)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(e, 2 * i, h, generator=g) * 0.02).to(torch.bfloat16).to(device)
    gy = torch.randn(t, 2 * i, generator=g).to(torch.bfloat16).to(device)
    return x, w, gy, offs


GG_BUDGET = 6e-3   # relative RMS against FP64: fails a 2% perturbation


def _grouped_ok(errs) -> bool:
    """Every error finite and within budget (a NaN compares False with everything, so max()
    of a list holding one would not see it)."""
    return all(math.isfinite(e) and e < GG_BUDGET for e in errs)


def _grouped_check(t: int, device: str, dims=(GG_H, GG_I, GG_E)) -> tuple[float, float, float]:
    from . import grouped_mm
    from .reference import grouped_gemm as gref
    x, w, gy, offs = _grouped_problem(t, device, *dims)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = grouped_mm(xr, wr, offs)
    y.backward(gy)
    return (gref.rel_rms(y, gref.fwd(x, w, offs)), gref.rel_rms(xr.grad, gref.dgrad(gy, w, offs)),
            gref.rel_rms(wr.grad, gref.wgrad(gy, x, offs)))


MOE_T = 8
MOE_CPU = {"num_local": 2, "num_experts": 16, "top_k": 4}  # the reduced layer of the CPU path


def _moe_layer(device: str, l: int, e: int, k: int, offset: int):
    """Random family-B bank, a decode step's inputs (plan() keywords) and the FP64 reference's
    output, with the reference's time in seconds."""
    from .bench import mxfp4_moe as bm
    from .reference import moe as moe_ref
    gen = torch.Generator(device=device).manual_seed(2)
    bank = bm.random_bank(l, I, gen)
    x, x_sf, ids, w = bm.random_inputs(MOE_T, l, offset, gen, e=e, k=k)
    beta, lbeta = bm.random_situ(l, gen)
    inputs = dict(x=x, x_sf=x_sf, topk_ids=ids, topk_weights=w, beta=beta, linear_beta=lbeta)
    t0 = time.perf_counter()
    want = moe_ref.mxfp4_situ_moe(**inputs, **bank, num_experts=e, num_local_experts=l, local_expert_offset=offset)
    return inputs, bank, want, time.perf_counter() - t0


def _moe_cpu() -> bool:
    """The reference on a reduced layer, the same layer through the API on a CPU wrapper (weight
    preparation, plan, run: its plan runs the reference, so the bits must agree), and the
    decision for the contract rank."""
    from .bench.mxfp4_moe import E, LAYOUTS, TOP_K
    from .mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
    l, e, k = MOE_CPU["num_local"], MOE_CPU["num_experts"], MOE_CPU["top_k"]
    a, bank, want, secs = _moe_layer("cpu", l, e, k, 0)
    print(f"  MXFP4 SiTU MoE reference on CPU, REDUCED layer: H={H}, I={I}, {l} local experts of E={e}, top_k={k} "
          f"(the contract has 112 of {E}, top_k={TOP_K}), T={MOE_T}: {secs * 1e3:.0f} ms, output rms "
          f"{want.float().square().mean().sqrt():.3g}")
    t0 = time.perf_counter()
    p = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    prep_ms = (time.perf_counter() - t0) * 1e3
    moe = CakeMxfp4MoEWrapper(e, k, H, I, num_local_experts=l, local_expert_offset=0, device="cpu")
    out = torch.empty(MOE_T, H, dtype=torch.bfloat16)
    plan = moe.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], p, beta=a["beta"],
                    linear_beta=a["linear_beta"], workspace=torch.empty(moe.get_workspace_size(MOE_T), dtype=torch.uint8),
                    output=out)
    same = torch.equal(plan.run(), want)
    print(f"  the same layer through prepare / plan / run on a CPU wrapper: "
          f"{'the reference bit for bit' if same else 'DIFFERS from the reference'}")
    d = CakeMxfp4MoEWrapper(E, TOP_K, H, I, **LAYOUTS["ep8"]).decide(MOE_T)
    print(f"  prepare_cake_mxfp4_weights on CPU ({l} experts): {prep_ms:.0f} ms; contract ep8 rank at T={MOE_T}: "
          f"supported={d.supported} path={d.path} ({d.reason})")
    return same


def _moe_gpu() -> tuple[bool, str]:
    """The contract ep8 rank on one decode step: rel. RMS against the FP64 reference, time of
    plan.run() (CUDA graph), effective weight bandwidth against the copy bandwidth."""
    from .bench import mxfp4_moe as bm
    from .bench import timing
    from .mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
    from .reference.grouped_gemm import rel_rms
    l, offset, _ = bm.layout_dims("ep8")
    a, bank, want, _ = _moe_layer("cuda", l, bm.E, bm.TOP_K, offset)
    p = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    runner = CakeMxfp4MoEWrapper(bm.E, bm.TOP_K, H, I, **bm.LAYOUTS["ep8"])
    out = torch.empty(MOE_T, H, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(runner.get_workspace_size(MOE_T), dtype=torch.uint8, device="cuda")
    plan = runner.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], p,
                       beta=a["beta"], linear_beta=a["linear_beta"], workspace=ws, output=out)
    out.fill_(float("nan"))
    plan.run()
    torch.cuda.synchronize()
    err = rel_rms(out, want)
    ok = err < 5e-3
    ms = timing.time_graph(plan.run)
    local = a["topk_ids"].long() - offset
    experts = local[(local >= 0) & (local < l)].unique().numel()
    frac = experts * bm.expert_bytes(I) / (ms * 1e-3) / timing.copy_bandwidth(1 << 30)
    return ok, (f"  MXFP4 SiTU MoE ep8 rank (H={H}, I={I}, {l} of {bm.E} experts, top_k={bm.TOP_K}) T={MOE_T}: "
                f"rel. RMS vs FP64 {err:.1e} {'ok' if ok else 'OVER BUDGET'}; {ms * 1e3:.1f} us, {experts} routed "
                f"experts = {frac:.2f} of the copy bandwidth")


def _same(a, b) -> bool:
    return all(torch.equal(p.view(torch.uint8).cpu(), q.view(torch.uint8).cpu()) for p, q in zip(a, b))


def main(tokens: int | None = None) -> int:
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens must be a positive int, got {tokens}")
    gpu = torch.cuda.is_available()
    torch.manual_seed(0)
    why = _runtime.unserved_reason(torch.cuda.current_device()) if gpu else None
    if why:
        print(f"cake-moe demo: {why}; running the pure-torch reference on the CPU instead")
        gpu = False
    if not gpu:
        t = tokens or 64
        print(f"cake-moe demo: no CUDA GPU visible; running the pure-torch reference on the CPU (T={t}, H={H})")
        x = torch.randn(t, H, dtype=torch.bfloat16)
        w = torch.randn(2 * I, H, dtype=torch.bfloat16) * 0.02
        for name, _, reference in _steps(x, w):
            t0 = time.perf_counter()
            q, s = reference()
            ms = (time.perf_counter() - t0) * 1e3
            print(f"  {name:42} reference  {ms:8.2f} ms on CPU  q{tuple(q.shape)} scale{tuple(s.shape)}")
        # round trip: the quantization error a user should expect
        q, s = ref.quantize_mx(x, "mxfp8")
        err = (ref.dequantize_mx(q, s, "mxfp8") - x.float()).norm() / x.float().norm()
        print(f"  MXFP8 round-trip relative error {err:.3e}")
        t0 = time.perf_counter()
        dims = (512, 256, 4)  # a reduced layer: the FP64 CPU reference of the full one takes a minute
        errs = _grouped_check(t, "cpu", dims)
        grouped_ok = _grouped_ok(errs)
        print(f"  grouped_mm fwd+bwd (H={dims[0]}, I={dims[1]}, E={dims[2]}, T={t}) reference on CPU "
              f"{(time.perf_counter() - t0) * 1e3:.0f} ms; rel. RMS vs FP64 fwd {errs[0]:.1e} dx {errs[1]:.1e} "
              f"dw {errs[2]:.1e} {'ok' if grouped_ok else 'OVER BUDGET'}")
        if not grouped_ok:
            print("demo FAILED: the CPU grouped_mm is over its budget")
            return 1
        if not _moe_cpu():
            print("demo FAILED: the CPU plan differs from the reference")
            return 1
        print("demo done (CPU reference only: install on a machine with an NVIDIA GPU to run the kernels)")
        return 0

    from .bench import timing
    t = tokens or 4096
    print(f"cake-moe demo on {timing.gpu_name()}: T={t}, H={H}, I={I}")
    x = torch.randn(t, H, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(2 * I, H, dtype=torch.bfloat16, device="cuda") * 0.02
    copy_src = torch.empty(x.numel() * 3, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    copy_ms = timing.time_cuda(lambda: copy_dst.copy_(copy_src))
    failures = 0
    first = True
    for name, kernel, reference in _steps(x, w):
        if first:  # the first call loads the form's image (lazy, checksum-verified)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            kernel()
            torch.cuda.synchronize()
            print(f"  first call incl. lazy image load: {(time.perf_counter() - t0) * 1e3:.1f} ms")
            first = False
        for stale in kernel():   # poison the blocks the next call's outputs will likely reuse
            stale.view(torch.uint8).fill_(0xFF)
        got = kernel()
        ok = _same(got, reference())
        failures += not ok
        ms = timing.time_cuda(kernel)
        print(f"  {name:42} {'bit-exact' if ok else 'MISMATCH':9} {ms * 1e3:8.1f} us")
    print(f"  (device copy of 3 bytes/element: {copy_ms * 1e3:8.1f} us)")
    steps = 3
    errs = _grouped_check(t, "cuda")
    ok = _grouped_ok(errs)
    failures += not ok
    steps += 1
    from . import (grouped_gemm_dgrad, grouped_gemm_fwd, grouped_gemm_wgrad, prepare_grouped_gemm_dgrad,
                   prepare_grouped_gemm_fwd, prepare_grouped_gemm_wgrad)
    gx, gw, ggy, goffs = _grouped_problem(t, "cuda")
    # prepared launches: the kernels' device time; one-shot calls add their host-side work
    # (validation, binding, tensor maps), which at this size can outlast the kernel
    launches = [prepare_grouped_gemm_fwd(gx, gw, goffs), prepare_grouped_gemm_dgrad(ggy, gw, goffs),
                prepare_grouped_gemm_wgrad(ggy, gx, goffs)]
    prepared = [timing.time_cuda(launch.launch) for launch in launches]
    one_shot = [timing.time_cuda(lambda: grouped_gemm_fwd(gx, gw, goffs)),
                timing.time_cuda(lambda: grouped_gemm_dgrad(ggy, gw, goffs)),
                timing.time_cuda(lambda: grouped_gemm_wgrad(ggy, gx, goffs))]
    line = (f"  grouped_mm fwd+bwd H={GG_H} I={GG_I} E={GG_E} T={t}: rel. RMS fwd {errs[0]:.1e} dx {errs[1]:.1e} "
            f"dw {errs[2]:.1e} {'ok' if ok else 'OVER BUDGET'}; fwd/dgrad/wgrad prepared "
            + "/".join(f"{m * 1e3:.0f}" for m in prepared) + " us, one-shot "
            + "/".join(f"{m * 1e3:.0f}" for m in one_shot) + " us")
    from .bench.grouped_gemm import op_callables  # torch._grouped_mm on each op's operands
    peers = [op_callables(op, gx, gw, ggy, goffs)[1] for op in ("fwd", "dgrad", "wgrad")]
    if all(peers):
        line += "; torch._grouped_mm " + "/".join(f"{timing.time_cuda(p) * 1e3:.0f}" for p in peers) + " us"
    print(line)
    ok, line = _moe_gpu()
    failures += not ok
    steps += 1
    print(line)
    print(f"demo {'passed' if not failures else 'FAILED'}: {steps - failures} of {steps} steps match the reference")
    return 1 if failures else 0
