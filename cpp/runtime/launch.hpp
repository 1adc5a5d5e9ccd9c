// Kernel launches through cuLaunchKernelEx: grid/block/dynamic smem, optional thread-block
// cluster and programmatic dependent launch as attributes. Never synchronises.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace cake_moe::runtime {

struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;
  unsigned cluster[3] = {0, 0, 0};  // all zero: no cluster attribute
  bool pdl = false;                 // programmatic stream serialization (dependent launch)
  std::uintptr_t stream = 0;        // CUstream handle (the caller's current torch stream)
};

// Launches `kernel` with one by-value argument struct (the kernels take a single
// `const __grid_constant__ Args`). `what` names the op/form for error messages.
// Debug mode: with CAKE_MOE_SYNC_CHECK=1 every launch synchronises its stream before and after,
// and a kernel fault raises CudaError naming the form, or saying that work queued before the
// form faulted (never set it in production; streams under graph capture are not synchronised).
void launch(CUkernel kernel, const LaunchConfig& cfg, const void* args, const char* what);

// Raises the kernel's dynamic shared-memory limit on `device` (needed above 48 KiB).
void set_max_dynamic_smem(CUkernel kernel, int device, unsigned bytes);

// How many clusters of `cfg.cluster` CTAs (with cfg's block size and dynamic smem) can be
// resident on `device` at once: fewer than SMs / cluster size where a GPC's SM count is not a
// multiple of it. Persistent cluster kernels size their grid by it; a cluster launched beyond it
// waits for a whole earlier cluster to finish. Cached per (kernel, device, block, smem, cluster).
int max_active_clusters(CUkernel kernel, int device, const LaunchConfig& cfg);

}  // namespace cake_moe::runtime
