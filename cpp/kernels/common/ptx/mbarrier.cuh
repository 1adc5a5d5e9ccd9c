// Thin inline-PTX wrappers around the sm_90 shared-memory mbarrier (CTA scope).
// Every barrier here lives in shared memory and is addressed by its 32-bit
// shared-window address, which is what the PTX instructions take.
#pragma once

#include <cstdint>

#include "common/ptx/smem.cuh"

namespace cake_moe {
namespace ptx {

// Initialise a barrier that completes a phase after `count` arrivals (plus any
// expected transaction bytes).
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Make barrier initialisation visible to the other threads and to the async
// (TMA) proxy. Follow with a CTA-wide barrier before the first use.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Plain arrival (release semantics at CTA scope).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrival that also announces `bytes` of transactions (TMA loads) this phase
// still has to receive before it can complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// One bounded probe: true once the phase with parity `parity` has completed.
// A freshly initialised barrier is in phase 0, so probing parity 1 succeeds at
// once (the "previous" phase counts as complete) -- producers rely on that.
__device__ __forceinline__ bool mbar_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Block until the phase with parity `parity` has completed (acquire).
__device__ __forceinline__ void mbar_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait_parity(bar, parity)) {
  }
}

// Order this thread's generic-proxy shared-memory accesses before later
// async-proxy (TMA / wgmma) accesses of the same memory.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier over `num_threads` threads (a multiple of 32); id 0 is
// __syncthreads, so callers use ids 1..15.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

}  // namespace ptx
}  // namespace cake_moe
