"""Checks of the ragged BF16 grouped GEMM's arguments: the dimensions and row counts the kernels'
32-bit indices serve, the offsets' convention, a forced form's name, and the operand layouts
the kernels read in place."""
from __future__ import annotations

import torch

from .. import _runtime, _validate

_INT32_MAX = 2**31 - 1
_MAX_DIM = 2**31 - 256  # rows, N, K: 32-bit indices with a tile of headroom (portable_params.hpp)
_MIN_TILE = 64  # smallest tile edge of any form: bounds the tile counts kernels index in int32
# fwd / dgrad tile totals the device schedulers serve (scheduler.cuh kTileCap: their counts
# saturate there, so that malformed offsets cannot wrap them, with room for the loop indices)
_MAX_TILES = 2**31 - 2**20


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _dims(n, k, num_groups) -> tuple[int, int, int]:
    """N, K and E as ints, each in the range the kernels serve (ValueError naming it if not)."""
    n, k = _validate.integer(n, "N"), _validate.integer(k, "K")
    for name, v in (("N", n), ("K", k)):
        if v <= 0 or v % 8:
            raise ValueError(f"{name} must be a positive multiple of 8 (16-byte rows), got {v}")
        if v > _MAX_DIM:
            raise ValueError(f"{name} = {v} exceeds {_MAX_DIM}, the largest the kernels' 32-bit column indices serve")
    e = 0 if num_groups is None else _validate.integer(num_groups, "num_groups")
    if e < 0 or e > _INT32_MAX // 4:
        raise ValueError(f"num_groups must be in [0, {_INT32_MAX // 4}], got {e}")
    if e * _ceil(n, _MIN_TILE) * _ceil(k, _MIN_TILE) > _INT32_MAX:
        raise ValueError(f"{e} groups of {n}x{k} weights exceed the 2^31 weight-gradient tiles")
    return n, k, e


