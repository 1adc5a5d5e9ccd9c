// Helpers shared by the binding files: DLPack tensors in, raw pointers and checked sizes out.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "runtime/errors.hpp"

namespace cake_moe::bindings {

namespace nb = nanobind;
using Tensor = nb::ndarray<nb::device::cuda>;

// The CUDA device of a tensor argument, checked to be `device` when that is >= 0.
inline int tensor_device(const Tensor& t, const char* name, int device = -1) {
  if (device >= 0 && t.device_id() != device)
    throw ValueError(std::string(name) + " is on cuda:" + std::to_string(t.device_id()) + ", expected cuda:" +
                     std::to_string(device));
  return t.device_id();
}

inline int64_t numel(const Tensor& t) {
  int64_t n = 1;
  for (size_t i = 0; i < t.ndim(); ++i) n *= int64_t(t.shape(i));
  return n;
}

inline int64_t nbytes(const Tensor& t) { return numel(t) * int64_t(t.itemsize()); }

inline void require_aligned(const Tensor& t, const char* name, std::uintptr_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(t.data()) % alignment != 0)
    throw ValueError(std::string(name) + " must be " + std::to_string(alignment) + "-byte aligned");
}

void bind_formats(nb::module_& m);
void bind_grouped_gemm(nb::module_& m);
void bind_mxfp4_moe(nb::module_& m);

}  // namespace cake_moe::bindings
