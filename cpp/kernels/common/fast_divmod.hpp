// Division of 32-bit unsigned values by a run-time invariant divisor with one multiply-high
// (Granlund & Montgomery): the host builds the magic once, device code divides in 3 instructions
// instead of the ~100 of a 64-bit division.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/host_device.hpp"

namespace cake_moe {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  // Host side: shift = ceil(log2 d), multiplier = floor(2^32 (2^shift - d) / d) + 1.
  explicit FastDivmod(uint32_t d) : divisor(d) {
    if (d == 0) throw std::invalid_argument("FastDivmod: the divisor must be positive");
    shift = 0;
    while ((uint64_t(1) << shift) < d) ++shift;
    multiplier = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  CAKE_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, multiplier);
#else
    const uint32_t t = uint32_t((uint64_t(n) * multiplier) >> 32);
#endif
    return uint32_t((uint64_t(t) + n) >> shift);
  }
  CAKE_HD uint32_t mod(uint32_t n, uint32_t q) const { return n - q * divisor; }
};

}  // namespace cake_moe
