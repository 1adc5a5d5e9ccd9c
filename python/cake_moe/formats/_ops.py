"""Validation, launch and torch.library registration of the format kernels.

Each op has an ``*_impl`` (validate, allocate, launch on the current stream; CPU tensors go to
the reference) and a registered ``cake_moe::*`` op (``cake_moe._library``) with a fake
implementation so that torch.compile can trace it.
"""
from __future__ import annotations

import math

import torch

from .. import _library, _runtime, _validate
from ..reference import formats as ref

_BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}
_IN_DTYPES = (torch.bfloat16, torch.float32)
_OUT_DTYPES = (torch.bfloat16, torch.float32)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def scale_numel(fmt: str, rows: int, cols: int, swizzled: bool) -> int:
    """Bytes of the scale tensor for ``rows`` x ``cols`` elements in format ``fmt`` (``"mxfp8"``,
    ``"mxfp4"`` or ``"nvfp4"``; ``cols`` a multiple of its block)."""
    if not isinstance(fmt, str) or fmt not in _BLOCK:
        raise ValueError(f"fmt must be one of {', '.join(repr(f) for f in _BLOCK)}, got {fmt!r}")
    rows, cols = _validate.integer(rows, "rows"), _validate.integer(cols, "cols")
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be >= 0, got {rows} and {cols}")
    _validate.multiple(cols, _BLOCK[fmt], f"cols ({fmt})")
    return _scale_numel(fmt, rows, cols, _validate.boolean(swizzled, "swizzled"))


def _scale_numel(fmt: str, rows: int, cols: int, swizzled: bool) -> int:
    n = cols // _BLOCK[fmt]
    return _round_up(rows, 128) * _round_up(n, 4) if swizzled else rows * n


def _scale_shape(fmt: str, rows: int, cols: int, swizzled: bool) -> tuple[int, ...]:
    # the callers have checked their arguments (and may be tracing: no checks that could specialize)
    return (_scale_numel(fmt, rows, cols, swizzled),) if swizzled else (rows, cols // _BLOCK[fmt])


def _geometry(x: torch.Tensor, fmt: str) -> tuple[int, int]:
    if x.dim() < 1:
        raise ValueError("x must have at least 1 dim")
    cols = x.shape[-1]
    _validate.multiple(cols, _BLOCK[fmt], f"the last dim of x ({fmt})")
    return math.prod(x.shape[:-1]), cols


def _q_shape(x_shape, fmt: str) -> tuple[int, ...]:
    return tuple(x_shape) if fmt == "mxfp8" else (*x_shape[:-1], x_shape[-1] // 2)


def _scale_dtype(fmt: str) -> torch.dtype:
    return torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8


def _global_scale(g, device) -> torch.Tensor:
    """The one-element FP32 encode scale. Its value is read where the kernel runs and not
    checked there (that would wait for the device); in the debug mode CAKE_MOE_CHECK=1 a value
    that is not positive and finite is refused here, outside graph capture (it synchronises)."""
    _validate.tensor(g, "global_scale", dtypes=(torch.float32,), device=device, contiguous=False)
    if g.numel() != 1:
        raise ValueError(f"global_scale must have one element, got shape {tuple(g.shape)}")
    if _runtime.env("CAKE_MOE_CHECK") == "1" and not (g.is_cuda and _runtime.capturing(g.device)):
        value = float(g.reshape(()).item())   # synchronises
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"global_scale must be positive and finite, got {value} (CAKE_MOE_CHECK=1)")
    return g.reshape(1)


def _outputs(out, shapes_dtypes, device, inputs):
    """Caller-provided outputs (validated) or fresh ones."""
    if out is None:
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes_dtypes]
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(out) != len(shapes_dtypes):
        raise ValueError(f"out must hold {len(shapes_dtypes)} tensor(s), got {len(out)}")
    names = ["out"] if len(out) == 1 else ["out[0] (q)", "out[1] (scale)"]
    for t, name, (shape, dtype) in zip(out, names, shapes_dtypes):
        _validate.tensor(t, name, dtypes=(dtype,), device=device, align=16)
        _validate.shape(t, name, shape)
    _validate.no_overlap(zip(names, out), inputs)
    return out


def _quantize(fmt: str, x: torch.Tensor, global_scale, swizzled: bool, rule: int, out=None):
    _validate.tensor(x, "x", dtypes=_IN_DTYPES, align=16)
    rows, cols = _geometry(x, fmt)
    g = _global_scale(global_scale, x.device) if fmt == "nvfp4" else None
    specs = [(_q_shape(x.shape, fmt), torch.float8_e4m3fn if fmt == "mxfp8" else torch.uint8),
             (_scale_shape(fmt, rows, cols, swizzled), _scale_dtype(fmt))]
    inputs = [("x", x), ("global_scale", g)]
    if x.device.type != "cuda":  # the CPU path is the reference itself
        if fmt == "nvfp4":
            res = ref.quantize_nvfp4(x, g, swizzled=swizzled)
        else:
            res = ref.quantize_mx(x, fmt, scale_rule=ref.SCALE_RULES[rule], swizzled=swizzled)
        return res if out is None else tuple(o.copy_(r) for o, r in zip(_outputs(out, specs, x.device, inputs), res))
    _runtime.require_served(x.device, f"{fmt}_quantize")
    q, scale = _outputs(out, specs, x.device, inputs)
    if x.numel():   # an empty x has empty scales in either layout
        _runtime.ext().quantize(fmt, x.device.index, x.data_ptr(), x.dtype == torch.bfloat16, q.data_ptr(),
                                scale.data_ptr(), 0 if g is None else g.data_ptr(), rows, cols, swizzled, rule,
                                _runtime.stream_handle(x.device))
    return q, scale


