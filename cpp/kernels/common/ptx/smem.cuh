// The 32-bit shared-window address of a shared-memory pointer: what every PTX instruction that
// names shared memory (cp.async, ldmatrix, mbarrier, TMA, wgmma descriptors) takes.
#pragma once
#include <cstdint>

namespace cake_moe::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace cake_moe::ptx
