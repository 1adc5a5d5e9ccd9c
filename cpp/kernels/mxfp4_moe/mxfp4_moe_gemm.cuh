// Family B grouped GEMMs with MXFP4 weights dequantized in the mainloop (portable: mma.sync,
// ldmatrix, cp.async and 2D TMA loads, which every sm_90+ arch runs; docs/mxfp4_moe.md has the
// design).
//
// Swap-AB: the weight rows of one expert are the MMA's M side (64 per warp, four m16 blocks),
// the expert's routed token rows the N side (a token tile of kBN sorted rows from the routing
// kernel). CTA (tile t, m-block mb) computes weight rows [mb * kBM, +kBM) x the tile's rows:
//   GEMM1: acc = W1[e] . x[token]        -> SiTU(gate, up) -> MXFP8 (round-up) -> BF16 act row
//   GEMM2: acc = W2[e] . act[row]        -> BF16 route row
// Mainloop: a kStages ring; each stage holds kKStage of K for the CTA's weight rows (raw
// prepared FP4 by TMA, completing on the stage's mbarrier, in the shipped tilings; + UE8M0
// bytes by cp.async) and token rows (BF16, gathered by cp.async). Warp (wm, wk) owns rows wm*64.. and
// K slice wk*128.. of every stage; the kWarpsK partial sums are added in warp order through
// shared memory at the end (a fixed order: results do not depend on timing).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/numerics.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/ptx/sm80.cuh"
#include "common/ptx/tma.cuh"
#include "formats/quantize.cuh"
#include "mxfp4_moe/params.hpp"
#include "mxfp4_moe/weight_fragments.cuh"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Mxfp4MoeGemm {
  static constexpr int kBN = Cfg::kBN, kBM = Cfg::kBM, kStages = Cfg::kStages;
  static constexpr int kNBlocks = kBN / 8;
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;
  static_assert(kStages >= 2, "a ring needs two stages");

  // 16-byte chunk swizzles that make the fragment reads of 8 rows conflict-free.
  __device__ static __forceinline__ int w_chunk(int row, int chunk) {
    constexpr int kRowsPerLine = Cfg::kWRowBytes >= 128 ? 1 : 128 / Cfg::kWRowBytes;
    constexpr int kMask = (Cfg::kWRowBytes / 32 < 4 ? Cfg::kWRowBytes / 32 : 4) - 1;
    return chunk ^ (2 * ((row / kRowsPerLine) & kMask));
  }
  __device__ static __forceinline__ int b_chunk(int row, int chunk) { return chunk ^ (row & 7); }

  // Byte offset of 16-byte chunk `chunk` of weight row `row` in a stage's weight tile. TMA
  // weights: kWBoxes boxes of kBM rows x kWBoxBytes, each in the TMA swizzle of its width (the
  // 128-byte swizzle XORs the chunk with row % 8, the 64-byte one with (row / 2) % 4). Both put
  // the 8 rows x 32 bytes a warp's fragment load reads into the minimum of two wavefronts.
  __device__ static __forceinline__ int w_offset(int row, int chunk) {
    if constexpr (Cfg::kTmaWeights) {
      constexpr int kBoxChunks = Cfg::kWBoxBytes / 16;
      const int box = chunk / kBoxChunks, c = chunk % kBoxChunks;
      const int swz = Cfg::kWBoxBytes == 128 ? (row & 7) : ((row >> 1) & 3);
      return box * (kBM * Cfg::kWBoxBytes) + row * Cfg::kWBoxBytes + 16 * (c ^ swz);
    } else {
      return row * Cfg::kWRowBytes + 16 * w_chunk(row, chunk);
    }
  }

  struct Smem {
    uint8_t* base;
    __device__ uint8_t* w(int slot) const { return base + slot * Cfg::kStageBytes; }
    __device__ uint8_t* sf(int slot) const { return w(slot) + kBM * Cfg::kWRowBytes; }
    __device__ uint8_t* b(int slot) const { return sf(slot) + kBM * Cfg::kSfRowBytes; }
  };

  struct Tile {
    int32_t expert, row0, rows, m0;
  };

  // The fixed part of each thread's share of a stage load: its copies repeat every stage at the
  // same rows and chunks (only the K offset moves), so the addresses are computed once.
  static constexpr int kWChunks = Cfg::kWRowBytes / 16;   // 16-byte weight chunks per row
  static constexpr int kBChunks = Cfg::kBRowBytes / 16;   // 16-byte activation chunks per row
  static constexpr int kWIters = kBM * kWChunks / kThreads;
  static constexpr int kWRowStep = kThreads / kWChunks;
  static constexpr int kSfIters = kBM * Cfg::kWarpsK / kThreads;
  static constexpr int kSfRowStep = kThreads / Cfg::kWarpsK;
  static constexpr int kBIters = kBN * kBChunks / kThreads > 0 ? kBN * kBChunks / kThreads : 1;
  static constexpr int kBRowStep = kThreads / kBChunks;
  static_assert(kThreads % kWChunks == 0 && kThreads % Cfg::kWarpsK == 0 && kThreads % kBChunks == 0,
                "every thread copies whole columns of a stage");
  static_assert(kBM * kWChunks % kThreads == 0 && kBM * Cfg::kWarpsK % kThreads == 0 &&
                kBN * kBChunks % kThreads == 0, "a stage is an exact number of copy rounds");
  static_assert(kWRowStep % 4 == 0, "w_chunk repeats every 4 rows: a thread's rows share one swizzle");

  struct Loader {
    const uint8_t* w_src;          // this thread's first weight chunk at K = 0
    const uint8_t* sf_src;         // first scale word at K = 0
    int32_t b_row[kBIters];        // activation row of each copy (-1: outside the tile, zero-filled)
    int64_t w_step, sf_step;       // bytes between this thread's consecutive rows
    uint32_t w_dst, sf_dst;
    int w_rows, sf_rows;           // this thread's copies whose rows exist (partial m-blocks)
    int w_k, sf_k, b_k;            // K of this thread's chunk inside a stage
  };

  __device__ static Loader make_loader(const GemmParams& p, const Tile& t) {
    const int tid = threadIdx.x;
    Loader l;
    const int64_t w_row0 = int64_t(t.expert) * p.m + t.m0;
    const int rows_left = p.m - t.m0;
    {
      const int r = tid / kWChunks, c = tid % kWChunks;
      l.w_src = p.w + (w_row0 + r) * (p.k / 2) + 16 * c;
      l.w_step = int64_t(kWRowStep) * (p.k / 2);
      l.w_dst = r * Cfg::kWRowBytes + 16 * w_chunk(r, c);  // w_chunk(r + j * step, c) is the same
      l.w_rows = rows_left <= r ? 0 : (rows_left - r + kWRowStep - 1) / kWRowStep;
      l.w_k = c * 32;
    }
    {
      const int r = tid / Cfg::kWarpsK, c = tid % Cfg::kWarpsK;
      l.sf_src = p.w_sf + (w_row0 + r) * (p.k / 32) + 4 * c;
      l.sf_step = int64_t(kSfRowStep) * (p.k / 32);
      l.sf_dst = r * Cfg::kSfRowBytes + 4 * c;
      l.sf_rows = rows_left <= r ? 0 : (rows_left - r + kSfRowStep - 1) / kSfRowStep;
      l.sf_k = c * 128;
    }
    l.b_k = (tid % kBChunks) * 8;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = tid / kBChunks + j * kBRowStep;
      l.b_row[j] = r >= t.rows ? -1 : (kStage == GemmStage::kGemm1 ? p.row_token[t.row0 + r] : t.row0 + r);
    }
    return l;
  }

  // Loads stage `ks` (K offset ks * kKStage) into ring slot `slot`; rows outside the weight
  // matrix, the token tile or K are zero-filled and not read.
  __device__ static void load_stage(const GemmParams& p, const Loader& l, const Smem& sm, int slot, int ks) {
    const int k0 = ks * Cfg::kKStage;
    if constexpr (!Cfg::kTmaWeights) {
      const uint32_t w_base = ptx::smem_addr(sm.w(slot)) + l.w_dst;
      const bool w_k_ok = k0 + l.w_k < p.k;
      const uint8_t* w_src = l.w_src + k0 / 2;
#pragma unroll
      for (int j = 0; j < kWIters; ++j) {
        const bool ok = w_k_ok && j < l.w_rows;
        ptx::cp_async_16(w_base + j * kWRowStep * Cfg::kWRowBytes, ok ? w_src + j * l.w_step : l.w_src, ok);
      }
    }
    const uint32_t sf_base = ptx::smem_addr(sm.sf(slot)) + l.sf_dst;
    const bool sf_k_ok = k0 + l.sf_k < p.k;
    const uint8_t* sf_src = l.sf_src + k0 / 32;
#pragma unroll
    for (int j = 0; j < kSfIters; ++j) {
      const bool ok = sf_k_ok && j < l.sf_rows;
      ptx::cp_async_4(sf_base + j * kSfRowStep * Cfg::kSfRowBytes, ok ? sf_src + j * l.sf_step : l.sf_src, ok);
    }
    const uint32_t b_base = ptx::smem_addr(sm.b(slot));
    const bool b_k_ok = k0 + l.b_k < p.k;
    const int c = threadIdx.x % kBChunks;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = threadIdx.x / kBChunks + j * kBRowStep;
      const bool ok = b_k_ok && l.b_row[j] >= 0;
      ptx::cp_async_16(b_base + Cfg::b_offset(r, c),
                       ok ? p.b + int64_t(l.b_row[j]) * p.k + k0 + l.b_k : p.b, ok);
    }
  }

  // TMA weights (one thread): stage `ks`'s boxes of the tile's kBM weight rows into ring slot
  // `slot`, completing on bar. Boxes wholly past K are not issued (they would only feed K the
  // fragments never read); rows past the tensor arrive as zeros and count like the rest.
  __device__ static void load_weights_tma(const GemmParams& p, const Tile& t, const Smem& sm, uint64_t* bar, int slot,
                                          int ks) {
    static_assert(Cfg::kTmaWeights, "the tiling takes its weights by TMA");
    const int c0 = ks * Cfg::kWRowBytes;  // byte column of the stage in each weight row
    const int boxes = min(Cfg::kWBoxes, (p.k / 2 - c0 + Cfg::kWBoxBytes - 1) / Cfg::kWBoxBytes);
    ptx::mbar_arrive_expect_tx(bar, uint32_t(boxes * kBM * Cfg::kWBoxBytes));
    for (int j = 0; j < boxes; ++j)
      ptx::tma_load_2d(&p.tmap_w, bar, sm.w(slot) + j * (kBM * Cfg::kWBoxBytes), c0 + j * Cfg::kWBoxBytes,
                       t.expert * p.m + t.m0);
  }

  // The sm_90a prefill form's loader: each copy's source at K = 0 is resolved once per item (a
  // missing row: the operand's first row, copied as zero bytes), so a stage only adds its K
  // offset. In that form it saves ~100 instructions per stage and thread (H200: prefill 2-3.6%
  // faster); the mma.sync forms keep the loader above, as its pointer per copy costs them
  // registers (n8 reaches its cap: decode 2-5% slower, docs/mxfp4_moe.md).
  struct PointerLoader {
    const uint8_t* w_src[kWIters];    // weight chunk of each copy at K = 0
    const uint8_t* sf_src[kSfIters];  // scale word of each copy at K = 0
    const uint16_t* b_src[kBIters];   // activation chunk of each copy at K = 0
    uint32_t valid;                   // bit per copy (W, then SF, then B): 0 = the row is missing
    uint32_t w_dst, sf_dst;
    int w_k, sf_k, b_k;               // K of this thread's chunk inside a stage
  };
  static constexpr int kSfBit = kWIters, kBBit = kWIters + kSfIters;
  static_assert(kBBit + kBIters <= 32, "one validity bit per copy");

  __device__ static PointerLoader make_pointer_loader(const GemmParams& p, const Tile& t) {
    const int tid = threadIdx.x;
    PointerLoader l;
    l.valid = 0;
    const int64_t w_row0 = int64_t(t.expert) * p.m + t.m0;
    const int rows_left = p.m - t.m0;
    {
      const int r = tid / kWChunks, c = tid % kWChunks;
#pragma unroll
      for (int j = 0; j < kWIters; ++j) {
        const bool ok = r + j * kWRowStep < rows_left;
        l.w_src[j] = p.w + (ok ? w_row0 + r + j * kWRowStep : 0) * (p.k / 2) + 16 * c;
        l.valid |= uint32_t(ok) << j;
      }
      l.w_dst = r * Cfg::kWRowBytes + 16 * w_chunk(r, c);  // w_chunk(r + j * step, c) is the same
      l.w_k = c * 32;
    }
    {
      const int r = tid / Cfg::kWarpsK, c = tid % Cfg::kWarpsK;
#pragma unroll
      for (int j = 0; j < kSfIters; ++j) {
        const bool ok = r + j * kSfRowStep < rows_left;
        l.sf_src[j] = p.w_sf + (ok ? w_row0 + r + j * kSfRowStep : 0) * (p.k / 32) + 4 * c;
        l.valid |= uint32_t(ok) << (kSfBit + j);
      }
      l.sf_dst = r * Cfg::kSfRowBytes + 4 * c;
      l.sf_k = c * 128;
    }
    l.b_k = (tid % kBChunks) * 8;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = tid / kBChunks + j * kBRowStep;
      const bool ok = r < t.rows;
      const int row = !ok ? 0 : (kStage == GemmStage::kGemm1 ? p.row_token[t.row0 + r] : t.row0 + r);
      l.b_src[j] = p.b + int64_t(row) * p.k + l.b_k;
      l.valid |= uint32_t(ok) << (kBBit + j);
    }
    return l;
  }

  __device__ static void load_stage(const GemmParams& p, const PointerLoader& l, const Smem& sm, int slot, int ks) {
    const int k0 = ks * Cfg::kKStage;
    const uint32_t w_base = ptx::smem_addr(sm.w(slot)) + l.w_dst;
    const bool w_k_ok = k0 + l.w_k < p.k;
    const int w_off = w_k_ok ? k0 / 2 : 0;  // past K: nothing is read, the source stays in bounds
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      ptx::cp_async_16(w_base + j * kWRowStep * Cfg::kWRowBytes, l.w_src[j] + w_off, w_k_ok && (l.valid >> j & 1u));
    const uint32_t sf_base = ptx::smem_addr(sm.sf(slot)) + l.sf_dst;
    const bool sf_k_ok = k0 + l.sf_k < p.k;
    const int sf_off = sf_k_ok ? k0 / 32 : 0;
#pragma unroll
    for (int j = 0; j < kSfIters; ++j)
      ptx::cp_async_4(sf_base + j * kSfRowStep * Cfg::kSfRowBytes, l.sf_src[j] + sf_off,
                      sf_k_ok && (l.valid >> (kSfBit + j) & 1u));
    const uint32_t b_base = ptx::smem_addr(sm.b(slot));
    const bool b_k_ok = k0 + l.b_k < p.k;
    const int b_off = b_k_ok ? k0 : 0;
    const int c = threadIdx.x % kBChunks;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = threadIdx.x / kBChunks + j * kBRowStep;
      ptx::cp_async_16(b_base + Cfg::b_offset(r, c), l.b_src[j] + b_off, b_k_ok && (l.valid >> (kBBit + j) & 1u));
    }
  }

  // kMB m16 blocks of weight rows from `row0` (block mb: rows row0 + 16 mb + g, + 8) of 64-element
  // unit u of K slice wk in ring slot `slot`: per block the two prepared words of rows g and g + 8
  // and their two UE8M0 codes (byte i: k32 block i).
  template <int kMB>
  __device__ static __forceinline__ void load_unit_weights(const Smem& sm, int slot, int row0, int wk, int u,
                                                           uint2 (&wrow)[kMB][2], uint32_t (&codes)[kMB][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint8_t* ws = sm.w(slot);
    const uint8_t* sfs = sm.sf(slot);
    const int chunk = (wk * 128 + u * 64) / 32;  // first 16-byte chunk of the unit in the row
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + mb * 16 + g + 8 * h;
        wrow[mb][h] = *reinterpret_cast<const uint2*>(ws + w_offset(r, chunk + (q >> 1)) +
                                                      8 * (q & 1));
        codes[mb][h] = *reinterpret_cast<const uint16_t*>(sfs + r * Cfg::kSfRowBytes + wk * 4 + u * 2);
      }
    }
  }

  // Whether any lane of the warp holds a block code that needs the two-multiply conversion.
  template <int kMB>
  __device__ static __forceinline__ bool warp_needs_big(const uint32_t (&codes)[kMB][2]) {
    bool any_big = false;
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        any_big |= (codes[mb][h] & 0xFFu) > kBigScaleCode || (codes[mb][h] >> 8) > kBigScaleCode;
    return __any_sync(0xFFFFFFFFu, any_big);
  }

  // One stage of the warp's K slice: two 64-element units, four k16 sub-steps each.
  __device__ static __forceinline__ void compute_stage(const Smem& sm, int slot, int wm, int wk,
                                                       float (&acc)[4][kNBlocks][4]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint2 wrow[4][2];
      uint32_t codes[4][2];
      load_unit_weights(sm, slot, wm * 64, wk, u, wrow, codes);
      if (warp_needs_big(codes)) {
        compute_unit<true>(sm, slot, wk, u, wrow, codes, acc);
      } else {
        compute_unit<false>(sm, slot, wk, u, wrow, codes, acc);
      }
    }
  }

  template <bool kBig>
  __device__ static __forceinline__ void compute_unit(const Smem& sm, int slot, int wk, int u,
                                                      const uint2 (&wrow)[4][2], const uint32_t (&codes)[4][2],
                                                      float (&acc)[4][kNBlocks][4]) {
    const int lane = threadIdx.x & 31;
    const uint32_t bs = ptx::smem_addr(sm.b(slot));
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {  // pairs of k16 sub-steps: one ldmatrix.x4 per n8 block
      uint32_t bfrag[kNBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) {
        const int row = nb * 8 + (lane & 7);
        const int c = (wk * 128 + u * 64 + sp * 32) / 8 + (lane >> 3);
        ptx::ldmatrix_x4(bfrag[nb], bs + row * Cfg::kBRowBytes + 16 * b_chunk(row, c));
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          // sub-step s = 2 sp + half; UE8M0 block sp of the unit (byte sp of the codes)
          const uint32_t cg = (codes[mb][0] >> (8 * sp)) & 0xFFu, cg8 = (codes[mb][1] >> (8 * sp)) & 0xFFu;
          uint32_t a[4];
          if (sp == 0 && half == 0) a_fragment<0, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 0 && half == 1) a_fragment<1, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 1 && half == 0) a_fragment<2, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 1 && half == 1) a_fragment<3, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
