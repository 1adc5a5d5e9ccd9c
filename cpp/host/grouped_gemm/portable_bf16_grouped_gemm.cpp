#include "host/grouped_gemm/portable_bf16_grouped_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "grouped_gemm/portable_params.hpp"
#include "host/grouped_gemm/bound_kernel.hpp"
#include "runtime/driver.hpp"
#include "runtime/images.hpp"
#include "runtime/launch.hpp"

namespace cake_moe::grouped_gemm {
namespace {

using portable::PortableGroupedGemmConfig;
using portable::PortableGroupedGemmParams;

class PortableLaunch final : public BoundKernel<PortableGroupedGemmParams> {
 public:
  explicit PortableLaunch(const Problem& p) {
    bound_.device = p.device;
    PortableGroupedGemmParams& params = *bound_.params;
    std::memset(&params, 0, sizeof(params));
    std::string kernel = "cake_gg_portable_";
    switch (p.op) {
      case Op::kFwd:
        params.x = p.a;
        params.w = p.b;
        params.x_row_stride = p.a_row_stride;
        kernel += "fwd";
        break;
      case Op::kDgrad:
        params.g = p.a;
        params.w = p.b;
        params.g_row_stride = p.a_row_stride;
        kernel += "dgrad";
        break;
      case Op::kWgrad:
        params.g = p.a;
        params.x = p.b;
        params.g_row_stride = p.a_row_stride;
        params.x_row_stride = p.b_row_stride;
        kernel += p.out_f32 ? "wgrad_f32" : "wgrad_bf16";
        break;
    }
    if (p.op != Op::kWgrad) {
      params.w_row_stride = p.b_row_stride;
      params.w_expert_stride = p.b_expert_stride;
    }
    bound_.form = std::string("gg_portable_") + op_name(p.op);
    params.out = p.out;
    params.offs = p.offs;
    params.num_groups = p.num_groups;
    params.sum_m = int32_t(p.rows);
    params.n = p.n;
    params.k = p.k;
    params.offs_has_leading_zero = p.offs_leading_zero ? 1 : 0;

    runtime::ScopedDevice scope(p.device);
    bound_.kernel = runtime::get_kernel(bound_.form, kernel.c_str(), p.device);
    runtime::set_max_dynamic_smem(bound_.kernel, p.device, PortableGroupedGemmConfig::kSmemBytes);
    const int64_t bm = PortableGroupedGemmConfig::kBlockM, bn = PortableGroupedGemmConfig::kBlockN;
    int64_t tiles;
    if (p.op == Op::kWgrad) {
      tiles = int64_t(p.num_groups) * ((p.n + bm - 1) / bm) * ((p.k + bn - 1) / bn);
    } else {
      const int64_t n_out = p.op == Op::kFwd ? p.n : p.k;
      tiles = ((p.rows + bm - 1) / bm + p.num_groups) * ((n_out + bn - 1) / bn);
    }
    const int64_t ctas = int64_t(PortableGroupedGemmConfig::kMinBlocksPerSM) * runtime::device_sm_count(p.device);
    bound_.cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min(ctas, tiles)));
    bound_.cfg.block[0] = PortableGroupedGemmConfig::kThreads;
    bound_.cfg.smem_bytes = PortableGroupedGemmConfig::kSmemBytes;
  }

  void set_output(void* out) override { bound_.params->out = out; }
};

}  // namespace

std::unique_ptr<Launch> make_portable_launch(const Problem& p) { return std::make_unique<PortableLaunch>(p); }

}  // namespace cake_moe::grouped_gemm
