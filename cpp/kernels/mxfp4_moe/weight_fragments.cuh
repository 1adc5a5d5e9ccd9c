// MXFP4 weight rows of the prepared layout (cake_mma_v3) -> BF16 mma.sync / wgmma A fragments.
//
// Per row and 64 elements of K, lane q of a quad owns prepared bytes 8q..8q+7 (two words). Word
// wi, register slot r (0..3), halves h = 0, 1 is one bf16x2 fragment register R = 4 wi + r:
// sub-step s = R / 2, half R % 2 (k + 8), low/high halves = even/odd k (docs/mxfp4_moe.md).
//
// Conversion is exact. The E2M1 magnitude bits placed at BF16 bits 6..8 (sign at bit 15) read as
// 2^-126 times the E2M1 value (code 1 becomes the BF16 subnormal 2^-127 = 0.5 * 2^-126). One
// multiply by 2^(code - 1) = 2^126 * 2^(code - 127) then gives the dequantized weight; that factor
// is a BF16 value for UE8M0 codes 0..128. Blocks with larger codes (|w| > 12: rare in real
// weights) take a second multiply: the mma.sync forms switch a warp's stage to it when one of its
// blocks needs it, the sm_90a forms an item whose expert has such a code (GemmParams::sf_max).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace cake_moe::mxfp4_moe {

constexpr uint32_t kBigScaleCode = 128;  // codes above: 2^(code - 1) is not a BF16 value

// Whether an expert's blocks may need the two-multiply conversion: its largest code (the
// prepared bank's w*_sf_max, GemmParams::sf_max) is above kBigScaleCode, or none is bound.
__device__ __forceinline__ bool expert_may_need_big(const uint8_t* sf_max, int expert) {
  return sf_max == nullptr || sf_max[expert] > kBigScaleCode;
}

// Register slot r of a prepared word as a bf16x2 pattern times 2^-126: magnitude bits at 6..8 /
// 22..24, sign bits at 15 / 31, everything else zero. prepare_cake_mxfp4_weights spreads each
// slot's bits so that slots 0..2 are one rotate (by 0, 10, 13) and one mask. No fourth rotation
// tiles the rest (the pattern {6, 7, 8, 15} does not tile Z/16 by translation), so slot 3's bits
// sit at 3, 4, 0, 1 (+ 16h) and one multiply moves them left by 3, 3, 8 and 14 at once: the
// shifted copies of the eight masked bits never overlap, so the product is their OR (no carries).
// Three instructions instead of the six a shift per bit group takes. The bit table is
// _prepare.bit_position.
constexpr uint32_t kSlotMask = 0x81C081C0u;
constexpr uint32_t kSlot3Bits = 0x001B001Bu;
constexpr uint32_t kSlot3Shifts = (1u << 3) | (1u << 8) | (1u << 14);
// True when the shifted copies of the masked bits land on distinct bits: then the product is
// their OR and no carry can reach a target bit.
constexpr bool slot3_copies_disjoint() {
  uint64_t seen = 0;
  for (int b = 0; b < 32; ++b) {
    if (!((kSlot3Bits >> b) & 1u)) continue;
    for (int d = 0; d < 32; ++d) {
      if (!((kSlot3Shifts >> d) & 1u)) continue;
      if ((seen >> (b + d)) & 1u) return false;
      seen |= uint64_t(1) << (b + d);
    }
  }
  return true;
}
static_assert(slot3_copies_disjoint(), "slot 3's multiply is a carry-free OR of shifted copies");

template <int kR>
__device__ __forceinline__ uint32_t e2m1x2_scaled_down(uint32_t word) {
  if constexpr (kR == 0) {
    return word & kSlotMask;
  } else if constexpr (kR == 1) {
    return __funnelshift_l(word, word, 10) & kSlotMask;
  } else if constexpr (kR == 2) {
    return __funnelshift_l(word, word, 13) & kSlotMask;
  } else {
    return ((word & kSlot3Bits) * kSlot3Shifts) & kSlotMask;
  }
}

// The bf16x2 factors of a block with UE8M0 `code`: first = 2^(code - 1) (codes <= 128) or 2^126,
// second = 1 or 2^(code - 127) (codes > 128).
__device__ __forceinline__ uint32_t first_factor(uint32_t code) {
  return code <= kBigScaleCode ? (code + 126u) * 0x00800080u : 0x7E807E80u;
}
__device__ __forceinline__ uint32_t second_factor(uint32_t code) {
  return code <= kBigScaleCode ? 0x3F803F80u : code * 0x00800080u;
}

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t bits) {
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

template <bool kBig>
__device__ __forceinline__ uint32_t dequant_e2m1x2(uint32_t scaled_down, uint32_t code) {
  __nv_bfloat162 v = __hmul2(as_bf162(scaled_down), as_bf162(kBig ? first_factor(code) : (code + 126u) * 0x00800080u));
  if constexpr (kBig) v = __hmul2(v, as_bf162(second_factor(code)));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The four A-fragment registers of k16 sub-step `s` (0..3) of a 64-element unit for rows g and
// g + 8 of an m16 block, from each row's two prepared words and its UE8M0 code for the
// sub-step's block (k 0..31 of the unit for s < 2, else 32..63).
template <int kS, bool kBig>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const uint2& row_g, const uint2& row_g8, uint32_t code_g,
                                           uint32_t code_g8) {
  constexpr int kR0 = (2 * kS) % 4;  // register of half h = 0; h = 1 is kR0 + 1
  const uint32_t wg = kS < 2 ? row_g.x : row_g.y;
  const uint32_t wg8 = kS < 2 ? row_g8.x : row_g8.y;
  a[0] = dequant_e2m1x2<kBig>(e2m1x2_scaled_down<kR0>(wg), code_g);
  a[1] = dequant_e2m1x2<kBig>(e2m1x2_scaled_down<kR0>(wg8), code_g8);
  a[2] = dequant_e2m1x2<kBig>(e2m1x2_scaled_down<kR0 + 1>(wg), code_g);
  a[3] = dequant_e2m1x2<kBig>(e2m1x2_scaled_down<kR0 + 1>(wg8), code_g8);
}

}  // namespace cake_moe::mxfp4_moe
