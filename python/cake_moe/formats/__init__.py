"""Number-format kernels: MXFP8, MXFP4 and NVFP4 quantize / dequantize (SPEC §3).

Every function takes an optional ``out=`` (``(q, scale)`` for quantizers, one tensor for
dequantizers) to write into caller-owned memory. CUDA tensors run the compiled kernels (bit-identical to ``cake_moe.reference.formats``); CPU
tensors run that reference. Scales come back linear ``[rows, K/block]`` or, with
``swizzled=True``, flat in the 128x4 layout Blackwell block-scaled MMA reads.

>>> q, s = cake_moe.formats.mxfp8_quantize(x)                 # x [..., K] bf16/fp32, K % 32 == 0
>>> y = cake_moe.formats.mxfp8_dequantize(q, s, dtype=torch.bfloat16)
"""
from __future__ import annotations

import torch

from ..reference.formats import (OCP_FLOOR, ROUND_UP, nvfp4_global_scale, swizzle_scales,
                                 unswizzle_scales)
from . import _ops
from ._ops import scale_numel

__all__ = [
    "mxfp8_quantize", "mxfp4_quantize", "nvfp4_quantize",
    "mxfp8_dequantize", "mxfp4_dequantize", "nvfp4_dequantize",
    "nvfp4_global_scale", "swizzle_scales", "unswizzle_scales", "scale_numel",
    "ROUND_UP", "OCP_FLOOR",
]

_RULES = {ROUND_UP: 0, OCP_FLOOR: 1}


def _rule(scale_rule: str) -> int:
    try:
        return _RULES[scale_rule]
    except KeyError:
        raise ValueError(f"scale_rule must be {ROUND_UP!r} or {OCP_FLOOR!r}, got {scale_rule!r}") from None


def _call(name: str, *args, out=None):
    """The registered torch.library op while torch.compile traces; the direct path otherwise
    (no dispatcher round trip on the eager hot path). ``out=`` is an eager-only convenience."""
    if torch.compiler.is_compiling():
        if out is not None:
            raise ValueError(f"{name}: out= is not supported under torch.compile")
        return getattr(torch.ops.cake_moe, name)(*args)
    return getattr(_ops, name + "_impl")(*args, out=out)


def mxfp8_quantize(x: torch.Tensor, *, swizzled: bool = False, scale_rule: str = ROUND_UP,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 quantization along the last dim (blocks of 32, UE8M0 scales).

    Returns ``(q, scale)``: q float8_e4m3fn with x's shape; scale uint8.
    """
    return _call("mxfp8_quantize", x, swizzled, _rule(scale_rule), out=out)


def mxfp4_quantize(x: torch.Tensor, *, swizzled: bool = False, scale_rule: str = ROUND_UP,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 quantization along the last dim (E2M1 packed two per byte, low nibble first).

    Returns ``(q, scale)``: q uint8 ``[..., K/2]``; scale uint8 UE8M0.
    """
    return _call("mxfp4_quantize", x, swizzled, _rule(scale_rule), out=out)


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor, *, swizzled: bool = False,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization (blocks of 16, E4M3 scales) with FP32 encode scale ``global_scale``
    (a one-element tensor on x's device; see :func:`nvfp4_global_scale`).

    Returns ``(q, scale)``: q uint8 ``[..., K/2]``; scale float8_e4m3fn.
    """
    return _call("nvfp4_quantize", x, global_scale, swizzled, out=out)


def mxfp8_dequantize(q: torch.Tensor, scale: torch.Tensor, *, swizzled: bool = False,
                     dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    return _call("mxfp8_dequantize", q, scale, swizzled, dtype, out=out)


def mxfp4_dequantize(q: torch.Tensor, scale: torch.Tensor, *, swizzled: bool = False,
                     dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    return _call("mxfp4_dequantize", q, scale, swizzled, dtype, out=out)


def nvfp4_dequantize(q: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, *,
                     swizzled: bool = False, dtype: torch.dtype = torch.bfloat16,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    return _call("nvfp4_dequantize", q, scale, global_scale, swizzled, dtype, out=out)
