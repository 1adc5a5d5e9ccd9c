"""Argument checks shared by every public op. Each raises ValueError naming the argument and
what was expected, before anything is launched or written."""
from __future__ import annotations

import operator
from collections.abc import Iterable

import torch


def tensor(t, name: str, *, dtypes: Iterable[torch.dtype] | None = None, ndim: int | None = None,
           min_ndim: int | None = None, device: torch.device | None = None, contiguous: bool = True,
           align: int = 0, device_of: str | None = None) -> torch.Tensor:
    """``t`` if it is a tensor as asked, else ValueError naming ``name``; ``device_of`` names
    the argument whose device ``device`` is, for the message."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            raise ValueError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}" + (f" (the device of {device_of})" if device_of else ""))
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    if align and t.numel() and t.data_ptr() % align:
        raise ValueError(f"{name} must be {align}-byte aligned (got address {t.data_ptr():#x})")
    return t


def integer(value, name: str) -> int:
    """``value`` as an int: a Python or numpy integer (anything with ``__index__``) but a bool;
    a float such as 2.7 is refused rather than truncated."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")


def boolean(value, name: str) -> bool:
    """``value`` if it is a bool: a truthy string or None is refused rather than guessed at."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def shape(t: torch.Tensor, name: str, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [first, last + 1) a tensor's elements occupy (any strides >= 0)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def no_overlap(outputs: Iterable[tuple[str, torch.Tensor | None]],
               inputs: Iterable[tuple[str, torch.Tensor | None]] = ()) -> None:
    """Outputs must share no memory with each other or with any input; inputs may share memory
    with each other (they are only read)."""
    outs = [(name, _span(t)) for name, t in outputs if t is not None and t.numel()]
    ins = [(name, _span(t)) for name, t in inputs if t is not None and t.numel()]
    for i, (name, (start, end)) in enumerate(outs):
        for other, (o_start, o_end) in outs[i + 1:] + ins:
            if start < o_end and o_start < end:
                raise ValueError(f"{name} and {other} overlap in memory")


def multiple(value: int, of: int, what: str) -> None:
    if value % of:
        raise ValueError(f"{what} must be a multiple of {of}, got {value}")
