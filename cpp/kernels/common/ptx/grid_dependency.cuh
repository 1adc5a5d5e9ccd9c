// Programmatic dependent launch (sm_90+): a kernel launched with the programmatic-serialization
// attribute may start while its predecessor in the stream drains; it must wait before it reads
// what the predecessor wrote or writes what the predecessor reads. Without the attribute both
// are no-ops.
#pragma once

namespace cake_moe::ptx {

__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace cake_moe::ptx
