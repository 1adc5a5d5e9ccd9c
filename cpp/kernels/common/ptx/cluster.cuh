// Thin inline-PTX wrappers for thread-block clusters (sm_90): a CTA's rank, the cluster-wide
// barrier, the address of the same shared-memory word in another CTA of the cluster, an
// mbarrier arrival there, and a TMA load multicast into several CTAs of the cluster.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/ptx/smem.cuh"

namespace cake_moe {
namespace ptx {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA in the cluster arrives, then waits for all of them (release /
// acquire at cluster scope: the barriers one CTA initialised are visible to the others after it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of this CTA's shared-memory word `smem_byte_addr` in CTA `rank`.
__device__ __forceinline__ uint32_t map_shared_rank(uint32_t smem_byte_addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(smem_byte_addr), "r"(rank));
  return out;
}

// One arrival on an mbarrier of another CTA of the cluster, given by its shared::cluster address
// (map_shared_rank). Release at CTA scope (the default): it tells the other CTA's producer that a
// stage this CTA's wgmmas read (completed at their wait) may be refilled; a cluster-scope release
// would order all of this thread's prior memory operations cluster-wide on every k-block.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}

// 2D tiled load multicast: the box lands at the same shared-memory offset `smem_dst` in every
// CTA of `cta_mask` and completes as transaction bytes on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(const CUtensorMap* map, uint64_t* bar, void* smem_dst,
                                                      int32_t c0, int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

}  // namespace ptx
}  // namespace cake_moe
