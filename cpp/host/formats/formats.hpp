// Host launchers of the number-format kernels (device code: cpp/kernels/formats/).
#pragma once
#include <cstdint>

#include "formats/args.hpp"
#include "runtime/bound_kernel.hpp"

namespace cake_moe::formats {

// `in_bf16`: the input is BF16 (else FP32). The caller has validated shapes and alignment.
void launch_quantize(Fmt fmt, bool in_bf16, bool swizzled, const QuantizeArgs& args, int device, std::uintptr_t stream);

// `out_bf16`: the output is BF16 (else FP32).
void launch_dequantize(Fmt fmt, bool out_bf16, bool swizzled, const DequantizeArgs& args, int device,
                       std::uintptr_t stream);

// The same launch resolved once (a plan's step); `args` must describe at least one chunk.
runtime::BoundKernel<DequantizeArgs> bind_dequantize(Fmt fmt, bool out_bf16, bool swizzled,
                                                     const DequantizeArgs& args, int device);

// Bytes of the scale tensor for `rows` x `cols` elements (padded when swizzled).
int64_t scale_bytes(Fmt fmt, int64_t rows, int64_t cols, bool swizzled);

}  // namespace cake_moe::formats