def _dequantize(fmt: str, q: torch.Tensor, scale: torch.Tensor, global_scale, swizzled: bool,
                dtype: torch.dtype, out=None) -> torch.Tensor:
    q_dtypes = (torch.float8_e4m3fn, torch.uint8) if fmt == "mxfp8" else (torch.uint8,)
    _validate.tensor(q, "q", dtypes=q_dtypes, min_ndim=1, align=16)
    # UE8M0 codes for the MX formats; E4M3 for NVFP4 (its bytes as uint8 too)
    scale_dtypes = (torch.uint8, torch.float8_e4m3fn) if fmt == "nvfp4" else (torch.uint8,)
    _validate.tensor(scale, "scale", dtypes=scale_dtypes, device=q.device)
    if dtype not in _OUT_DTYPES:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    cols = q.shape[-1] * (1 if fmt == "mxfp8" else 2)
    _validate.multiple(cols, _BLOCK[fmt], f"the element count of q's last dim ({fmt})")
    rows = math.prod(q.shape[:-1])
    _validate.shape(scale, "scale", _scale_shape(fmt, rows, cols, swizzled))
    g = _global_scale(global_scale, q.device) if fmt == "nvfp4" else None
    out_shape = (*q.shape[:-1], cols)
    inputs = [("q", q), ("scale", scale), ("global_scale", g)]
    if q.device.type != "cuda":  # the CPU path is the reference itself
        if fmt == "nvfp4":
            res = ref.dequantize_nvfp4(q, scale, g, swizzled=swizzled, dtype=dtype)
        else:
            res = ref.dequantize_mx(q, scale, fmt, swizzled=swizzled, dtype=dtype)
        return res if out is None else _outputs(out, [(out_shape, dtype)], q.device, inputs)[0].copy_(res)
    _runtime.require_served(q.device, f"{fmt}_dequantize")
    (out,) = _outputs(out, [(out_shape, dtype)], q.device, inputs)
    if out.numel():
        _runtime.ext().dequantize(fmt, q.device.index, q.data_ptr(), scale.data_ptr(),
                                  0 if g is None else g.data_ptr(), out.data_ptr(), out.dtype == torch.bfloat16, rows,
                                  cols, swizzled, _runtime.stream_handle(q.device))
    return out


# --- direct (eager) implementations ----------------------------------------------------------

def mxfp8_quantize_impl(x, swizzled: bool, rule: int, out=None):
    return _quantize("mxfp8", x, None, swizzled, rule, out)


def mxfp4_quantize_impl(x, swizzled: bool, rule: int, out=None):
    return _quantize("mxfp4", x, None, swizzled, rule, out)


def nvfp4_quantize_impl(x, global_scale, swizzled: bool, out=None):
    return _quantize("nvfp4", x, global_scale, swizzled, 0, out)


def mxfp8_dequantize_impl(q, scale, swizzled: bool, dtype: torch.dtype, out=None):
    return _dequantize("mxfp8", q, scale, None, swizzled, dtype, out)


def mxfp4_dequantize_impl(q, scale, swizzled: bool, dtype: torch.dtype, out=None):
    return _dequantize("mxfp4", q, scale, None, swizzled, dtype, out)


def nvfp4_dequantize_impl(q, scale, global_scale, swizzled: bool, dtype: torch.dtype, out=None):
    return _dequantize("nvfp4", q, scale, global_scale, swizzled, dtype, out)


# --- torch.library registration --------------------------------------------------------------

def _fake_quantize(fmt: str, x: torch.Tensor, swizzled: bool):
    rows, cols = _geometry(x, fmt)
    q = x.new_empty(_q_shape(x.shape, fmt), dtype=torch.float8_e4m3fn if fmt == "mxfp8" else torch.uint8)
    return q, x.new_empty(_scale_shape(fmt, rows, cols, swizzled), dtype=_scale_dtype(fmt))


def _fake_dequantize(fmt: str, q: torch.Tensor, dtype: torch.dtype):
    cols = q.shape[-1] * (1 if fmt == "mxfp8" else 2)
    return q.new_empty((*q.shape[:-1], cols), dtype=dtype)


def _register() -> None:
    # ops without custom_op's per-call wrappers (cake_moe._library)
    define = _library.define
    for fmt, quantize in (("mxfp8", mxfp8_quantize_impl), ("mxfp4", mxfp4_quantize_impl)):
        define(f"{fmt}_quantize(Tensor x, bool swizzled, SymInt rule) -> (Tensor, Tensor)", quantize,
               lambda x, swizzled, rule, fmt=fmt: _fake_quantize(fmt, x, swizzled))
    define("nvfp4_quantize(Tensor x, Tensor global_scale, bool swizzled) -> (Tensor, Tensor)", nvfp4_quantize_impl,
           lambda x, g, swizzled: _fake_quantize("nvfp4", x, swizzled))
    for fmt, dequantize in (("mxfp8", mxfp8_dequantize_impl), ("mxfp4", mxfp4_dequantize_impl)):
        define(f"{fmt}_dequantize(Tensor q, Tensor scale, bool swizzled, ScalarType dtype) -> Tensor", dequantize,
               lambda q, s, swizzled, dtype, fmt=fmt: _fake_dequantize(fmt, q, dtype))
    define("nvfp4_dequantize(Tensor q, Tensor scale, Tensor global_scale, bool swizzled, ScalarType dtype) -> Tensor",
           nvfp4_dequantize_impl, lambda q, s, g, swizzled, dtype: _fake_dequantize("nvfp4", q, dtype))


_register()
