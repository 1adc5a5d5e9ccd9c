#include "host/formats/formats.hpp"

#include <string>
#include <vector>

#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/images.hpp"
#include "runtime/launch.hpp"

namespace cake_moe::formats {
namespace {

constexpr unsigned kThreads = 256;   // matches __launch_bounds__ in forms.py

const char* fmt_name(Fmt f) { return f == Fmt::kMxfp8 ? "mxfp8" : (f == Fmt::kMxfp4 ? "mxfp4" : "nvfp4"); }

// Kernels of one op indexed by (fmt, bf16?, swizzled?), named as generated from forms.py.
class Table {
 public:
  explicit Table(const std::string& op) {
    for (int f = 0; f < 3; ++f)
      for (int t = 0; t < 2; ++t)
        for (int s = 0; s < 2; ++s)
          refs_.emplace_back("fmt_" + std::string(fmt_name(Fmt(f))) + "_" + op,
                             "cake_fmt_" + std::string(fmt_name(Fmt(f))) + "_" + op + "_" + (t ? "bf16" : "f32") +
                                 "_" + (s ? "swizzled" : "linear"));
  }
  runtime::KernelRef& at(Fmt f, bool bf16, bool swizzled) { return refs_[int(f) * 4 + int(bf16) * 2 + int(swizzled)]; }

 private:
  std::vector<runtime::KernelRef> refs_;
};

// Chunk indices are 32-bit on the device; refuse larger tensors before any launch.
int64_t checked_chunks(int64_t rows, int64_t cols) {
  const int64_t chunks = rows * cols / kChunkElems;
  if (chunks >= kMaxChunks) throw ValueError("format kernels take tensors of fewer than 2^35 elements");
  return chunks;
}

unsigned blocks_for(int64_t items) {
  int64_t b = (items + kThreads - 1) / kThreads;
  if (b > int64_t(0x7FFFFFFF)) throw ValueError("tensor too large for the format kernels");
  return unsigned(b < 1 ? 1 : b);
}

}  // namespace

int64_t scale_bytes(Fmt fmt, int64_t rows, int64_t cols, bool swizzled) {
  const int64_t cols_sf = cols / block_size(fmt);
  return swizzled ? round_up(rows, 128) * round_up(cols_sf, 4) : rows * cols_sf;
}

void launch_quantize(Fmt fmt, bool in_bf16, bool swizzled, const QuantizeArgs& in_args, int device,
                     std::uintptr_t stream) {
  static Table table("quantize");
  const int64_t chunks = checked_chunks(in_args.rows, in_args.cols);
  // No elements: the scales have no bytes either (a swizzled layout pads rows and scale columns
  // of a non-empty tensor only), and a zero column count has no chunk divisor.
  if (chunks == 0) return;
  QuantizeArgs args = in_args;
  args.chunks_per_row = FastDivmod(uint32_t(args.cols / kChunkElems));
  const int unroll = quantize_unroll(in_bf16 ? 2 : 4);
  runtime::KernelRef& k = table.at(fmt, in_bf16, swizzled);
  runtime::ScopedDevice scope(device);
  runtime::LaunchConfig cfg;
  cfg.grid[0] = blocks_for((chunks + unroll - 1) / unroll);
  cfg.block[0] = kThreads;
  cfg.stream = stream;
  runtime::launch(k.get(device), cfg, &args, k.name());
}

namespace {
// A dequantize launch of `args` (at least one chunk): the kernel, its shape and its parameters.
struct DequantizeLaunch {
  runtime::KernelRef* kernel;
  runtime::LaunchConfig cfg;
  DequantizeArgs args;
};

DequantizeLaunch dequantize_launch(Fmt fmt, bool out_bf16, bool swizzled, const DequantizeArgs& args, int64_t chunks) {
  static Table table("dequantize");
  DequantizeLaunch l{&table.at(fmt, out_bf16, swizzled), {}, args};
  l.args.chunks_per_row = FastDivmod(uint32_t(args.cols / kChunkElems));
  l.cfg.grid[0] = blocks_for(chunks);
  l.cfg.block[0] = kThreads;
  return l;
}
}  // namespace

runtime::BoundKernel<DequantizeArgs> bind_dequantize(Fmt fmt, bool out_bf16, bool swizzled,
                                                     const DequantizeArgs& args, int device) {
  const int64_t chunks = checked_chunks(args.rows, args.cols);
  if (chunks == 0) throw ValueError("bind_dequantize: empty tensor");
  const DequantizeLaunch l = dequantize_launch(fmt, out_bf16, swizzled, args, chunks);
  runtime::ScopedDevice scope(device);
  runtime::BoundKernel<DequantizeArgs> b;
  *b.params = l.args;
  b.kernel = l.kernel->get(device);
  b.form = l.kernel->form();
  b.device = device;
  b.cfg = l.cfg;
  return b;
}

// The eager path: the parameters on the stack, nothing allocated per call.
void launch_dequantize(Fmt fmt, bool out_bf16, bool swizzled, const DequantizeArgs& args, int device,
                       std::uintptr_t stream) {
  const int64_t chunks = checked_chunks(args.rows, args.cols);
  if (chunks == 0) return;
  DequantizeLaunch l = dequantize_launch(fmt, out_bf16, swizzled, args, chunks);
  runtime::ScopedDevice scope(device);
  l.cfg.stream = stream;
  runtime::launch(l.kernel->get(device), l.cfg, &l.args, l.kernel->name());
}

}  // namespace cake_moe::formats
