"""Family A: ragged BF16 grouped GEMM for MoE training (SPEC §6), torch._grouped_mm semantics.

Groups are consecutive row ranges of one packed tensor, described by int32 offsets on the
device, read only on the device (no host sync, no padding): ``offs`` [E] cumulative ends, or
``m_indptr`` [E+1] with a leading zero. FP32 accumulation, one rounding to BF16.

==========  =========================================  ===========================
fwd         ``Y[g_e] = X[g_e] @ W[e]^T``                ``[sum_m, N]`` bf16
dgrad       ``dX[g_e] = G[g_e] @ W[e]``                 ``[sum_m, K]`` bf16
wgrad       ``dW[e] = G[g_e]^T @ X[g_e]``               ``[E, N, K]`` bf16 or fp32
==========  =========================================  ===========================

Rows in no group (past the last group end; before an ``m_indptr`` whose first entry is above 0)
are not written (in a fresh output they hold the allocator's
bytes, as with ``torch._grouped_mm``; ``prepare_grouped_gemm_fwd/dgrad(..., zero_unrouted_rows=True)`` zeroes them),
except by :func:`grouped_mm`, whose output and x.grad are zero there. ``det`` (default) reduces every output in a fixed
order; ``fast`` may differ in the weight gradient only (see :func:`cake_moe.configure`).
"""
from __future__ import annotations

import re

import torch

from .. import _config
from . import _ops
from ._checks import check_grouped_dims, max_grouped_rows
from ._launch import GroupedGemmLaunch, prepare_grouped_gemm_dgrad, prepare_grouped_gemm_fwd, prepare_grouped_gemm_wgrad
from ._ops import release

__all__ = [
    "grouped_gemm_fwd", "grouped_gemm_dgrad", "grouped_gemm_wgrad", "grouped_mm", "grouped_mm_bf16",
    "prepare_grouped_gemm_fwd", "prepare_grouped_gemm_dgrad", "prepare_grouped_gemm_wgrad",
    "GroupedGemmLaunch", "check_grouped_dims", "max_grouped_rows", "release",
]


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _tensors(**named) -> None:
    """ValueError (naming the argument) for a non-tensor, before anything reads it."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def grouped_gemm_fwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``Y[g_e] = X[g_e] @ W[e]^T``; x [sum_m, K], w [E, N, K] bf16 -> [sum_m, N] bf16."""
    if _compiling():
        if out is not None:
            torch.ops.cake_moe.grouped_gemm_fwd_out(x, w, offs, out)
            return out
        return torch.ops.cake_moe.grouped_gemm_fwd(x, w, offs)
    return _ops.fwd_impl(x, w, offs, out)


def grouped_gemm_dgrad(g: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``dX[g_e] = G[g_e] @ W[e]``; g [sum_m, N], w [E, N, K] -> [sum_m, K] bf16."""
    if _compiling():
        if out is not None:
            torch.ops.cake_moe.grouped_gemm_dgrad_out(g, w, offs, out)
            return out
        return torch.ops.cake_moe.grouped_gemm_dgrad(g, w, offs)
    return _ops.dgrad_impl(g, w, offs, out)


def grouped_gemm_wgrad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None = None,
                       out_dtype: torch.dtype = torch.bfloat16, num_groups: int | None = None,
                       variant: str | None = None) -> torch.Tensor:
    """``dW[e] = G[g_e]^T @ X[g_e]``; g [sum_m, N], x [sum_m, K] -> [E, N, K] in ``out_dtype``.

    ``num_groups`` disambiguates offs [E] from m_indptr [E+1] (default: offs is [E]).
    """
    _tensors(g=g, x=x, offs=offs)
    e = offs.numel() if num_groups is None else num_groups
    if _compiling():
        v = _config.grouped_gemm_variant(variant)
        if out is not None:
            _tensors(out=out)
            if out.dtype != out_dtype:
                raise ValueError(f"out must have dtype {out_dtype} (out_dtype), got {out.dtype}")
            torch.ops.cake_moe.grouped_gemm_wgrad_out(g, x, offs, e, v, out)
            return out
        return torch.ops.cake_moe.grouped_gemm_wgrad(g, x, offs, e, out_dtype, v)
    return _ops.wgrad_impl(g, x, offs, e, out_dtype, variant, out)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, variant: str | None = None) -> torch.Tensor:
    """Autograd grouped GEMM: ``y = grouped_gemm_fwd(x, w, offs)``; the backward computes x.grad
    with dgrad and w.grad with wgrad in w's dtype, running the variant of this forward. Rows of
    x in no group (past the last group end, or before an ``m_indptr`` whose first entry is above
    0) get zero in y and in x.grad (``torch._grouped_mm`` leaves both uninitialized there)."""
    _tensors(x=x, w=w, offs=offs)
    v = _config.grouped_gemm_variant(variant)
    if _compiling():
        return torch.ops.cake_moe.grouped_mm(x, w, offs, v)
    return _ops.GroupedMM.apply(x, w, offs, v)


def grouped_mm_bf16(a: torch.Tensor, b: torch.Tensor, m_indptr: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Forward with the ``m_indptr`` [E+1] convention: a [cum_m, K], b [E, N, K] -> [cum_m, N]."""
    _tensors(a=a, b=b, m_indptr=m_indptr)
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D [E, N, K], got shape {tuple(b.shape)}")
    if m_indptr.dim() != 1 or m_indptr.numel() != b.shape[0] + 1:
        raise ValueError(f"m_indptr must have E+1={b.shape[0] + 1} entries, got shape {tuple(m_indptr.shape)}")
    try:
        return grouped_gemm_fwd(a, b, m_indptr, out)
    except ValueError as err:   # the forward's checks name its arguments: say them as this call does
        raise ValueError(re.sub(r"\b(x|w|offs)\b", lambda m: _BF16_NAMES[m.group()], str(err))) from None


_BF16_NAMES = {"x": "a", "w": "b", "offs": "m_indptr"}
