// A resolved kernel with its launch shape and by-value parameter block: bound once when a plan
// or launcher is built, enqueued by run() with only the stream filled in. The common tail of
// every host launcher (they differ in how they fill the parameters).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/driver.hpp"
#include "runtime/launch.hpp"

namespace cake_moe::runtime {

template <typename Params>
struct BoundKernel {
  // Parameter blocks holding CUtensorMaps must be 64-byte aligned: heap-allocated (aligned new).
  std::unique_ptr<Params> params = std::make_unique<Params>();
  CUkernel kernel = nullptr;
  LaunchConfig cfg;
  std::string form;  // names the form in launch errors
  int device = 0;

  void launch(std::uintptr_t stream) const {
    ScopedDevice scope(device);
    launch_in_scope(stream);
  }
  // For a caller that already holds a ScopedDevice of `device` (a plan enqueuing several kernels).
  void launch_in_scope(std::uintptr_t stream) const {
    LaunchConfig c = cfg;
    c.stream = stream;
    runtime::launch(kernel, c, params.get(), form.c_str());
  }
};

}  // namespace cake_moe::runtime