#pragma unroll
          for (int nb = 0; nb < kNBlocks; ++nb)
            ptx::mma_bf16_16816(acc[mb][nb], a, bfrag[nb][2 * half], bfrag[nb][2 * half + 1]);
        }
      }
    }
  }

  // Warps wk > 0 park their partial sums in shared memory; warp wk = 0 adds them in order.
  __device__ static void reduce_k_split(uint8_t* smem, int wm, int wk, float (&acc)[4][kNBlocks][4]) {
    if constexpr (Cfg::kWarpsK > 1) {
      const int lane = threadIdx.x & 31;
      float* park = reinterpret_cast<float*>(smem);
      auto slot = [&](int k, int i) { return park + ((((k - 1) * Cfg::kWarpsM + wm) * Cfg::kAccPerLane + i) * 32 + lane); };
      __syncthreads();  // the ring is no longer read
      if (wk > 0) {
#pragma unroll
        for (int mb = 0; mb < 4; ++mb)
#pragma unroll
          for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
            for (int j = 0; j < 4; ++j) *slot(wk, (mb * kNBlocks + nb) * 4 + j) = acc[mb][nb][j];
      }
      __syncthreads();
      if (wk == 0) {
        for (int k = 1; k < Cfg::kWarpsK; ++k)
#pragma unroll
          for (int mb = 0; mb < 4; ++mb)
#pragma unroll
            for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
              for (int j = 0; j < 4; ++j) acc[mb][nb][j] += *slot(k, (mb * kNBlocks + nb) * 4 + j);
      }
    }
  }

  // GEMM1 epilogue. Thread (g, q) of m16 block mb holds up (c0, c1) and gate (c2, c3) of
  // intermediate column j = j0 + 4g + mb for sorted rows 2q, 2q + 1 of each n8 block; the warp's
  // 32 columns j0.. are one MXFP8 block per row: amax over the 4 blocks and the 8 lanes g.
  template <int kNB>
  __device__ static void epilogue_gemm1(const GemmParams& p, const Tile& t, int wm, float (&acc)[4][kNB][4]) {
    using namespace numerics;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const float beta = p.beta[t.expert], lbeta = p.linear_beta[t.expert];
    const int inter = p.m / 2;
    const int j0 = (t.m0 + wm * 64) / 2;
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v[4];
        float amax = 0.0f;
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          v[mb] = situ(acc[mb][nb][2 + c], acc[mb][nb][c], beta, lbeta);
          amax = max_abs_nan(amax, v[mb]);
        }
