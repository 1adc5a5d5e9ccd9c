"""Pure-torch references: the exact rules every kernel is tested against (CPU or GPU tensors)."""
from . import formats

__all__ = ["formats"]
