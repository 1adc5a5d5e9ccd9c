// The stage layout and the stage loaders of the family B GEMMs (mxfp4_moe_gemm.cuh, and the
// sm_90a forms through it): where a ring slot keeps its weight rows (prepared FP4), their UE8M0
// scales and the gathered token rows (BF16), and the copies that fill it: 16-byte / 4-byte
// cp.async per thread, or 2D TMA boxes for the weights of the tilings with kTmaWeights.
#pragma once
#include <cstdint>

#include "common/ptx/mbarrier.cuh"
#include "common/ptx/sm80.cuh"
#include "common/ptx/tma.cuh"
#include "mxfp4_moe/epilogue.cuh"
#include "mxfp4_moe/params.hpp"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Mxfp4MoeStageLoader {
  static constexpr int kBN = Cfg::kBN, kBM = Cfg::kBM, kThreads = Cfg::kThreads;
  using WorkTile = Mxfp4MoeEpilogue::Tile;

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
    __device__ uint8_t* b(int slot) const { return w(slot) + Cfg::kBOffset; }
  };

  // The fixed part of each thread's share of a stage load: its copies repeat every stage at the
  // same rows and chunks (only the K offset moves), so the addresses are computed once.
  static constexpr int kWChunks = Cfg::kWRowBytes / 16;   // 16-byte weight chunks per row
  static constexpr int kBChunks = Cfg::kBRowBytes / 16;   // 16-byte activation chunks per row
  static constexpr int kWIters = kBM * kWChunks / kThreads;
  static constexpr int kWRowStep = kThreads / kWChunks;
  // Scale words: one per row and K-split warp. Fewer than the copying threads (192 rows over 256
  // threads) leave the last round partial: a copy past the tile's rows is not issued.
  static constexpr bool kSfPartial = kBM * Cfg::kWarpsK % kThreads != 0;
  static constexpr int kSfIters = (kBM * Cfg::kWarpsK + kThreads - 1) / kThreads;
  static constexpr int kSfRowStep = kThreads / Cfg::kWarpsK;
  static constexpr int kBIters = kBN * kBChunks / kThreads > 0 ? kBN * kBChunks / kThreads : 1;
  static constexpr int kBRowStep = kThreads / kBChunks;
  static_assert(kThreads % kWChunks == 0 && kThreads % Cfg::kWarpsK == 0 && kThreads % kBChunks == 0,
                "every thread copies whole columns of a stage");
  static_assert(kBM * kWChunks % kThreads == 0 && (!kSfPartial || kSfIters == 1) && kBN * kBChunks % kThreads == 0,
                "a stage is an exact number of copy rounds (the scales: or one partial round)");
  static_assert(kWRowStep % 4 == 0, "w_chunk repeats every 4 rows: a thread's rows share one swizzle");

  // Scale copy j of this thread lies past the tile's kBM rows (the partial round only).
  __device__ static __forceinline__ bool sf_past_tile(int j) {
    return kSfPartial && int(threadIdx.x) / Cfg::kWarpsK + j * kSfRowStep >= kBM;
  }

  // An activation copy's source is a 32-bit chunk index and its destination a fixed offset, so
  // that a stage costs one add and one wide multiply-add per copy (a row index took ~18
  // instructions of 64-bit and swizzle arithmetic per copy and stage: most of the copying
  // threads' issue in the sm_90a four-warpgroup forms). The chunk index counts 16 bytes: the
  // plan refuses activation operands of 64 GiB or more.
  // Copy j's destination row is copy 0's + j * kBRowStep: the same row swizzle when that step
  // is a multiple of 8 rows (one offset for all copies), else recomputed per copy.
  static constexpr bool kBDstStep = kBRowStep % 8 == 0;
  static_assert(kBIters <= 32, "one validity bit per activation copy");
  struct Loader {
    const uint8_t* w_src;          // this thread's first weight chunk at K = 0
    const uint8_t* sf_src;         // first scale word at K = 0
    uint32_t b_src[kBIters];       // 16-byte chunk of each copy's activation source at K = 0, from p.b
    uint32_t b_valid;              // bit j: copy j's row is in the tile (else source row 0, zero-filled unless kNoZeroFill)
    uint32_t b_dst;                // shared-memory offset of copy 0 in a slot's activation tile
    int64_t w_step, sf_step;       // bytes between this thread's consecutive rows
    uint32_t w_dst, sf_dst;
    int w_rows, sf_rows;           // this thread's copies whose rows exist (partial m-blocks)
    int w_k, sf_k, b_k;            // K of this thread's chunk inside a stage
  };

  __device__ static __forceinline__ uint32_t b_dst_of(const Loader& l, int j) {
    if constexpr (kBDstStep) {
      return l.b_dst + uint32_t(j * (Cfg::b_offset(kBRowStep, 0) - Cfg::b_offset(0, 0)));
    } else {
      return uint32_t(Cfg::b_offset(int(threadIdx.x) / kBChunks + j * kBRowStep, int(threadIdx.x) % kBChunks));
    }
  }

  __device__ static Loader make_loader(const GemmParams& p, const WorkTile& t) {
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
    l.b_dst = uint32_t(Cfg::b_offset(tid / kBChunks, tid % kBChunks));
    l.b_valid = 0;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = tid / kBChunks + j * kBRowStep;
      const bool ok = r < t.rows;
      const int row = !ok ? 0 : (kStage == GemmStage::kGemm1 ? p.row_token[t.row0 + r] : t.row0 + r);
      l.b_src[j] = uint32_t(row) * uint32_t(p.k / 8) + uint32_t(l.b_k / 8);
      l.b_valid |= uint32_t(ok) << j;
    }
    return l;
  }

  // Loads stage `ks` (K offset ks * kKStage) into ring slot `slot`; rows outside the weight
  // matrix, the token tile or K are zero-filled and not read. kWithB false: no token rows (a
  // form that keeps them resident loads them itself); kWithSf false: no scale codes (the sm_90a
  // forms copy them into a ring of their own). kNoKTests (the caller runs K as a multiple of the
  // stage): no K tests. kNoZeroFill (with kNoKTests): the token rows past the tile are copied
  // from the source of their make_loader entry (row 0) rather than zero-filled, for columns the
  // caller never stores.
  template <bool kWithB = true, bool kWithSf = true, bool kNoKTests = false, bool kNoZeroFill = false>
  __device__ static void load_stage(const GemmParams& p, const Loader& l, const Smem& sm, int slot, int ks) {
    static_assert(kNoKTests || !kNoZeroFill, "row-0 filler rows only where no stage runs past K");
    const int k0 = ks * Cfg::kKStage;
    if constexpr (!Cfg::kTmaWeights) {
      const uint32_t w_base = ptx::smem_addr(sm.w(slot)) + l.w_dst;
      const bool w_k_ok = kNoKTests || k0 + l.w_k < p.k;
      const uint8_t* w_src = l.w_src + k0 / 2;
#pragma unroll
      for (int j = 0; j < kWIters; ++j) {
        const bool ok = w_k_ok && j < l.w_rows;
        ptx::cp_async_16(w_base + j * kWRowStep * Cfg::kWRowBytes, ok ? w_src + j * l.w_step : l.w_src, ok);  // bound: wload
      }
    }
    if constexpr (kWithSf) {
      const uint32_t sf_base = ptx::smem_addr(sm.sf(slot)) + l.sf_dst;
      const bool sf_k_ok = kNoKTests || k0 + l.sf_k < p.k;
      const uint8_t* sf_src = l.sf_src + k0 / 32;
#pragma unroll
      for (int j = 0; j < kSfIters; ++j) {
        if (sf_past_tile(j)) continue;
        const bool ok = sf_k_ok && j < l.sf_rows;
        ptx::cp_async_4(sf_base + j * kSfRowStep * Cfg::kSfRowBytes, ok ? sf_src + j * l.sf_step : l.sf_src, ok);  // bound: sfload
      }
    }
    if constexpr (!kWithB) return;
    const uint32_t b_base = ptx::smem_addr(sm.b(slot));
    const bool b_k_ok = kNoKTests || k0 + l.b_k < p.k;
    const uint32_t b_off = b_k_ok ? uint32_t(k0 / 8) : 0u;  // past K: nothing is read, the source stays in bounds
#pragma unroll
    for (int j = 0; j < kBIters; ++j)
      ptx::cp_async_16(b_base + b_dst_of(l, j), p.b + uint64_t(l.b_src[j] + b_off) * 8u,
                       kNoZeroFill || (b_k_ok && (l.b_valid >> j & 1u)));  // bound: bload
  }

  // TMA weights (one thread): stage `ks`'s boxes of the tile's kBM weight rows into ring slot
  // `slot`, completing on bar. Boxes wholly past K are not issued (they would only feed K the
  // fragments never read); rows past the tensor arrive as zeros and count like the rest.
  __device__ static void load_weights_tma(const GemmParams& p, const WorkTile& t, const Smem& sm, uint64_t* bar,
                                          int slot, int ks) {
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
  // registers (n8 reaches its cap: decode 2-5% slower, docs/mxfp4_moe_experiments.md).
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

  __device__ static PointerLoader make_pointer_loader(const GemmParams& p, const WorkTile& t) {
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

  template <bool kWithB = true, bool kWithSf = true>
  __device__ static void load_stage(const GemmParams& p, const PointerLoader& l, const Smem& sm, int slot, int ks) {
    const int k0 = ks * Cfg::kKStage;
    const uint32_t w_base = ptx::smem_addr(sm.w(slot)) + l.w_dst;
    const bool w_k_ok = k0 + l.w_k < p.k;
    const int w_off = w_k_ok ? k0 / 2 : 0;  // past K: nothing is read, the source stays in bounds
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      ptx::cp_async_16(w_base + j * kWRowStep * Cfg::kWRowBytes, l.w_src[j] + w_off, w_k_ok && (l.valid >> j & 1u));  // bound: wload
    if constexpr (kWithSf) {
      const uint32_t sf_base = ptx::smem_addr(sm.sf(slot)) + l.sf_dst;
      const bool sf_k_ok = k0 + l.sf_k < p.k;
      const int sf_off = sf_k_ok ? k0 / 32 : 0;
#pragma unroll
      for (int j = 0; j < kSfIters; ++j)
        if (!sf_past_tile(j))
          ptx::cp_async_4(sf_base + j * kSfRowStep * Cfg::kSfRowBytes, l.sf_src[j] + sf_off,
                          sf_k_ok && (l.valid >> (kSfBit + j) & 1u));
    }
    if constexpr (!kWithB) return;
    const uint32_t b_base = ptx::smem_addr(sm.b(slot));
    const bool b_k_ok = k0 + l.b_k < p.k;
    const int b_off = b_k_ok ? k0 : 0;
    const int c = threadIdx.x % kBChunks;
#pragma unroll
    for (int j = 0; j < kBIters; ++j) {
      const int r = threadIdx.x / kBChunks + j * kBRowStep;
      ptx::cp_async_16(b_base + Cfg::b_offset(r, c), l.b_src[j] + b_off, b_k_ok && (l.valid >> (kBBit + j) & 1u));  // bound: bload
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
