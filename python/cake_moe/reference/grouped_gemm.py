"""FP64 references of the ragged grouped GEMM (SPEC §6), group by group, computed on the
inputs' device (FP64 matmul on a GPU keeps large test shapes fast).

Offsets follow torch._grouped_mm: ``offs[e]`` is the cumulative end row of group e (E entries),
or ``m_indptr`` with a leading zero (E + 1 entries, ``leading_zero=True``).
"""
from __future__ import annotations

import torch


def group_bounds(offs: torch.Tensor, leading_zero: bool = False, rows: int | None = None) -> list[tuple[int, int]]:
    """[(start, end)] row ranges of the groups, clamped as the kernels clamp them: start into
    [0, rows], end into [start, rows] (a decreasing end gives an empty group; ``rows``, the
    packed row count, None for no upper bound)."""
    o = [int(v) for v in offs.cpu().tolist()]
    if leading_zero:
        starts, ends = o[:-1], o[1:]
    else:
        starts, ends = [0] + o[:-1], o
    hi = max([0, *o]) if rows is None else rows     # without rows: nothing past the offsets
    bounds = []
    for s, e in zip(starts, ends):                   # group_rows.cuh's ragged_group_rows
        s = min(max(s, 0), hi)
        bounds.append((s, min(max(e, s), hi)))
    return bounds


def fwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, leading_zero: bool = False) -> torch.Tensor:
    """Y[g_e] = X[g_e] @ W[e]^T in FP64; rows in no group are NaN (must stay untouched)."""
    y = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=torch.float64, device=x.device)
    xd, wd = x.double(), w.double()
    for e, (s, t) in enumerate(group_bounds(offs, leading_zero, x.shape[0])):
        y[s:t] = xd[s:t] @ wd[e].T
    return y


def dgrad(g: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, leading_zero: bool = False) -> torch.Tensor:
    """dX[g_e] = G[g_e] @ W[e] in FP64; rows in no group are NaN."""
    dx = torch.full((g.shape[0], w.shape[2]), float("nan"), dtype=torch.float64, device=g.device)
    gd, wd = g.double(), w.double()
    for e, (s, t) in enumerate(group_bounds(offs, leading_zero, g.shape[0])):
        dx[s:t] = gd[s:t] @ wd[e]
    return dx


def wgrad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, leading_zero: bool = False) -> torch.Tensor:
    """dW[e] = G[g_e]^T @ X[g_e] in FP64; empty groups give zeros."""
    bounds = group_bounds(offs, leading_zero, g.shape[0])
    dw = torch.zeros((len(bounds), g.shape[1], x.shape[1]), dtype=torch.float64, device=g.device)
    gd, xd = g.double(), x.double()
    for e, (s, t) in enumerate(bounds):
        dw[e] = gd[s:t].T @ xd[s:t]
    return dw


def rel_rms_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Each row's ||got - want|| / ||want|| (the absolute norm where want's row is zero), over
    the rows of `want` whose entries are all finite (FP64)."""
    rows = torch.isfinite(want).all(dim=-1)
    w = want[rows].double()
    diff = (got.detach().double().to(want.device)[rows] - w).square().sum(-1)
    norm = w.square().sum(-1)
    return torch.where(norm > 0, diff / norm.clamp_min(1e-300), diff).sqrt()


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| over the finite entries of `want` (FP64)."""
    mask = torch.isfinite(want)
    a, b = got.detach().double().to(want.device)[mask], want.detach()[mask]
    denom = b.norm()
    return float((a - b).norm() / denom) if denom > 0 else float((a - b).norm())
