"""cake-moe: ahead-of-time compiled GPU kernels for the expert layers of Mixture-of-Experts models.

Families (see docs/architecture.md): number formats (``cake_moe.formats``), ragged BF16 grouped
GEMM, MXFP4 / NVFP4 / StepFun routed MoE. Pure-torch references live in ``cake_moe.reference``.
Importing the package loads no kernel and needs no GPU.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import formats, reference  # noqa: E402
from ._runtime import built_arches, manifest  # noqa: E402

__all__ = ["__version__", "formats", "reference", "manifest", "built_arches"]
