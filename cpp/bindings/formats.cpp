// Bindings of the number-format kernels. Python (cake_moe.formats) validates every tensor
// (dtype, device, shape, contiguity, alignment, overlap) and passes addresses and the geometry;
// the checks here are the format name and rule, the geometry's block multiple, alignment and
// non-null addresses (the host launchers add the 32-bit chunk bounds).
#include <nanobind/stl/string.h>

#include "bindings/common.hpp"
#include "host/formats/formats.hpp"

namespace cake_moe::bindings {
namespace {

formats::Fmt parse_fmt(const std::string& s) {
  if (s == "mxfp8") return formats::Fmt::kMxfp8;
  if (s == "mxfp4") return formats::Fmt::kMxfp4;
  if (s == "nvfp4") return formats::Fmt::kNvfp4;
  throw ValueError("format must be 'mxfp8', 'mxfp4' or 'nvfp4', got '" + s + "'");
}

// The sizes and addresses a launch relies on. Python checked every tensor (dtype, device,
// shape, contiguity, overlap) and passes the geometry it derived from them.
void check_launch(formats::Fmt fmt, int device, std::uintptr_t wide, std::uintptr_t q, std::uintptr_t scale,
                  int64_t rows, int64_t cols, const char* wide_name) {
  const int64_t block = formats::block_size(fmt);
  if (device < 0) throw ValueError("device index must be >= 0");
  if (rows < 0 || cols < 0 || cols % block != 0)
    throw ValueError("rows must be >= 0 and cols a multiple of " + std::to_string(block));
  if (wide % 16 != 0) throw ValueError(std::string(wide_name) + " must be 16-byte aligned");
  if (q % 16 != 0) throw ValueError("q must be 16-byte aligned");
  if (rows * cols != 0 && (!wide || !q || !scale)) throw ValueError("null tensor address");
}

// The NVFP4 encode scale (device scalar); nullptr for the MX formats, which have none.
const float* nvfp4_global_scale(formats::Fmt fmt, std::uintptr_t g) {
  if (fmt != formats::Fmt::kNvfp4) return nullptr;
  if (!g || g % 4 != 0) throw ValueError("nvfp4 needs global_scale: the address of one float32");
  return reinterpret_cast<const float*>(g);
}

}  // namespace

// Device addresses, not DLPack tensors: an import per tensor cost host time on every call, and
// a `__dlpack__()` asked for no stream synchronises with the legacy stream on some torch
// versions, which ends a CUDA graph capture.
void bind_formats(nb::module_& m) {
  m.def("quantize", [](const std::string& fmt_s, int device, std::uintptr_t x, bool x_bf16, std::uintptr_t q,
                       std::uintptr_t scale, std::uintptr_t global_scale, int64_t rows, int64_t cols, bool swizzled,
                       int rule, std::uintptr_t stream) {
    const auto fmt = parse_fmt(fmt_s);
    check_launch(fmt, device, x, q, scale, rows, cols, "x");
    if (rule != 0 && rule != 1) throw ValueError("scale rule must be 0 (round-up) or 1 (OCP floor)");
    formats::QuantizeArgs a{};
    a.global_scale = nvfp4_global_scale(fmt, global_scale);
    a.x = reinterpret_cast<const void*>(x);
    a.q = reinterpret_cast<uint8_t*>(q);
    a.scale = reinterpret_cast<uint8_t*>(scale);
    a.rows = rows;
    a.cols = cols;
    a.scale_rule = rule;
    formats::launch_quantize(fmt, x_bf16, swizzled, a, device, stream);
  }, nb::arg("fmt"), nb::arg("device"), nb::arg("x"), nb::arg("x_bf16"), nb::arg("q"), nb::arg("scale"),
     nb::arg("global_scale"), nb::arg("rows"), nb::arg("cols"), nb::arg("swizzled"), nb::arg("rule"),
     nb::arg("stream"));

  m.def("dequantize", [](const std::string& fmt_s, int device, std::uintptr_t q, std::uintptr_t scale,
                         std::uintptr_t global_scale, std::uintptr_t out, bool out_bf16, int64_t rows, int64_t cols,
                         bool swizzled, std::uintptr_t stream) {
    const auto fmt = parse_fmt(fmt_s);
    check_launch(fmt, device, out, q, scale, rows, cols, "out");
    formats::DequantizeArgs a{};
    a.global_scale = nvfp4_global_scale(fmt, global_scale);
    a.q = reinterpret_cast<const uint8_t*>(q);
    a.scale = reinterpret_cast<const uint8_t*>(scale);
    a.out = reinterpret_cast<void*>(out);
    a.rows = rows;
    a.cols = cols;
    formats::launch_dequantize(fmt, out_bf16, swizzled, a, device, stream);
  }, nb::arg("fmt"), nb::arg("device"), nb::arg("q"), nb::arg("scale"), nb::arg("global_scale"), nb::arg("out"),
     nb::arg("out_bf16"), nb::arg("rows"), nb::arg("cols"), nb::arg("swizzled"), nb::arg("stream"));
}

}  // namespace cake_moe::bindings
