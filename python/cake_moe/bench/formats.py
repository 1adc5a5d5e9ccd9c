"""Quantizer and FP4 dequantizer throughput against the device-to-device copy bandwidth measured
in the same run.

Bytes counted per quantizer: input read + elements written + scales written; per dequantizer:
elements and scales read + output written (in the input's dtype). Inputs are random normal
(never zeros), 256 MiB by default.
"""
from __future__ import annotations

import datetime

import torch

from .. import formats
from . import timing


def _cases(x: torch.Tensor):
    g = formats.nvfp4_global_scale(x)
    q4, s4 = formats.mxfp4_quantize(x)
    qn, sn = formats.nvfp4_quantize(x, g)
    return {
        "mxfp8_quantize": (lambda: formats.mxfp8_quantize(x), x.numel() * (x.element_size() + 1 + 1 / 32)),
        "mxfp8_quantize_swizzled": (lambda: formats.mxfp8_quantize(x, swizzled=True),
                                    x.numel() * (x.element_size() + 1 + 1 / 32)),
        "mxfp4_quantize": (lambda: formats.mxfp4_quantize(x), x.numel() * (x.element_size() + 0.5 + 1 / 32)),
        "nvfp4_quantize": (lambda: formats.nvfp4_quantize(x, g), x.numel() * (x.element_size() + 0.5 + 1 / 16)),
        "mxfp4_dequantize": (lambda: formats.mxfp4_dequantize(q4, s4, dtype=x.dtype),
                             x.numel() * (0.5 + 1 / 32 + x.element_size())),
        "nvfp4_dequantize": (lambda: formats.nvfp4_dequantize(qn, sn, g, dtype=x.dtype),
                             x.numel() * (0.5 + 1 / 16 + x.element_size())),
    }


def run(mib: int = 256, cols: int = 7168, dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    elem = torch.tensor([], dtype=dtype).element_size()
    rows = (mib << 20) // (cols * elem)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    copy_bw = timing.copy_bandwidth(mib << 20)
    rows_out = []
    for name, (fn, nbytes) in _cases(x).items():
        ms = timing.time_cuda(fn)
        bw = nbytes / (ms * 1e-3)
        rows_out.append({"op": name, "shape": [rows, cols], "dtype": str(dtype).replace("torch.", ""),
                         "ms": ms, "bytes": int(nbytes), "bandwidth_TBps": bw / 1e12,
                         "copy_TBps": copy_bw / 1e12, "ratio_vs_copy": bw / copy_bw,
                         "gpu": timing.gpu_name(), "date": datetime.date.today().isoformat()})
    return rows_out


def markdown(rows: list[dict]) -> str:
    lines = ["| op | shape | dtype | time (ms) | TB/s | copy TB/s | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape'][0]}x{r['shape'][1]} | {r['dtype']} | {r['ms']:.3f} | "
                     f"{r['bandwidth_TBps']:.2f} | {r['copy_TBps']:.2f} | {r['ratio_vs_copy']:.2f} |")
    return "\n".join(lines)


def main(out_prefix: str | None = None) -> list[dict]:
    rows = run() + run(dtype=torch.float32)
    md = markdown(rows)
    print(md)
    if out_prefix:
        timing.write_results(out_prefix, rows, md)
    return rows