#pragma unroll
        for (int d = 4; d < 32; d <<= 1) amax = max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
        uint32_t code;
        float to_elem;
        formats::detail::block_scale<formats::Fmt::kMxfp8>(amax, int32_t(formats::ScaleRule::kRoundUp), 0.0f, code,
                                                           to_elem);
        const float from_elem = ue8m0_value(code);
        uint32_t out[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float lo = requant_value(v[2 * i], code, to_elem, from_elem);
          const float hi = requant_value(v[2 * i + 1], code, to_elem, from_elem);
          out[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
                   (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
        }
        const int row = nb * 8 + 2 * q + c;
        if (row < t.rows && j0 < inter)
          *reinterpret_cast<uint2*>(p.out + int64_t(t.row0 + row) * inter + j0 + 4 * g) = make_uint2(out[0], out[1]);
      }
    }
  }

  // SiTU(g, u) = (beta tanh(g / beta) sigmoid(g)) (lbeta tanh(u / lbeta)), FP32, accurate tanh/exp.
  __device__ static __forceinline__ float situ(float gate, float up, float beta, float lbeta) {
    const float sig = 1.0f / (1.0f + expf(-gate));
    return (beta * tanhf(gate / beta) * sig) * (lbeta * tanhf(up / lbeta));
  }

  // The MXFP8 element of v in its block, decoded again: exactly what GEMM2 multiplies.
  __device__ static __forceinline__ float requant_value(float v, uint32_t code, float to_elem, float from_elem) {
    using namespace numerics;
    if (code == 0u) return 0.0f;
    if (code == kUe8m0Nan) return __uint_as_float(0x7FC00000u);
    return e4m3_decode(e4m3_encode(__fmul_rn(v, to_elem))) * from_elem;
  }

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
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint32_t out[kMB];
#pragma unroll
        for (int mb = 0; mb < kMB; ++mb)
          out[mb] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(acc[mb][nb][c]))) |
                    (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(acc[mb][nb][2 + c]))) << 16);
        const int row = nb * 8 + 2 * q + c;
        if (row < t.rows)
          *reinterpret_cast<Store*>(p.out + int64_t(t.row0 + row) * p.m + h0 + 8 * g + col0) =
              *reinterpret_cast<const Store*>(out);
      }
    }
  }

  __device__ static void run(const GemmParams& p) {
    extern __shared__ __align__(128) uint8_t smem_dyn[];
    // TMA weights: the ring starts on a 1024-byte swizzle atom (kSmemBytes has the slack)
    uint8_t* smem_raw = smem_dyn;
    if constexpr (Cfg::kTmaWeights) smem_raw += (1024u - (ptx::smem_addr(smem_dyn) & 1023u)) & 1023u;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem_raw + Cfg::kBarOffset);
    if constexpr (Cfg::kTmaWeights) {
      if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) ptx::mbar_init(&bars[s], 1);
        ptx::mbar_fence_init();
        ptx::tma_prefetch_desc(&p.tmap_w);
      }
      __syncthreads();  // the barriers exist before any thread waits on them
    }
    ptx::grid_dependency_wait();  // the tile list and B rows come from the previous launches
    const int tile_index = blockIdx.x / p.m_blocks;
    if (tile_index >= *p.tile_count) return;  // the grid covers the worst case of the routing
    const moe::TokenTile tt = p.tiles[tile_index];
    Tile t;
    t.expert = tt.expert;
    t.row0 = tt.row0;
    const int end = p.offsets[tt.expert + 1];
    t.rows = end - tt.row0 < kBN ? end - tt.row0 : kBN;
    t.m0 = (blockIdx.x % p.m_blocks) * kBM;

    const Smem sm{smem_raw};
    const int warp = threadIdx.x >> 5;
    const int wm = warp % Cfg::kWarpsM, wk = warp / Cfg::kWarpsM;
    const bool warp_rows = t.m0 + wm * 64 < p.m;

    float acc[4][kNBlocks][4];
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mb][nb][j] = 0.0f;

    const int num_k = (p.k + Cfg::kKStage - 1) / Cfg::kKStage;
    const Loader loader = make_loader(p, t);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k) {
        load_stage(p, loader, sm, s, s);
        if constexpr (Cfg::kTmaWeights)
          if (threadIdx.x == 0) load_weights_tma(p, t, sm, &bars[s], s, s);
      }
      ptx::cp_async_commit();
    }
    for (int ks = 0; ks < num_k; ++ks) {
      ptx::cp_async_wait<kStages - 2>();
      if constexpr (Cfg::kTmaWeights) ptx::mbar_wait_parity(&bars[ks % kStages], uint32_t(ks / kStages) & 1u);
      __syncthreads();  // stage ks landed for every thread; slot (ks - 1) % kStages is free
      const int next = ks + kStages - 1;
      if (next < num_k) {
        load_stage(p, loader, sm, next % kStages, next);
        if constexpr (Cfg::kTmaWeights)
          if (threadIdx.x == 0) load_weights_tma(p, t, sm, &bars[next % kStages], next % kStages, next);
      }
      ptx::cp_async_commit();
      if (warp_rows && ks * Cfg::kKStage + wk * Cfg::kKWarp < p.k) compute_stage(sm, ks % kStages, wm, wk, acc);
    }
    ptx::cp_async_wait<0>();
    ptx::allow_dependent_launch();  // the next GEMM / finalize may start its CTAs; it waits for us
    reduce_k_split(smem_raw, wm, wk, acc);
    if (wk != 0 || !warp_rows) return;
    if constexpr (kStage == GemmStage::kGemm1) {
      epilogue_gemm1(p, t, wm, acc);
    } else {
      epilogue_gemm2(p, t, wm * 64, 0, acc);
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
