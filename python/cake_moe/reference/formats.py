"""Reference quantizers and dequantizers for MXFP8, MXFP4 and NVFP4 (SPEC §3), in pure torch.

These define the numerics: the CUDA kernels in cpp/kernels/formats must match them bit for bit.
Every step is one IEEE FP32 operation in a fixed order (x * 2^(127-code), (x * q) / s, ...).

Conventions
- Input rows are the leading dims flattened; blocks run along the last dim (K).
- MX scales are UE8M0 codes (uint8): value 2^(code-127), 0xFF = NaN.
- Round-up rule (default): t = amax * fp32(1/448) (MXFP8) or amax / 6 (MXFP4);
  code = biased exponent of t, plus one if t is not a power of two, saturating at 254.
  Code 0 is reserved for an all-zero block (amax == 0): its elements are all zero bytes.
  For subnormal t (amax below ~2^-117) the code is 1.
- OCP floor rule: code = floor(log2 amax) - emax + 127 clamped to [1, 254] (0 when amax == 0),
  emax = 8 (E4M3) or 2 (E2M1); elements saturate.
- NVFP4 (SPEC §3's order, left to right): s = e4m3_rn_satfinite((amax * q) / 6); element
  e2m1_rn((x * q) / s), the product and the quotient each rounded once; a block with s == 0 is
  zeros. Dequantization is (e2m1 * s) / q (the product exact, the quotient rounded once).
- NaN policy: a block containing a NaN gets the NaN scale (UE8M0 0xFF, or E4M3 0x7F for NVFP4)
  and elements 0x7F (MXFP8, the E4M3 NaN) or 0 (FP4, which has no NaN); dequantizing it gives NaN.
  Infinities saturate: +-inf in a block sets the largest scale and encodes as the format's max.
- Packed FP4: two elements per byte, the even element in the low nibble.
- Swizzled scales: the 128x4 layout (see swizzle_scales), returned flat.
"""
from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
_INV_448 = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(448.0, dtype=torch.float32)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

ROUND_UP = "round_up"
OCP_FLOOR = "ocp_floor"
SCALE_RULES = (ROUND_UP, OCP_FLOOR)


# ---------------------------------------------------------------------------------------------
# element codes
# ---------------------------------------------------------------------------------------------

def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (int32, sign in bit 3) of FP32 values: round to nearest even, saturate at 6
    (NaN encodes as the max, 7; the quantizers zero NaN blocks before this matters)."""
    a = torch.where(torch.isnan(v), torch.full_like(v, 6.0), v.abs())
    c = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
         + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    return c | (torch.signbit(v).int() << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (any integer dtype)."""
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=codes.device)
    c = codes.long()
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def e4m3_encode(v: torch.Tensor) -> torch.Tensor:
    """E4M3 (float8_e4m3fn) codes as uint8: round to nearest even, saturating at +-448."""
    return v.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.uint8).view(torch.float8_e4m3fn).float()


def ue8m0_round_up(t: torch.Tensor) -> torch.Tensor:
    """UE8M0 code (int32) of the smallest power of two >= t, per the module's round-up rule."""
    bits = t.float().contiguous().view(torch.int32)
    code = (bits >> 23) + ((bits & 0x7FFFFF) != 0).int()
    return code.clamp(max=254)


def ue8m0_ocp_floor(amax: torch.Tensor, emax: int) -> torch.Tensor:
    bits = amax.float().contiguous().view(torch.int32)
    e = bits >> 23
    mant = bits & 0x7FFFFF
    # floor(log2) of a subnormal: position of its leading mantissa bit, minus 149
    sub = torch.floor(torch.log2(mant.clamp(min=1).double())).int() - 149
    floor_log2 = torch.where(e != 0, e - 127, sub)
    code = (floor_log2 - emax + 127).clamp(1, 254)
    return torch.where(bits == 0, torch.zeros_like(code), code)


def ue8m0_value(codes: torch.Tensor) -> torch.Tensor:
    """2^(code-127) as FP32 (code 0 -> 2^-127, 0xFF -> NaN)."""
    c = codes.int()
    bits = torch.where(c == 0, torch.full_like(c, 0x00400000), c << 23)
    v = bits.view(torch.float32)
    return torch.where(c == 255, torch.full_like(v, float("nan")), v)


