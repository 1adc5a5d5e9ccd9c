"""Number-format kernels: MXFP8, MXFP4 and NVFP4 quantize / dequantize (SPEC §3).

Every quantizer and dequantizer takes an optional ``out=`` (``(q, scale)`` for quantizers, one tensor for
dequantizers) to write into caller-owned memory. CUDA tensors run the compiled kernels (bit-identical to ``cake_moe.reference.formats``); CPU
tensors run that reference. Scales come back linear ``[rows, K/block]`` or, with
``swizzled=True``, flat in the 128x4 layout Blackwell block-scaled MMA reads.

>>> q, s = cake_moe.formats.mxfp8_quantize(x)                 # x [..., K] bf16/fp32, K % 32 == 0
>>> y = cake_moe.formats.mxfp8_dequantize(q, s, dtype=torch.bfloat16)
"""
from __future__ import annotations

import torch

from .. import _validate
from ..reference import formats as _ref
from ..reference.formats import OCP_FLOOR, ROUND_UP
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
    except (KeyError, TypeError):   # TypeError: an unhashable value
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
    return _call("mxfp8_quantize", x, _validate.boolean(swizzled, "swizzled"), _rule(scale_rule), out=out)


def mxfp4_quantize(x: torch.Tensor, *, swizzled: bool = False, scale_rule: str = ROUND_UP,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 quantization along the last dim (E2M1 packed two per byte, low nibble first).

    Returns ``(q, scale)``: q uint8 ``[..., K/2]``; scale uint8 UE8M0.
    """
    return _call("mxfp4_quantize", x, _validate.boolean(swizzled, "swizzled"), _rule(scale_rule), out=out)


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor, *, swizzled: bool = False,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization (blocks of 16, E4M3 scales) with FP32 encode scale ``global_scale``
    (a one-element tensor on x's device, positive and finite; see :func:`nvfp4_global_scale`.
    Its value is not checked, as that would wait for the device, except under CAKE_MOE_CHECK=1).

    Returns ``(q, scale)``: q uint8 ``[..., K/2]``; scale float8_e4m3fn.
    """
    return _call("nvfp4_quantize", x, global_scale, _validate.boolean(swizzled, "swizzled"), out=out)


def mxfp8_dequantize(q: torch.Tensor, scale: torch.Tensor, *, swizzled: bool = False,
                     dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    """MXFP8 dequantization: each element of q times its block's UE8M0 scale 2^(code - 127).

    q float8_e4m3fn (or its bytes as uint8) ``[..., K]``, K % 32 == 0; scale uint8 ``[rows, K/32]``,
    or flat in the 128x4 layout with ``swizzled=True``. Returns ``dtype`` (bf16 or fp32)
    ``[..., K]``, into ``out`` if given.
    """
    return _call("mxfp8_dequantize", q, scale, _validate.boolean(swizzled, "swizzled"), dtype, out=out)


def mxfp4_dequantize(q: torch.Tensor, scale: torch.Tensor, *, swizzled: bool = False,
                     dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    """MXFP4 dequantization: each E2M1 element times its block's UE8M0 scale 2^(code - 127).

    q uint8 ``[..., K/2]`` (two elements per byte, low nibble first), K % 32 == 0; scale uint8
    ``[rows, K/32]``, or flat in the 128x4 layout with ``swizzled=True``. Returns ``dtype`` (bf16
    or fp32) ``[..., K]``, into ``out`` if given.
    """
    return _call("mxfp4_dequantize", q, scale, _validate.boolean(swizzled, "swizzled"), dtype, out=out)


def nvfp4_dequantize(q: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, *,
                     swizzled: bool = False, dtype: torch.dtype = torch.bfloat16,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 dequantization: value = (e2m1 * s) / global_scale, with s the block's E4M3 scale and
    ``global_scale`` the FP32 encode scale the quantizer was given (one element on q's device,
    positive and finite; checked only under CAKE_MOE_CHECK=1).

    q uint8 ``[..., K/2]`` (two elements per byte, low nibble first), K % 16 == 0; scale
    float8_e4m3fn (or its bytes as uint8) ``[rows, K/16]``, or flat in the 128x4 layout with
    ``swizzled=True``. Returns ``dtype`` (bf16 or fp32) ``[..., K]``, into ``out`` if given.
    """
    return _call("nvfp4_dequantize", q, scale, global_scale, _validate.boolean(swizzled, "swizzled"), dtype, out=out)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The usual NVFP4 encode scale 448 * 6 / amax(x) as an FP32 [1] tensor on x's device (amax
    over the finite elements; 1 if none is nonzero or x is empty), at most the largest finite FP32 value."""
    _validate.tensor(x, "x", contiguous=False)
    if not x.is_floating_point():
        raise ValueError(f"x must have a floating-point dtype, got {x.dtype}")
    return _ref.nvfp4_global_scale(x)


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Linear ``[rows, cols]`` scales -> flat bytes in the 128x4 layout (rows padded to 128, cols
    to 4, padding zero), of scale's dtype."""
    _validate.tensor(scale, "scale", ndim=2, contiguous=False)
    return _ref.swizzle_scales(scale)


def unswizzle_scales(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: the flat 128x4-layout scales of ``rows`` x ``cols`` ->
    linear ``[rows, cols]``."""
    _validate.tensor(flat, "flat", contiguous=False)
    rows, cols = _validate.integer(rows, "rows"), _validate.integer(cols, "cols")
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be >= 0, got {rows} and {cols}")
    return _ref.unswizzle_scales(flat, rows, cols)
