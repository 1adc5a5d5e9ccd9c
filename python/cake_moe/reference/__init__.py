"""Pure-torch references: the exact rules every kernel is tested against (CPU or GPU tensors)."""
from . import formats, grouped_gemm, moe

__all__ = ["formats", "grouped_gemm", "moe"]
