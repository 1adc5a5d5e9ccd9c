// Family B GEMM epilogues, shared by the mma.sync and the sm_90a wgmma forms (both hold the
// accumulators in mma.sync C order): GEMM1 -> SiTU -> MXFP8 requantization (round-up UE8M0
// per 32 intermediate columns) -> BF16 act row; GEMM2 -> BF16 route row.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/c_fragment.cuh"
#include "common/numerics.cuh"
#include "formats/quantize.cuh"
#include "mxfp4_moe/params.hpp"

namespace cake_moe::mxfp4_moe {

struct Mxfp4MoeEpilogue {
  // A CTA's work item: `rows` sorted rows from `row0` of local expert `expert`, weight rows m0..
  struct Tile {
    int32_t expert, row0, rows, m0;
  };

  // Where thread (g, q) stores: rows nb * 8 + 2q + c of the tile (n8 block nb, c = 0, 1), at
  // one column of an output of `width` elements per row. One 64-bit address per thread and a
  // 32-bit byte offset per row: a row's address from its index had cost ~13 instructions of
  // 64-bit arithmetic per store, two thirds of the sm_90a GEMM2 epilogue's instructions.
  struct TileRows {
    char* base;  // row 2q, the thread's column
    uint32_t row_bytes;
    int32_t rows_left;
    __device__ __forceinline__ TileRows(uint16_t* out, const Tile& t, int32_t width, int32_t col, int q)
        : base(reinterpret_cast<char*>(out + (int64_t(t.row0) + 2 * q) * width + col)),
          row_bytes(uint32_t(width) * 2u),
          rows_left(t.rows - 2 * q) {}
    __device__ __forceinline__ bool has(int nb, int c) const { return nb * 8 + c < rows_left; }
    __device__ __forceinline__ void* at(int nb, int c) const { return base + uint32_t(nb * 8 + c) * row_bytes; }
  };
  static_assert(int64_t(kMaxTileRows) * kMaxLayerDim * 2 <= int64_t(0xFFFFFFFF),
                "a tile's row offsets in bytes fit 32 bits");

