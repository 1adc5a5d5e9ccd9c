// What the form choices know of a device: its arch, SM count and peak DRAM bandwidth (queried
// through the driver once per process: driver.hpp, runtime::device_info). No CUDA header, so
// the host-side tests build it without a toolkit.
#pragma once
#include <string>

namespace cake_moe::runtime {

// Parts with less peak DRAM bandwidth per SM than this (an H100 SXM: 3.35 TB/s on 132 SMs,
// 25 GB/s; the H200: 4.8 TB/s, 36 GB/s, as their drivers report them) lose more time in the forms
// that stream operands and gain more from those that reuse them: the form choices of both families
// read it (grouped_gemm/heuristics_sm90.hpp, python/cake_moe/mxfp4_moe/_decide.py).
inline constexpr double kNarrowMemoryBytesPerSmS = 30e9;

// Per-device properties that never change, queried once per process (every prepare reads them).
struct DeviceInfo {
  std::string arch;              // compute capability as a "90a"-style arch name
  int sm_count = 0;
  double dram_bytes_per_s = 0;  // peak: two transfers per memory clock over the bus width; 0: not reported

  // False where the driver reports no bandwidth: the choices then are the H200's.
  bool narrow_memory() const {
    return dram_bytes_per_s > 0 && sm_count > 0 && dram_bytes_per_s < kNarrowMemoryBytesPerSmS * sm_count;
  }
};

}  // namespace cake_moe::runtime
