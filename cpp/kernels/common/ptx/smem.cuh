// The 32-bit shared-window address of a shared-memory pointer: what every PTX instruction that
// names shared memory (cp.async, ldmatrix, mbarrier, TMA, wgmma descriptors) takes; and a
// 16-byte zero store at such an address.
#pragma once
#include <cstdint>

namespace cake_moe::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0u) : "memory");
}

}  // namespace cake_moe::ptx
