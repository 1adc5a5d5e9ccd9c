"""cake-moe: ahead-of-time compiled GPU kernels for the expert layers of Mixture-of-Experts models.

Families (see docs/architecture.md): number formats (``cake_moe.formats``), ragged BF16 grouped
GEMM, MXFP4 routed MoE (NVFP4 and StepFun MoE: not built yet). Pure-torch references live in
``cake_moe.reference``.
Importing the package loads no kernel and needs no GPU.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import formats, grouped_gemm, mxfp4_moe, reference  # noqa: E402
from ._config import configure  # noqa: E402
from ._runtime import built_arches, manifest  # noqa: E402
from .grouped_gemm import (GroupedGemmLaunch, check_grouped_dims, grouped_gemm_dgrad,  # noqa: E402
                           grouped_gemm_fwd, grouped_gemm_wgrad, grouped_mm, grouped_mm_bf16, max_grouped_rows,
                           prepare_grouped_gemm_dgrad, prepare_grouped_gemm_fwd, prepare_grouped_gemm_wgrad,
                           release)
from .mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights, unprepare_cake_mxfp4_weights  # noqa: E402

__all__ = [
    "__version__", "formats", "grouped_gemm", "reference", "manifest", "built_arches", "configure",
    "grouped_gemm_fwd", "grouped_gemm_dgrad", "grouped_gemm_wgrad", "grouped_mm", "grouped_mm_bf16",
    "prepare_grouped_gemm_fwd", "prepare_grouped_gemm_dgrad", "prepare_grouped_gemm_wgrad",
    "GroupedGemmLaunch", "check_grouped_dims", "max_grouped_rows", "release",
    "mxfp4_moe", "CakeMxfp4MoEWrapper", "prepare_cake_mxfp4_weights", "unprepare_cake_mxfp4_weights",
]
