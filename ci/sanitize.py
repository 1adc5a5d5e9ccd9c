"""Runs every format kernel once on small shapes (odd row counts, swizzled padding), for
compute-sanitizer. Checks results against the reference too, so a clean run is also a right one."""
import torch

from cake_moe import formats
from cake_moe.reference import formats as ref

torch.manual_seed(0)
bad = 0
for rows, cols in ((3, 64), (130, 96)):
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(rows, cols, dtype=dtype, device="cuda")
        g = ref.nvfp4_global_scale(x)
        for swz in (False, True):
            for fmt, fn in (("mxfp8", formats.mxfp8_quantize), ("mxfp4", formats.mxfp4_quantize)):
                q, s = fn(x, swizzled=swz)
                rq, rs = ref.quantize_mx(x.cpu(), fmt, swizzled=swz)
                bad += not torch.equal(q.view(torch.uint8).cpu(), rq.view(torch.uint8))
                deq = formats.mxfp8_dequantize if fmt == "mxfp8" else formats.mxfp4_dequantize
                y = deq(q, s, swizzled=swz, dtype=dtype)
                bad += not torch.equal(y.cpu(), ref.dequantize_mx(rq, rs, fmt, swizzled=swz, dtype=dtype))
            q, s = formats.nvfp4_quantize(x, g, swizzled=swz)
            y = formats.nvfp4_dequantize(q, s, g, swizzled=swz, dtype=dtype)
            rq, rs = ref.quantize_nvfp4(x.cpu(), g.cpu(), swizzled=swz)
            bad += not torch.equal(q.cpu(), rq)
            bad += not torch.equal(y.cpu(), ref.dequantize_nvfp4(rq, rs, g.cpu(), swizzled=swz, dtype=dtype))
torch.cuda.synchronize()
print(f"sanitize run: {bad} mismatches")
raise SystemExit(1 if bad else 0)