def _max_rows(n: int, k: int, e: int) -> int:
    tiles_per_block_row = _ceil(max(n, k), _MIN_TILE)
    # fewer than _MAX_TILES tiles: the device schedulers refuse a total that reaches it
    by_tiles = ((_MAX_TILES - 1) // tiles_per_block_row - e) * _MIN_TILE
    return max(0, min(_MAX_DIM, by_tiles))   # (rows round up to whole tiles in 32 bits)


def max_grouped_rows(n: int, k: int, num_groups: int = 0) -> int:
    """The largest packed row count (sum over groups) whose fwd, dgrad and wgrad stay inside
    the kernels' 32-bit index ranges for weights [num_groups, n, k]; ValueError for
    dimensions no kernel serves (as :func:`check_grouped_dims`)."""
    return _max_rows(*_dims(n, k, num_groups))


def check_grouped_dims(n: int, k: int, *, num_groups: int | None = None, max_rows: int | None = None) -> None:
    """Raise ValueError unless weights [num_groups, n, k] with up to ``max_rows`` packed rows
    are served by fwd, dgrad and wgrad (N, K positive multiples of 8; 32-bit bounds)."""
    n, k, e = _dims(n, k, num_groups)
    if max_rows is not None:
        max_rows = _validate.integer(max_rows, "max_rows")
        if max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        limit = _max_rows(n, k, e)
        if max_rows > limit:
            groups = f"E={e}" if num_groups is not None else f"no num_groups given, so E=0; each group lowers the bound by {_MIN_TILE} rows"
            raise ValueError(f"{max_rows} rows exceed the {limit} rows served for N={n}, K={k} ({groups})")


def _offsets(offs, num_groups: int, device: torch.device, device_of: str) -> bool:
    """Checks offs and returns whether it is m_indptr ([E+1], leading zero)."""
    _validate.tensor(offs, "offs", dtypes=(torch.int32,), ndim=1, device=device, device_of=device_of)
    if offs.numel() == num_groups:
        return False
    if offs.numel() == num_groups + 1:
        return True
    raise ValueError(f"offs must have E={num_groups} (cumulative ends) or E+1 (m_indptr) entries, got {offs.numel()}")


def _form(form, op: str, device: torch.device) -> str:
    """``form`` if it names a grouped-GEMM ``op`` form of this build ('' picks by heuristic)
    built for the device's arch; the name is checked on the CPU path too, so that a CPU test
    refuses what the GPU build would."""
    if not isinstance(form, str):
        raise ValueError(f"form must be a str, got {form!r} ({type(form).__name__})")
    if not form:
        return form
    entry = next((f for f in _runtime.manifest()["forms"]
                  if f["name"] == form and f["family"] == "grouped_gemm" and f["params"].get("op") == op), None)
    if entry is None:
        raise ValueError(f"form {form!r} is not a grouped GEMM {op} form of this build (see `cake-moe info`)")
    if device.type == "cuda" and _runtime.device_arch(device.index) not in entry["arches"]:
        raise NotImplementedError(f"form {form!r} of this build has no image for sm_"
                                  f"{_runtime.device_arch(device.index)}, the arch of {device} (see `cake-moe info`)")
    return form


def _strides_served(t: torch.Tensor) -> bool:
    """The kernels read an operand in place when each row is contiguous and the rows (and
    experts) start 16-byte multiples apart without overlapping: a column slice ``h[:, :n]`` of
    a wider tensor, a slice of the experts' rows ``w13[:, :i]``."""
    if t.is_contiguous():
        return True
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return False
    inner = t.shape[-1]
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size > 1 and (stride % 8 or stride < inner):
            return False
        inner = stride * size if size > 1 else inner
    return True


def _wgrad_out_dtype(out_dtype) -> torch.dtype:
    """The weight gradient's output dtype: BF16 or FP32."""
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    return out_dtype


def _bf16(t, name: str, ndim: int, device=None, device_of: str | None = None) -> torch.Tensor:
    """A bf16 operand of ``ndim`` dims, 16-byte aligned, on ``device`` (that of ``device_of``) if
    given, else on a device the grouped GEMM runs on: a CUDA device, or the CPU (the reference)."""
    _validate.tensor(t, name, dtypes=(torch.bfloat16,), ndim=ndim, device=device, contiguous=False, align=16,
                     device_of=device_of)
    if device is None and t.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} is on {t.device}: the grouped GEMM runs on CUDA devices (and, as its reference, "
                         "on the CPU)")
    if not _strides_served(t):
        if t.stride(-1) != 1 and t.shape[-1] > 1:   # no call copies these: the layout is the caller's to choose
            raise ValueError(f"{name} must have a unit stride along its last axis (contiguous rows), got strides "
                             f"{t.stride()} for shape {tuple(t.shape)}: call .contiguous() on a transposed view "
                             "(w is [E, N, K], the layout torch._grouped_mm reads as w.transpose(-2, -1))")
        raise ValueError(f"{name} must have contiguous rows that start 16-byte multiples apart without overlap, got "
                         f"strides {t.stride()} for shape {tuple(t.shape)} (a prepared launch binds it in place; "
                         "the one-shot ops copy such a tensor first)")
    return t


def _outer(t: torch.Tensor, dim: int) -> int:
    """The element stride of an operand's outer dim as the kernels take it: 0 where the dim has
    at most one entry (the stride is never used), else the tensor's (validated) stride."""
    return t.stride(dim) if t.shape[dim] > 1 else 0


def _packed(t):
    """A one-shot operand that the kernels cannot read in place but whose last axis has a unit
    stride (an expanded or transposed-inner tensor, rows 2-byte aligned only, a start that is
    not 16-byte aligned: a column slice ``x[:, 1:]``) becomes a contiguous copy; anything else
    is left for validation to judge."""
    if (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.stride(-1) == 1 and t.numel()
            and (not _strides_served(t) or t.data_ptr() % 16)):
        return t.contiguous()
    return t
