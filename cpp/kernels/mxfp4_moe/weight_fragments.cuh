// MXFP4 weight rows of the prepared layout (cake_mma_v1) -> BF16 mma.sync A fragments.
//
// Per row and 64 elements of K, lane q of a quad owns prepared bytes 8q..8q+7 (two words). Word
// wi, nibble pair (r, r + 4) is one bf16x2 fragment register R = 4 wi + r: sub-step s = R / 2,
// half h = R % 2 (k + 8), low/high halves = even/odd k (docs/mxfp4_moe.md).
//
// Conversion is exact. The E2M1 magnitude bits placed at BF16 bits 6..8 (sign at bit 15) read as
// 2^-126 times the E2M1 value (code 1 becomes the BF16 subnormal 2^-127 = 0.5 * 2^-126). One
// multiply by 2^(code - 1) = 2^126 * 2^(code - 127) then gives the dequantized weight; that factor
// is a BF16 value for UE8M0 codes 0..128. Blocks with larger codes (|w| > 12: rare in real
// weights) take a second multiply; a warp switches to that path only when one of its blocks needs it.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace cake_moe::mxfp4_moe {

constexpr uint32_t kBigScaleCode = 128;  // codes above: 2^(code - 1) is not a BF16 value

// Nibbles r (bits 4r..4r+3) and r + 4 (16 + 4r..) of `word` as bf16x2 patterns times 2^-126:
// magnitude bits to 6..8 / 22..24, sign bits to 15 / 31.
template <int kR>
__device__ __forceinline__ uint32_t e2m1x2_scaled_down(uint32_t word) {
  constexpr int kMagShift = 6 - 4 * kR;   // left for r <= 1, right for r >= 2
  constexpr int kSignShift = 12 - 4 * kR;  // >= 0
  const uint32_t mag = kMagShift >= 0 ? word << (kMagShift >= 0 ? kMagShift : 0)
                                      : word >> (kMagShift < 0 ? -kMagShift : 0);
  return (mag & 0x01C001C0u) | ((word << kSignShift) & 0x80008000u);
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
