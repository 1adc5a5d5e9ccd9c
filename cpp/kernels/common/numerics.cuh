// Bit-exact number-format primitives (SPEC §3). Every rounding here is explicit (__fmul_rn,
// __fdiv_rn) so nvcc cannot contract or approximate it: the pure-torch reference quantizers in
// python/cake_moe/reference/formats.py perform the same IEEE operations in the same order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace cake_moe::numerics {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;
constexpr int kE4m3Emax = 8;  // 448 = 1.75 * 2^8
constexpr int kE2m1Emax = 2;  // 6 = 1.5 * 2^2
constexpr uint32_t kUe8m0Nan = 0xFF;
constexpr uint8_t kE4m3Nan = 0x7F;

// UE8M0 code of the smallest power of two >= t (t >= 0, may be +inf), saturating at 254
// (2^127). Code 0 is reserved for t == 0 (an all-zero block): for subnormal t the code is 1.
__device__ __forceinline__ uint32_t ue8m0_round_up(float t) {
  const uint32_t b = __float_as_uint(t);
  const uint32_t c = (b >> 23) + ((b & 0x7FFFFFu) != 0u);
  return c > 254u ? 254u : c;
}

// OCP MX rule: 2^(floor(log2 amax) - emax), clamped to codes [1, 254]; 0 for amax == 0.
__device__ __forceinline__ uint32_t ue8m0_ocp_floor(float amax, int emax) {
  const uint32_t b = __float_as_uint(amax);
  if (b == 0u) return 0u;
  const int e = int(b >> 23);
  const int floor_log2 = e != 0 ? e - 127 : (31 - __clz(int(b & 0x7FFFFFu))) - 149;
  const int c = floor_log2 - emax + 127;
  return uint32_t(c < 1 ? 1 : (c > 254 ? 254 : c));
}

// 2^(127 - code) for code in [1, 254]: the factor that maps a block into the element range.
__device__ __forceinline__ float ue8m0_inverse(uint32_t code) {
  return code == 254u ? __uint_as_float(0x00400000u) : __uint_as_float((254u - code) << 23);
}

// The factor into the element range of a block with `code`: 0 for the zero block (code 0) and
// the NaN block (0xFF), whose elements are written as 0 / NaN without it.
__device__ __forceinline__ float ue8m0_to_elem(uint32_t code) {
  return (code == 0u || code == kUe8m0Nan) ? 0.0f : ue8m0_inverse(code);
}

// 2^(code - 127) (dequantization); NaN for 0xFF. Code 0 decodes to 2^-127 (its elements are 0).
__device__ __forceinline__ float ue8m0_value(uint32_t code) {
  if (code == kUe8m0Nan) return __uint_as_float(0x7FC00000u);
  return code == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(code << 23);
}

// E2M1 rounding of v: round-to-nearest-even, saturating at 6 (NaN rounds to 6; callers zero
// NaN blocks). The map T(a) = min(2a, a + 2, a/2 + 4) sends the E2M1 grid
// {0, .5, 1, 1.5, 2, 3, 4, 6} to the integers 0..7 and the midpoints to half-integers, so the
// code is RNE(T(a)) = min(RNE(2a), RNE(a) + 2, RNE(a/2) + 4): RNE commutes with min and with
// adding even integers. Each RNE is one FMA with 2^23 (the sum's ulp is 1); the code is the low
// bits of the smallest sum. Three FMA-pipe ops and three min/max: cheaper on sm_90 than integer
// bit manipulation (the ALU pipe issues at half rate). The reference states the same rule as
// comparisons with the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (checked against it
// exhaustively near every midpoint and on 2*10^7 random FP32 values).
// Returns the rounded magnitude as FP32 bits 2^23 + code (0x4B000000 + 0..7).
__device__ __forceinline__ uint32_t e2m1_rne_bits(float v) {
  const float a = fminf(fabsf(v), kE2m1Max);  // |v| saturated at 6 (inf too; NaN -> 6)
  const float r1 = __fmaf_rn(a, 2.0f, 8388608.0f);   // 2^23 + RNE(2a)
  const float r2 = __fadd_rn(a, 8388610.0f);         // 2^23 + RNE(a) + 2
  const float r3 = __fmaf_rn(a, 0.5f, 8388612.0f);   // 2^23 + RNE(a/2) + 4
  return __float_as_uint(fminf(fminf(r1, r2), r3));
}

// Eight E2M1 codes in a word (element i in nibble i), accumulated as sum_i (bits_i + 8 sign_i)
// 16^i with multiply-adds and the 2^23 offsets removed once (0x4B000000 * sum 16^i mod 2^32).
// `mag[i]` is rounded (its sign ignored), `sign_of[i]` gives the sign: NVFP4's quotients that
// overflowed are NaN (rounded to 6 like the quotient), so their sign comes from the element.
// The sign comes from a multiply-high (x >> 31 = umulhi(x, 2)): every step stays on the FMA
// pipe, which issues at twice the rate of the ALU pipe on sm_90.
__device__ __forceinline__ uint32_t e2m1_pack8(const float (&mag)[8], const float (&sign_of)[8]) {
  constexpr uint32_t kOffsets = 0x4B000000u * 0x11111111u;
  uint32_t w = 0;
#pragma unroll
  for (int i = 7; i >= 0; --i) {
    const uint32_t sign = __umulhi(__float_as_uint(sign_of[i]), 2u);
    w = w * 16u + (sign * 8u + e2m1_rne_bits(mag[i]));
  }
  return w - kOffsets;
}

// RN(a / b) from y = RN(1 / b): q0 = RN(a * y) corrected once by the exact residual (Markstein)
// is the correctly rounded quotient wherever y, q0 and the quotient are finite and normal
// (`python ci/fp32_division_check.py` checks it with exact rationals at the points where the
// callers' rounding decides). The residual is taken as q0 * b - a and subtracted, so a zero a
// keeps its sign (a - q0 * b would give +0 for a = -0). Callers own the ranges: an infinite q0
// gives NaN.
__device__ __forceinline__ float div_by_reciprocal(float a, float b, float y) {
  const float q0 = __fmul_rn(a, y);
  const float neg_r = __fmaf_rn(q0, b, -a);
  return __fmaf_rn(-neg_r, y, q0);
}

__device__ __forceinline__ float e2m1_decode(uint32_t code) {
  const uint32_t m = code & 7u;
  // codes 2..7 are normal: 2^((m>>1)-1) * (1 + (m&1)/2); code 1 is the subnormal 0.5
  uint32_t bits = m >= 2u ? ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22)) : (m == 1u ? 0x3F000000u : 0u);
  return __uint_as_float(bits | ((code & 8u) << 28));
}

__device__ __forceinline__ uint32_t e4m3_encode(float v) {
  return uint32_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Two E4M3 codes, `lo` in the low byte.
__device__ __forceinline__ uint32_t e4m3_encode2(float lo, float hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// max(a, |b|) that propagates NaN (max.NaN): the block amax and its NaN flag in one value.
__device__ __forceinline__ float max_abs_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(fabsf(b)));
  return r;
}

__device__ __forceinline__ float e4m3_decode(uint32_t code) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3);
  return __half2float(__half(h));
}

}  // namespace cake_moe::numerics
