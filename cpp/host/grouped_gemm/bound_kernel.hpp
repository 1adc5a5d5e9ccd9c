// A resolved kernel with its launch shape and by-value parameter block: the common tail of every
// grouped-GEMM host launcher (the launchers differ in how they fill the parameters).
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "host/grouped_gemm/problem.hpp"
#include "runtime/driver.hpp"
#include "runtime/launch.hpp"

namespace cake_moe::grouped_gemm {

template <typename Params>
class BoundKernel : public Launch {
 public:
  void launch(std::uintptr_t stream) const override {
    runtime::ScopedDevice scope(device_);
    runtime::LaunchConfig cfg = cfg_;
    cfg.stream = stream;
    runtime::launch(kernel_, cfg, params_.get(), form_.c_str());
  }
  const std::string& form() const override { return form_; }

 protected:
  // Parameter blocks holding CUtensorMaps must be 64-byte aligned: heap-allocated (aligned new).
  std::unique_ptr<Params> params_ = std::make_unique<Params>();
  CUkernel kernel_ = nullptr;
  runtime::LaunchConfig cfg_;
  std::string form_;
  int device_ = 0;
};

}  // namespace cake_moe::grouped_gemm
