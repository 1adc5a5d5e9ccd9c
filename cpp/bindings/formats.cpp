// Bindings of the number-format kernels. Python (cake_moe.formats) validates every argument
// first; the checks here repeat the ones that keep a launch memory-safe.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>

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

bool is_bf16(const Tensor& t, const char* name) {
  if (t.dtype() == nb::dtype<float>()) return false;
  if (t.dtype().code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.dtype().bits == 16) return true;
  throw ValueError(std::string(name) + " must be bfloat16 or float32");
}

void check_sizes(formats::Fmt fmt, const Tensor& wide, const Tensor& q, const Tensor& scale, int64_t rows,
                 int64_t cols, bool swizzled, const char* wide_name) {
  const int64_t block = formats::block_size(fmt);
  if (rows < 0 || cols < 0 || cols % block != 0)
    throw ValueError("cols must be a multiple of " + std::to_string(block));
  if (numel(wide) != rows * cols) throw ValueError(std::string(wide_name) + " has the wrong number of elements");
  if (nbytes(q) != rows * cols / formats::elems_per_byte(fmt)) throw ValueError("q has the wrong size");
  if (nbytes(scale) != formats::scale_bytes(fmt, rows, cols, swizzled)) throw ValueError("scale has the wrong size");
  require_aligned(wide, wide_name, 16);
  require_aligned(q, "q", 16);
}

// The NVFP4 encode scale (device scalar); nullptr for the MX formats, which have none.
const float* nvfp4_global_scale(formats::Fmt fmt, const std::optional<Tensor>& g, int dev) {
  if (fmt != formats::Fmt::kNvfp4) return nullptr;
  if (!g || numel(*g) != 1 || g->dtype() != nb::dtype<float>())
    throw ValueError("nvfp4 needs global_scale: a float32 tensor of one element");
  tensor_device(*g, "global_scale", dev);
  return static_cast<const float*>(g->data());
}

}  // namespace

void bind_formats(nb::module_& m) {
  m.def("quantize", [](const std::string& fmt_s, Tensor x, Tensor q, Tensor scale, std::optional<Tensor> global_scale,
                       int64_t rows, int64_t cols, bool swizzled, int rule, std::uintptr_t stream) {
    const auto fmt = parse_fmt(fmt_s);
    const int dev = tensor_device(x, "x");
    tensor_device(q, "q", dev);
    tensor_device(scale, "scale", dev);
    check_sizes(fmt, x, q, scale, rows, cols, swizzled, "x");
    formats::QuantizeArgs a{};
    a.global_scale = nvfp4_global_scale(fmt, global_scale, dev);
    if (rule != 0 && rule != 1) throw ValueError("scale rule must be 0 (round-up) or 1 (OCP floor)");
    a.x = x.data();
    a.q = static_cast<uint8_t*>(q.data());
    a.scale = static_cast<uint8_t*>(scale.data());
    a.rows = rows;
    a.cols = cols;
    a.scale_rule = rule;
    formats::launch_quantize(fmt, is_bf16(x, "x"), swizzled, a, dev, stream);
  }, nb::arg("fmt"), nb::arg("x"), nb::arg("q"), nb::arg("scale"), nb::arg("global_scale").none(), nb::arg("rows"),
     nb::arg("cols"), nb::arg("swizzled"), nb::arg("rule"), nb::arg("stream"));

  m.def("dequantize", [](const std::string& fmt_s, Tensor q, Tensor scale, std::optional<Tensor> global_scale,
                         Tensor out, int64_t rows, int64_t cols, bool swizzled, std::uintptr_t stream) {
    const auto fmt = parse_fmt(fmt_s);
    const int dev = tensor_device(out, "out");
    tensor_device(q, "q", dev);
    tensor_device(scale, "scale", dev);
    check_sizes(fmt, out, q, scale, rows, cols, swizzled, "out");
    formats::DequantizeArgs a{};
    a.global_scale = nvfp4_global_scale(fmt, global_scale, dev);
    a.q = static_cast<const uint8_t*>(q.data());
    a.scale = static_cast<const uint8_t*>(scale.data());
    a.out = out.data();
    a.rows = rows;
    a.cols = cols;
    formats::launch_dequantize(fmt, is_bf16(out, "out"), swizzled, a, dev, stream);
  }, nb::arg("fmt"), nb::arg("q"), nb::arg("scale"), nb::arg("global_scale").none(), nb::arg("out"), nb::arg("rows"),
     nb::arg("cols"), nb::arg("swizzled"), nb::arg("stream"));
}

}  // namespace cake_moe::bindings
