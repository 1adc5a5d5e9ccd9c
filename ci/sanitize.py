"""Runs every kernel form once on small shapes (odd sizes, swizzled padding, ragged groups) for
compute-sanitizer, and checks the results against the references, so that a clean run is also a
right one.   usage: python ci/sanitize.py [formats|grouped_gemm|all]"""
import os
import sys

import torch

import cake_moe
from cake_moe import formats
from cake_moe.reference import formats as ref
from cake_moe.reference import grouped_gemm as gref

torch.manual_seed(0)
bad = 0


def check(ok: bool, what: str) -> None:
    global bad
    if not ok:
        bad += 1
        print("MISMATCH", what)


def run_formats() -> None:
    for rows, cols in ((3, 64), (130, 96)):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, cols, dtype=dtype, device="cuda")
            g = ref.nvfp4_global_scale(x)
            for swz in (False, True):
                for fmt, fn in (("mxfp8", formats.mxfp8_quantize), ("mxfp4", formats.mxfp4_quantize)):
                    q, s = fn(x, swizzled=swz)
                    rq, rs = ref.quantize_mx(x.cpu(), fmt, swizzled=swz)
                    check(torch.equal(q.view(torch.uint8).cpu(), rq.view(torch.uint8)), f"{fmt} q")
                    deq = formats.mxfp8_dequantize if fmt == "mxfp8" else formats.mxfp4_dequantize
                    y = deq(q, s, swizzled=swz, dtype=dtype)
                    check(torch.equal(y.cpu(), ref.dequantize_mx(rq, rs, fmt, swizzled=swz, dtype=dtype)), f"{fmt} deq")
                q, s = formats.nvfp4_quantize(x, g, swizzled=swz)
                y = formats.nvfp4_dequantize(q, s, g, swizzled=swz, dtype=dtype)
                rq, rs = ref.quantize_nvfp4(x.cpu(), g.cpu(), swizzled=swz)
                check(torch.equal(q.cpu(), rq), "nvfp4 q")
                check(torch.equal(y.cpu(), ref.dequantize_nvfp4(rq, rs, g.cpu(), swizzled=swz, dtype=dtype)), "nvfp4 deq")


def run_grouped_gemm() -> None:
    for sizes, n, k in (([3, 0, 70, 1], 72, 136), ([130, 5], 200, 64)):
        rows = sum(sizes) + 3
        offs = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
        x = torch.randn(rows, k, device="cuda").bfloat16()
        g = torch.randn(rows, n, device="cuda").bfloat16()
        w = (torch.randn(len(sizes), n, k, device="cuda") * 0.05).bfloat16()
        check(gref.rel_rms(cake_moe.grouped_gemm_fwd(x, w, offs), gref.fwd(x, w, offs)) < 6e-3, "gg fwd")
        check(gref.rel_rms(cake_moe.grouped_gemm_dgrad(g, w, offs), gref.dgrad(g, w, offs)) < 6e-3, "gg dgrad")
        for variant in ("det", "fast"):
            dw = cake_moe.grouped_gemm_wgrad(g, x, offs, variant=variant)
            check(gref.rel_rms(dw, gref.wgrad(g, x, offs)) < 6e-3, f"gg wgrad {variant}")


which = sys.argv[1] if len(sys.argv) > 1 else "all"
if which in ("formats", "all"):
    run_formats()
if which in ("grouped_gemm", "all"):
    run_grouped_gemm()
torch.cuda.synchronize()
print(f"sanitize run ({which}, portable={os.environ.get('CAKE_MOE_GG_FORCE_PORTABLE', '0')}): {bad} mismatches")
raise SystemExit(1 if bad else 0)