  // GEMM1 epilogue. Thread (g, q) of m16 block mb holds up (c0, c1) and gate (c2, c3) of
  // intermediate column j = j0 + 4g + mb for sorted rows 2q, 2q + 1 of each n8 block; the warp's
  // 32 columns j0.. are one MXFP8 block per row: amax over the 4 blocks and the 8 lanes g.
  template <int kNB>
  __device__ static void epilogue_gemm1(const GemmParams& p, const Tile& t, int wm, float (&acc)[4][kNB][4]) {
    using namespace numerics;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const Situ s = situ_of(p, t.expert);
    const int inter = p.m / 2;
    const int j0 = (t.m0 + wm * 64) / 2;
    const TileRows rows(p.out, t, inter, j0 + 4 * g, q);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v[4];
        float amax = 0.0f;
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          v[mb] = situ(acc[mb][nb][2 + c], acc[mb][nb][c], s);
          amax = max_abs_nan(amax, v[mb]);
        }
#pragma unroll
        for (int d = 4; d < 32; d <<= 1) amax = max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
        const Mxfp8Block block(amax);
        uint32_t out[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          out[i] = pack_bf16x2(block.value(v[2 * i]), block.value(v[2 * i + 1]));
        }
        if (rows.has(nb, c) && j0 < inter) *reinterpret_cast<uint2*>(rows.at(nb, c)) = make_uint2(out[0], out[1]);
      }
    }
  }

  // An expert's SiTU constants, with the reciprocals of beta and lbeta rounded once per item: a
  // product by them is within 1.5 ulp of the quotient and saves two IEEE divisions per element
  // (~8 instructions each, of ~70 per element; the GEMM1 epilogue runs while no MMA does).
  struct Situ {
    float beta, lbeta, inv_beta, inv_lbeta;
  };
  __device__ static __forceinline__ Situ situ_of(const GemmParams& p, int expert) {
    const float beta = p.beta[expert], lbeta = p.linear_beta[expert];
    return {beta, lbeta, __frcp_rn(beta), __frcp_rn(lbeta)};
  }

  // SiTU(g, u) = (beta tanh(g / beta) sigmoid(g)) (lbeta tanh(u / lbeta)), FP32, accurate tanh/exp.
  // kPlainGate (the caller checked gate > kPlainGateMin): the sigmoid's IEEE reciprocal of
  // y = 1 + e^-g in [1, 2^126) as its fast path alone. `1.0f / y` compiles to the same
  // MUFU.RCP and two FMAs for such y, plus a check and a slow-path CALL per element that cost
  // a branch and register moves each (y * r - 1 is never subnormal there, so the negation's FTZ
  // in that sequence changes nothing): the same bits either way.
  static constexpr float kPlainGateMin = -87.0f;  // e^87 < 2^126 - 1
  template <bool kPlainGate = false>
  __device__ static __forceinline__ float situ(float gate, float up, const Situ& s) {
    const float y = 1.0f + expf(-gate);
    float sig;
    if constexpr (kPlainGate) {
      float r;
      asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
      sig = fmaf(r, -fmaf(y, r, -1.0f), r);
    } else {
      sig = 1.0f / y;
    }
    return (s.beta * tanhf(gate * s.inv_beta) * sig) * (s.lbeta * tanhf(up * s.inv_lbeta));
  }

  // The MXFP8 element of v in its block, decoded again: exactly what GEMM2 multiplies.
  // to_elem / from_elem: the code's factors (any values for the zero and NaN blocks, whose
  // results are selected after the conversions). Selected by selp: nvcc turns early returns
  // or ?: here into a branch around the conversions per element (its reconvergence and
  // register moves cost ~15 instructions each).
  __device__ static __forceinline__ float requant_value(float v, uint32_t code, float to_elem, float from_elem) {
    using namespace numerics;
    const float q = e4m3_decode(e4m3_encode(__fmul_rn(v, to_elem))) * from_elem;
    float r;
    asm("{\n\t.reg .pred zero, nan;\n\t"
        "setp.eq.u32 zero, %1, 0;\n\t"
        "setp.eq.u32 nan, %1, %3;\n\t"
        "selp.f32 %0, 0f7FC00000, %2, nan;\n\t"
        "selp.f32 %0, 0f00000000, %0, zero;\n\t}"
        : "=f"(r)
        : "r"(code), "f"(q), "n"(kUe8m0Nan));
    return r;
  }

  // A row's MXFP8 block from the amax of its 32 values (UE8M0 round-up): value(v) is v's
  // element decoded again.
  struct Mxfp8Block {
    uint32_t code;
    float to_elem, from_elem;
    __device__ __forceinline__ explicit Mxfp8Block(float amax) {
      formats::detail::block_scale<formats::Fmt::kMxfp8>(amax, int32_t(formats::ScaleRule::kRoundUp), 0.0f, code,
                                                         to_elem);
      from_elem = numerics::ue8m0_value(code);
    }
    __device__ __forceinline__ float value(float v) const { return requant_value(v, code, to_elem, from_elem); }
  };

  // GEMM2 epilogue. Thread (g, q) of the warp's m16 block i (prepared block b = col0 / 2 + i of
  // the 64-row group at weight row row0) holds output columns h0 + 8g + 2b (c0, c1) and + 1
  // (c2, c3) for rows 2q, 2q + 1: 2 kMB consecutive columns per row, one store. The portable
  // warps hold all four blocks (col0 0), an sm_90a warp half of them (col0 0 or 4).
  template <int kMB, int kNB>
  __device__ static void epilogue_gemm2(const GemmParams& p, const Tile& t, int row0, int col0,
                                        float (&acc)[kMB][kNB][4]) {
    static_assert(kMB == 1 || kMB == 2 || kMB == 4, "4-, 8- or 16-byte stores");
    using Store = std::conditional_t<kMB == 4, uint4, std::conditional_t<kMB == 2, uint2, uint32_t>>;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int h0 = t.m0 + row0;
    if (h0 >= p.m) return;
    const TileRows rows(p.out, t, p.m, h0 + 8 * g + col0, q);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint32_t out[kMB];
#pragma unroll
        for (int mb = 0; mb < kMB; ++mb) out[mb] = pack_bf16x2(acc[mb][nb][c], acc[mb][nb][2 + c]);
        if (rows.has(nb, c)) *reinterpret_cast<Store*>(rows.at(nb, c)) = *reinterpret_cast<const Store*>(out);
      }
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
