"""The table of kernel forms: the one place that says what the wheel compiles.

Each form becomes one generated translation unit (``build/.../gen/<form>.cu``) compiled by
``nvcc -fatbin`` once per configured arch, so the build parallelises and a form is dropped by
deleting its row. ``tools/gen_kernels.py`` reads this table; the manifest embedded in the
extension is generated from it too.

A kernel entry is ``extern "C"`` (the runtime looks kernels up by name) and wraps one
template instantiation from the form's header.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ALL_ARCHES = ("90a", "100a", "103a", "107a")


@dataclass(frozen=True)
class Kernel:
    name: str          # extern "C" symbol
    body: str          # device function template instantiation called with the args
    threads: int = 256  # __launch_bounds__
    min_blocks: int = 0  # __launch_bounds__ minimum blocks per SM (0: unspecified)


@dataclass(frozen=True)
class Form:
    name: str
    family: str
    header: str                       # path under cpp/kernels
    args: str                         # by-value __grid_constant__ argument struct
    kernels: tuple[Kernel, ...]
    params: dict = field(default_factory=dict)
    # arches the form is compiled for (arch-specific instructions restrict it)
    arches: tuple[str, ...] = ALL_ARCHES
    # C++ placed after the include: aliases and static_asserts tying the table to the template
    prelude: str = ""
    # arches whose code path is the intended (arch-native) one; others run it as a portable form
    native: tuple[str, ...] = ALL_ARCHES
    # arches on which the GPU suite (ci/gpu.sh) has passed for this form; see docs/support.md
    validated: tuple[str, ...] = ()


def _format_forms() -> list[Form]:
    forms = []
    in_types = {"bf16": "__nv_bfloat16", "f32": "float"}
    layouts = {"linear": "false", "swizzled": "true"}
    for fmt, enum in (("mxfp8", "kMxfp8"), ("mxfp4", "kMxfp4"), ("nvfp4", "kNvfp4")):
        q_kernels, d_kernels = [], []
        for tname, ctype in in_types.items():
            for lname, swz in layouts.items():
                q_kernels.append(Kernel(
                    f"cake_fmt_{fmt}_quantize_{tname}_{lname}",
                    f"cake_moe::formats::quantize<cake_moe::formats::Fmt::{enum}, {ctype}, {swz}>"))
                d_kernels.append(Kernel(
                    f"cake_fmt_{fmt}_dequantize_{tname}_{lname}",
                    f"cake_moe::formats::dequantize<cake_moe::formats::Fmt::{enum}, {ctype}, {swz}>"))
        forms.append(Form(f"fmt_{fmt}_quantize", "formats", "formats/quantize.cuh",
                          "cake_moe::formats::QuantizeArgs", tuple(q_kernels),
                          {"format": fmt, "op": "quantize"}, validated=("90a",)))
        forms.append(Form(f"fmt_{fmt}_dequantize", "formats", "formats/dequantize.cuh",
                          "cake_moe::formats::DequantizeArgs", tuple(d_kernels),
                          {"format": fmt, "op": "dequantize"}, validated=("90a",)))
    return forms


# sm_90a grouped GEMM tiles: (BM, BN, stages, split tail). 128x128 wins at moderate T, 128x256 at
# large T, 64x128 serves groups of a few dozen rows, 128x192 reads 1/6 fewer operand bytes per FLOP
# than 128x128 with 2/3 the tiles of it (cpp/host/grouped_gemm/heuristics_sm90.hpp picks). The
# 128x256 kernels run a short last wave as 128x128 halves (sm90_bf16_grouped_gemm.cuh); 128x128's
# halves (128x64) measured no faster than whole tiles.
SM90_GG_TILES = ((128, 128, 5, False), (128, 256, 3, True), (64, 128, 8, False), (128, 192, 4, False))


def _grouped_gemm_sm90_forms() -> list[Form]:
    forms = []
    for op, enum in (("fwd", "kFwd"), ("dgrad", "kDgrad")):
        for bm, bn, st, split in SM90_GG_TILES:
            flag = "true" if split else "false"
            alias = f"cake_moe::sm90::GroupedGemmKernel<cake_moe::sm90::GroupedGemmOp::{enum}, {bm}, {bn}, {st}, {flag}>"
            geo = f"cake_moe::sm90::GroupedGemmGeometry{{{bm}, {bn}, {st}, {flag}}}"
            prelude = "\n".join([
                '#include "grouped_gemm/sm90_geometry.hpp"',
                f"using Form = {alias};",
                f"static_assert(Form::kSmemBytes == {geo}.smem_bytes(),",
                '              "sm90_geometry.hpp disagrees with the kernel template");',
                "static_assert(Form::kNumThreads == cake_moe::sm90::GroupedGemmGeometry::kThreads);",
                f"static_assert(Form::kBoxBRows == {geo}.box_b_rows({'true' if op == 'dgrad' else 'false'}));",
                f"static_assert(Form::kBoxBHalfRows == {geo}.box_b_half_rows() && Form::kSplitsTail == {geo}.split_tail);",
            ])
            forms.append(Form(
                f"gg_sm90_{op}_{bm}x{bn}", "grouped_gemm", "grouped_gemm/sm90_bf16_grouped_gemm.cuh",
                "cake_moe::sm90::GroupedGemmParams",
                (Kernel(f"cake_gg_sm90_{op}_{bm}x{bn}x64_s{st}", "Form::run", threads=384, min_blocks=1),),
                {"op": op, "bm": bm, "bn": bn, "bk": 64, "stages": st, "split_tail": split},
                arches=("90a",), native=("90a",), prelude=prelude, validated=("90a",)))
    return forms


def _grouped_gemm_sm90_wgrad_forms() -> list[Form]:
    """Weight gradient, 128x256 tiles: det reduces split tiles in chunk order through an FP32
    workspace; fast adds them with FP32 atomics."""
    forms = []
    for variant, enum in (("det", "kDet"), ("fast", "kFast")):
        kernels, checks = [], ['#include "grouped_gemm/sm90_geometry.hpp"',
                               "using Geo = cake_moe::sm90::GroupedGemmWgradGeometry;"]
        for out, ctype, geo in (("bf16", "__nv_bfloat16", "Bf16"), ("f32", "float", "F32")):
            alias = f"Wgrad_{out}"
            checks += [f"using {alias} = cake_moe::sm90::GroupedGemmWgradKernel<Geo::kBN, Geo::kStages, "
                       f"cake_moe::sm90::WgradReduce::{enum}, {ctype}, Geo::kTable{geo}>;",
                       f"static_assert({alias}::kSmemBytes == Geo::kSmemBytes{geo} && {alias}::kNumThreads == Geo::kThreads"
                       f" && {alias}::kBM == Geo::kBM);"]
            kernels.append(Kernel(f"cake_gg_sm90_wgrad_{variant}_128x256_{out}", f"{alias}::run", threads=384,
                                  min_blocks=1))
        forms.append(Form(f"gg_sm90_wgrad_{variant}", "grouped_gemm", "grouped_gemm/sm90_bf16_grouped_gemm_wgrad.cuh",
                          "cake_moe::sm90::GroupedGemmWgradParams", tuple(kernels),
                          {"op": "wgrad", "variant": variant, "bm": 128, "bn": 256, "bk": 64, "stages": 4},
                          arches=("90a",), native=("90a",), prelude="\n".join(checks), validated=("90a",)))
        # CTA pairs sharing X by multicast (bf16 output; the default on short groups, see
        # use_sm90_wgrad_pair in cpp/host/grouped_gemm/heuristics_sm90.hpp)
        pair = ["#include \"grouped_gemm/sm90_geometry.hpp\"",
                "using Geo = cake_moe::sm90::GroupedGemmWgradGeometry;",
                "using WgradPair = cake_moe::sm90::GroupedGemmWgradKernel<Geo::kBN, Geo::kStages, "
                f"cake_moe::sm90::WgradReduce::{enum}, __nv_bfloat16, Geo::kTableBf16, 8, 32, true>;",
                "static_assert(WgradPair::kSmemBytes == Geo::kSmemBytesBf16 && WgradPair::kNumThreads == Geo::kThreads);"]
        forms.append(Form(f"gg_sm90_wgrad_{variant}_c2", "grouped_gemm", "grouped_gemm/sm90_bf16_grouped_gemm_wgrad.cuh",
                          "cake_moe::sm90::GroupedGemmWgradParams",
                          (Kernel(f"cake_gg_sm90_wgrad_{variant}_c2_128x256_bf16", "WgradPair::run", threads=384,
                                  min_blocks=1),),
                          {"op": "wgrad", "variant": variant, "bm": 128, "bn": 256, "bk": 64, "stages": 4,
                           "cluster": 2},
                          arches=("90a",), native=("90a",), prelude="\n".join(pair), validated=("90a",)))
    return forms


def _grouped_gemm_portable_forms() -> list[Form]:
    """mma.sync / cp.async forms (sm_80+ instructions): the path on arches without a native
    form, built for sm_90a as well so the H200 validates the same source."""
    ops = {"fwd": ("fwd",), "dgrad": ("dgrad",), "wgrad": ("wgrad_bf16", "wgrad_f32")}
    return [Form(f"gg_portable_{op}", "grouped_gemm", "grouped_gemm/portable_bf16_grouped_gemm.cuh",
                 "cake_moe::portable::PortableGroupedGemmParams",
                 tuple(Kernel(f"cake_gg_portable_{k}", f"cake_moe::portable::portable_grouped_gemm_{k}",
                              threads=256, min_blocks=2) for k in kernels),
                 {"op": op, "bm": 128, "bn": 128, "bk": 32, "stages": 4}, native=(), validated=("90a",))
            for op, kernels in ops.items()]


def _grouped_gemm_unrouted_rows_form() -> Form:
    """Zeroes the rows of a fwd / dgrad output that no group covers (grouped_mm runs it before
    its GEMMs, so that y and x.grad are defined there); generic CUDA for every arch."""
    return Form("gg_unrouted_rows", "grouped_gemm", "grouped_gemm/unrouted_rows.cuh", "cake_moe::UnroutedRowsParams",
                (Kernel("cake_gg_zero_unrouted_rows", "cake_moe::zero_unrouted_rows", threads=256),),
                {"op": "zero_unrouted_rows"},
                prelude="static_assert(cake_moe::kUnroutedRowsThreads == 256);", validated=("90a",))


def _moe_engine_forms() -> list[Form]:
    """Routing bookkeeping and the slot-order finalize, shared by the routed-MoE families."""
    return [
        Form("moe_route", "moe", "moe/moe_route.cuh", "cake_moe::moe::RouteParams",
             (Kernel("cake_moe_route", "cake_moe::moe::route", threads=1024),
              Kernel("cake_moe_route_count", "cake_moe::moe::route_count", threads=1024),
              Kernel("cake_moe_route_scan", "cake_moe::moe::route_scan", threads=1024),
              Kernel("cake_moe_route_scan_split", "cake_moe::moe::route_scan_split", threads=1024),
              Kernel("cake_moe_route_place", "cake_moe::moe::route_place", threads=1024)),
             {"op": "route"}, native=(), prelude="static_assert(cake_moe::moe::kRouteThreads == 1024);",
             validated=("90a",)),
        Form("moe_finalize", "moe", "moe/moe_finalize.cuh", "cake_moe::moe::FinalizeParams",
             (Kernel("cake_moe_finalize", "cake_moe::moe::finalize", threads=128),),
             {"op": "finalize"}, native=(), prelude="static_assert(cake_moe::moe::kFinalizeThreads == 128);",
             validated=("90a",)),
    ]


# Family B GEMM tilings: (form suffix, BN, tiling alias in mxfp4_moe/params.hpp, threads[, the
# GEMMs it serves: both unless named; `wg128x4_rb` keeps GEMM2's token rows resident]). The
# decision table (python/cake_moe/mxfp4_moe/_decide.py) picks a suffix per GEMM. The portable
# forms (mma.sync) serve every arch; the sm_90a prefill form runs RS wgmma with the weights
# dequantized in registers (mxfp4_moe/sm90_mxfp4_moe_gemm.cuh), one CTA per SM.
MXFP4_MOE_TILINGS = (("n8", 8, "DecodeTiling", 256), ("n8_narrow", 8, "DecodeNarrowTiling", 256),
                     ("n8_narrow4", 8, "DecodeNarrow4Tiling", 128),
                     ("n8_shortk", 8, "DecodeShortKTiling", 128),
                     ("n8_shortk2", 8, "DecodeShortK2Tiling", 256, (2,)),
                     ("n32", 32, "MidTiling", 128), ("n64", 64, "PrefillTiling", 128))
# One kernel (mxfp4_moe/sm90_mxfp4_moe_gemm.cuh) on two, three or four MMA warpgroups.
MXFP4_MOE_SM90_TILINGS = (("wg128", 128, "Sm90PrefillTiling", 256), ("wg128x4", 128, "Sm90Prefill4WgTiling", 512),
                          ("wg64x4", 64, "Sm90Mid4WgTiling", 512), ("wg32x4", 32, "Sm90Mid32Tiling", 512),
                          ("wg128x4_rb", 128, "Sm90Prefill4WgResidentBTiling", 512, (2,)),
                          ("wg64x4_rb", 64, "Sm90Mid4WgResidentBTiling", 512, (2,)),
                          ("wg32x4_rb", 32, "Sm90Mid32ResidentBTiling", 512, (2,)),
                          ("wg160x3", 160, "Sm90Prefill160Tiling", 384),
                          ("wg160x3_rb", 160, "Sm90Prefill160ResidentBTiling", 384, (2,)),
                          ("wg96x4", 96, "Sm90Mid96Tiling", 512), ("wg96x4_rb", 96, "Sm90Mid96ResidentBTiling", 512, (2,)))


def _mxfp4_moe_forms() -> list[Form]:
    """MXFP4-weight GEMMs dequantizing in the mainloop: GEMM1 and GEMM2 per tiling."""
    kinds = (  # (tilings, kernel template, header, arch and validation fields, min blocks per SM)
        (MXFP4_MOE_TILINGS, "Mxfp4MoeGemm", "mxfp4_moe/mxfp4_moe_gemm.cuh", {"native": (), "validated": ("90a",)}, 2),
        (MXFP4_MOE_SM90_TILINGS, "Sm90Mxfp4MoeGemm", "mxfp4_moe/sm90_mxfp4_moe_gemm.cuh",
         {"arches": ("90a",), "native": ("90a",), "validated": ("90a",)}, 1),
    )
    forms = []
    for tilings, template, header, arch_fields, min_blocks in kinds:
        for suffix, bn, tiling, threads, *stages in tilings:
            for stage in (stages[0] if stages else (1, 2)):  # a tiling may serve one GEMM only
                alias = (f"cake_moe::mxfp4_moe::{template}<cake_moe::mxfp4_moe::GemmStage::kGemm{stage}, "
                         f"cake_moe::mxfp4_moe::{tiling}>")
                prelude = "\n".join([
                    f"using Form = {alias};",
                    f"static_assert(Form::kThreads == {threads} && Form::kBN == {bn});",
                ])
                forms.append(Form(
                    f"mxfp4_moe_gemm{stage}_{suffix}", "mxfp4_moe", header, "cake_moe::mxfp4_moe::GemmParams",
                    (Kernel(f"cake_mxfp4_moe_gemm{stage}_{suffix}", "Form::run", threads=threads,
                            min_blocks=min_blocks),),
                    {"stage": stage, "bn": bn, "tiling": tiling}, prelude=prelude, **arch_fields))
    return forms


FORMS: list[Form] = [*_format_forms(), *_grouped_gemm_sm90_forms(), *_grouped_gemm_sm90_wgrad_forms(),
                     *_grouped_gemm_portable_forms(), _grouped_gemm_unrouted_rows_form(),
                     *_moe_engine_forms(), *_mxfp4_moe_forms()]
