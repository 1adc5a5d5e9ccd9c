// The weights' UE8M0 scale codes in the sm_90a family-B GEMMs (sm90_mxfp4_moe_gemm.cuh): where
// a stage's codes are copied to and where the MMA warps read them.
//
// The stage loader copies one 4-byte word per weight row and stage into the slot; a row's codes
// are K / 32 bytes apart in w_sf, so that is a sector request per row and stage. A GEMM whose
// tiling takes the ring (Sm90Tiling::kGemm1CodeRing / kGemm2CodeRing) and GemmParams::code_ring
// (the host sets it for K a multiple of 512: a row's codes are then 16-byte aligned, and every
// item has a multiple of 4 stages, so its stage ks % 4 == 0 is stream stage g % 4 == 0) takes
// them into a ring of their own instead, kCodeStages stages of words per row, one 16-byte copy
// per row bringing four stages. Measured on the H200 at the contract's prefill sizes
// (bench/results/2026-12-02_h200_mxfp4_moe_code_ring_ab.md and ..._gemm2_codes_ab.md): GEMM1
// 2-10% faster, the three-warpgroup GEMM2 2-4%; the four-warpgroup GEMM2s up to 7% slower (they
// keep the words), and the resident-row GEMM2s (K <= 512) gained nothing from their codes copied
// a whole item at once, so they keep the words too. The copy at
// stream stage g lands on the words of stages g - 8 .. g - 5, last read in iteration g - 5,
// before the barrier of iteration g - kAhead that precedes the copy (the kernel asserts
// kAhead + 4 <= kCodeStages). Rows with bit 2 set swap the two 16-byte halves of their words,
// so that the 8 rows of a warp's code read (32 bytes apart) fall on distinct banks.
#pragma once
#include <cstdint>

#include "common/ptx/sm80.cuh"
#include "mxfp4_moe/params.hpp"

namespace cake_moe::mxfp4_moe {

// Loaders: the stage loader's view of the kernel (Smem, Loader, PointerLoader and its constants).
template <GemmStage kStage, typename Cfg, typename Loaders>
struct Sm90CodeRing {
  static constexpr int kCodeStages = Cfg::kCodeStages, kRowBytes = Cfg::kCodeRowBytes;
  static_assert(kCodeStages == 8 && kRowBytes == 32, "the bank swizzle below assumes 8 stages of 4-byte words");
  static constexpr bool kRing = kStage == GemmStage::kGemm1 ? Cfg::kGemm1CodeRing : Cfg::kGemm2CodeRing;
  using Smem = typename Loaders::Smem;

  __device__ static __forceinline__ bool enabled(const GemmParams& p) {
    return kRing && p.code_ring != 0;
  }
  // Byte offset of row `row`'s word of stream stage g in the CTA's shared memory.
  __device__ static __forceinline__ uint32_t offset(int row, uint32_t g) {
    return uint32_t(Cfg::kCodeOffset + row * kRowBytes) + 4u * ((g % 8u) ^ (uint32_t(row) & 4u));
  }

  // The copying thread's weight row's codes at K = 0 (row threadIdx.x of the item), or null
  // when the row is past the weights.
  __device__ static __forceinline__ const uint8_t* source(const typename Loaders::Loader& l) {
    return l.sf_rows == 0 ? nullptr : l.sf_src;  // (threads past the kBM rows copy nothing: load)
  }
  __device__ static __forceinline__ const uint8_t* source(const typename Loaders::PointerLoader& l) {
    return !(l.valid >> Loaders::kSfBit & 1u) ? nullptr : l.sf_src[0];
  }

  // At an item's stage ks % 4 == 0 (stream stage g): the copying threads' rows' codes of
  // stages ks .. ks + 3, one 16-byte copy each, into the stream's commit group of stage g.
  __device__ static __forceinline__ void load(const GemmParams& p, const Smem& sm, const uint8_t* src, int ks,
                                              uint32_t g) {
    static_assert(Loaders::kSfIters == 1 && Cfg::kWarpsK == 1, "one scale word per copying thread: its row's");
    if (ks % 4 != 0 || int(threadIdx.x) >= Cfg::kBM) return;
    const bool ok = src != nullptr;
    const uint32_t dst = ptx::smem_addr(sm.base) + offset(threadIdx.x, g);
    ptx::cp_async_16(dst, ok ? src + ks * 4 : p.w_sf, ok);  // bound: sfload
  }

  // Where a warp's lane reads its codes of unit 0 of stream stage g in slot `slot` (unit 1: 2
  // bytes on), and the distance between its rows' codes: the ring, or the slot's words.
  struct Reads {
    const uint8_t* unit0;
    int row_stride;
  };
  __device__ static __forceinline__ Reads reads(const GemmParams& p, const Smem& sm, int slot, int row0, uint32_t g) {
    const int row = row0 + ((threadIdx.x & 31) >> 2);  // row g of the warp's first m16 block
    if (enabled(p)) return {sm.base + offset(row, g), kRowBytes};
    return {sm.sf(slot) + row * Cfg::kSfRowBytes, Cfg::kSfRowBytes};
  }
};

}  // namespace cake_moe::mxfp4_moe
