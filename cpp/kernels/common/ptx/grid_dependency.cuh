// Programmatic dependent launch (sm_90+): a kernel launched with the programmatic-serialization
// attribute may start while its predecessor in the stream drains; it must wait before it reads
// what the predecessor wrote or writes what the predecessor reads. Without the attribute both
// are no-ops.
#pragma once

namespace cake_moe::ptx {

// Host compilations see no-ops: the host-side tests run kernels on emulated CTAs, one launch
// after another.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace cake_moe::ptx
