// The names of CUDA's cuda_bf16.h that device code run on emulated CTAs uses, for host builds
// without a CUDA toolkit (cpp/tests only; the kernels build against the real header). The
// conversion rounds to nearest even and gives 0x7FFF for a NaN, as the device does.
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __nv_bfloat16{0x7FFF};  // NaN
  return __nv_bfloat16{uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