def ue8m0_inverse(codes: torch.Tensor) -> torch.Tensor:
    """2^(127-code) as FP32 for codes in [1, 254]."""
    c = codes.int()
    bits = torch.where(c == 254, torch.full_like(c, 0x00400000), (254 - c).clamp(min=0) << 23)
    return bits.view(torch.float32)


# ---------------------------------------------------------------------------------------------
# scale layouts
# ---------------------------------------------------------------------------------------------

def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Linear [rows, cols] scales -> the flat 128x4-swizzled layout (rows padded to 128, cols to
    4, padding zero): byte (r, c) lands at (r//128)*kt*512 + (c//4)*512 + (r%32)*16 +
    ((r%128)//32)*4 + c%4 with kt = padded cols / 4."""
    rows, cols = scale.shape
    rp, cp = _round_up(rows, 128), _round_up(cols, 4)
    padded = torch.zeros(rp, cp, dtype=scale.dtype, device=scale.device)
    padded[:rows, :cols] = scale
    return padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle_scales(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of swizzle_scales: the flat swizzled bytes -> linear [rows, cols]."""
    rp, cp = _round_up(rows, 128), _round_up(cols, 4)
    if flat.numel() != rp * cp:
        raise ValueError(f"swizzled scales of {rows}x{cols} must have {rp * cp} bytes, got {flat.numel()}")
    grid = flat.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, cp)
    return grid[:rows, :cols].contiguous()


# ---------------------------------------------------------------------------------------------
# quantizers
# ---------------------------------------------------------------------------------------------

def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.dim() < 1 or x.shape[-1] % block:
        raise ValueError(f"the last dim must be a multiple of {block}, got shape {tuple(x.shape)}")
    return x.float().reshape(math.prod(x.shape[:-1]), x.shape[-1] // block, block)   # (no -1: x may be empty)


def _pack_fp4(codes: torch.Tensor, shape) -> torch.Tensor:
    c = codes.reshape(*shape[:-1], shape[-1] // 2, 2).to(torch.uint8)
    return (c[..., 0] | (c[..., 1] << 4)).contiguous()


def _unpack_fp4(q: torch.Tensor) -> torch.Tensor:
    q = q.view(torch.uint8)
    return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)


def _finish_scale(codes: torch.Tensor, rows: int, swizzled: bool) -> torch.Tensor:
    s = codes.to(torch.uint8).reshape(rows, codes.shape[-1])
    return swizzle_scales(s) if swizzled else s


def quantize_mx(x: torch.Tensor, fmt: str, *, scale_rule: str = ROUND_UP, swizzled: bool = False):
    """MXFP8 or MXFP4 quantization of BF16/FP32 `x` along its last dim.

    Returns (q, scale): q is float8_e4m3fn [..., K] (mxfp8) or uint8 [..., K/2] (mxfp4, packed);
    scale is uint8 UE8M0 [rows, K/32] or flat swizzled.
    """
    if fmt not in ("mxfp8", "mxfp4"):
        raise ValueError(f"fmt must be 'mxfp8' or 'mxfp4', got {fmt!r}")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    b = _blocks(x, 32)
    nan_elem = torch.isnan(b)
    nan = nan_elem.any(dim=-1)
    amax = torch.where(nan_elem, 0.0, b).abs().amax(dim=-1)
    if scale_rule == ROUND_UP:
        t = amax * _INV_448.to(b.device) if fmt == "mxfp8" else amax / torch.tensor(6.0, device=b.device)
        code = ue8m0_round_up(t)
    else:
        code = ue8m0_ocp_floor(amax, 8 if fmt == "mxfp8" else 2)
    code = torch.where(nan, torch.full_like(code, 255), code)
    scaled = b * ue8m0_inverse(code).unsqueeze(-1)
    zero_block = (code == 0) | nan
    if fmt == "mxfp8":
        q = e4m3_encode(scaled)
        q = torch.where(zero_block.unsqueeze(-1), torch.zeros_like(q), q)
        q = torch.where(nan.unsqueeze(-1), torch.full_like(q, 0x7F), q)
        q = q.reshape(x.shape).view(torch.float8_e4m3fn)
    else:
        c = e2m1_encode(scaled)
        c = torch.where(zero_block.unsqueeze(-1), torch.zeros_like(c), c)
        q = _pack_fp4(c, x.shape)
    return q, _finish_scale(code, b.shape[0], swizzled)


def quantize_nvfp4(x: torch.Tensor, global_scale, *, swizzled: bool = False):
    """NVFP4 quantization with encode scale `global_scale` (q; dequant is e2m1 * s / q), in
    SPEC's order: s = e4m3((amax * q) / 6), element e2m1((x * q) / s), each step rounded once.

    Returns (q uint8 [..., K/2] packed, scale float8_e4m3fn [rows, K/16] or flat swizzled).
    """
    b = _blocks(x, 16)
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=b.device).reshape(())
    nan_elem = torch.isnan(b)
    nan = nan_elem.any(dim=-1)
    amax = torch.where(nan_elem, 0.0, b).abs().amax(dim=-1)
    s_code = e4m3_encode((amax * g) / torch.tensor(6.0, device=b.device)).int()
    s_code = torch.where(nan, torch.full_like(s_code, 0x7F), s_code)
    s = e4m3_decode(s_code.to(torch.uint8))
    zero_block = (s == 0) | nan
    c = e2m1_encode((b * g) / torch.where(zero_block, torch.ones_like(s), s).unsqueeze(-1))
    c = torch.where(zero_block.unsqueeze(-1), torch.zeros_like(c), c)
    scale = _finish_scale(s_code, b.shape[0], swizzled).view(torch.float8_e4m3fn)
    return _pack_fp4(c, x.shape), scale


def _linear_scale(scale: torch.Tensor, rows: int, cols: int, swizzled: bool) -> torch.Tensor:
    s = scale.view(torch.uint8)
    return unswizzle_scales(s.reshape(-1), rows, cols) if swizzled else s.reshape(rows, cols)


def dequantize_mx(q: torch.Tensor, scale: torch.Tensor, fmt: str, *, swizzled: bool = False,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of quantize_mx: element * 2^(code-127), exact in FP32, then cast to `dtype`."""
    if fmt == "mxfp8":
        vals = e4m3_decode(q)
    elif fmt == "mxfp4":
        vals = e2m1_decode(_unpack_fp4(q))
    else:
        raise ValueError(f"fmt must be 'mxfp8' or 'mxfp4', got {fmt!r}")
    shape = vals.shape
    b = vals.reshape(math.prod(shape[:-1]), shape[-1] // 32, 32)
    s = ue8m0_value(_linear_scale(scale, b.shape[0], b.shape[1], swizzled))
    return (b * s.unsqueeze(-1)).reshape(shape).to(dtype)


def dequantize_nvfp4(q: torch.Tensor, scale: torch.Tensor, global_scale, *, swizzled: bool = False,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of quantize_nvfp4: (e2m1 * s) / q in FP32 (the product exact, the quotient rounded
    once), then cast to `dtype`."""
    vals = e2m1_decode(_unpack_fp4(q))
    shape = vals.shape
    b = vals.reshape(math.prod(shape[:-1]), shape[-1] // 16, 16)
    s = e4m3_decode(_linear_scale(scale, b.shape[0], b.shape[1], swizzled))
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=b.device).reshape(())
    return ((b * s.unsqueeze(-1)) / g).reshape(shape).to(dtype)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The usual NVFP4 encode scale 448 * 6 / amax(x) as an FP32 [1] tensor, amax over the finite
    elements (infinities saturate, as in the quantizer; 1 if none is nonzero, or x is empty),
    at most the largest finite FP32 value (an amax below ~7.9e-36 would make it infinite)."""
    a = x.float().abs().reshape(-1)
    amax = torch.where(torch.isfinite(a), a, 0.0).amax().reshape(1) if a.numel() else a.new_zeros(1)
    scale = torch.where(amax > 0, (E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax))
    return scale.clamp(max=torch.finfo(torch.float32).max)
