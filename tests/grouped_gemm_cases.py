"""Shared problem builders for the grouped-GEMM tests."""
from __future__ import annotations

import torch

PATTERNS = {
    "mixed": [300, 0, 1, 700],
    "ragged6": [1, 257, 511, 4099, 0, 33],
    "tiny": [1, 2, 3, 0, 4],
    "big_gap": [6145, 0, 12289],
    "all_empty": [0, 0, 0, 0],
    "one_hot": [0, 0, 3000, 0, 0, 0],
}

# (H, I, E) MoE layers: w13 [E, 2I, H] and w2 [E, H, I]
LAYERS = [(2048, 768, 16), (2048, 1536, 8), (4096, 2048, 9)]


def offsets(sizes, device="cuda", leading_zero=False) -> torch.Tensor:
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
    if leading_zero:
        ends = torch.cat([torch.zeros(1, dtype=torch.int64), ends])
    return ends.to(torch.int32).to(device)


def random_sizes(total: int, groups: int, seed: int) -> list[int]:
    """Imbalanced random group sizes summing to `total` (some groups may be empty)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(groups, generator=g) ** 2
    sizes = (w / w.sum() * total).floor().long()
    sizes[0] += total - int(sizes.sum())
    return sizes.tolist()


def bf16(*shape, seed=0, device="cuda", scale=1.0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)


def cpu_problem(sizes, n=32, k=64):
    """x, w, g and offsets on the CPU for groups of `sizes` rows, with 4 rows past the last end."""
    rows = sum(sizes) + 4
    return (bf16(rows, k, device="cpu"), bf16(len(sizes), n, k, seed=1, device="cpu"),
            bf16(rows, n, seed=2, device="cpu"), offsets(sizes, device="cpu"))
