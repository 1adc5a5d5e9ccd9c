"""``cake-moe demo``: the default MoE layer's quantization steps, checked and timed.

Geometry: the family-B contract layer (H = 7168, I = 3072; activations [T, H]). On a GPU every
step runs the compiled kernel, is compared bit for bit with the pure-torch reference and is
timed against a device copy of the same bytes. Without a GPU the reference runs on the CPU (and
says so). Later families add their layers here.
"""
from __future__ import annotations

import time

import torch

from . import formats
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


def _same(a, b) -> bool:
    return all(torch.equal(p.view(torch.uint8).cpu(), q.view(torch.uint8).cpu()) for p, q in zip(a, b))


def main(tokens: int | None = None) -> int:
    gpu = torch.cuda.is_available()
    torch.manual_seed(0)
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
    for name, kernel, reference in _steps(x, w):
        got = kernel()
        ok = _same(got, reference())
        failures += not ok
        ms = timing.time_cuda(kernel)
        print(f"  {name:42} {'bit-exact' if ok else 'MISMATCH':9} {ms * 1e3:8.1f} us")
    print(f"  (device copy of 3 bytes/element: {copy_ms * 1e3:8.1f} us)")
    print(f"demo {'passed' if not failures else 'FAILED'}: {3 - failures} of 3 steps match the reference")
    return 1 if failures else 0
