#include "host/grouped_gemm/sm90_bf16_grouped_gemm_wgrad.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "grouped_gemm/sm90_geometry.hpp"
#include "grouped_gemm/wgrad_params.cuh"
#include "host/grouped_gemm/bound_kernel.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/images.hpp"
#include "runtime/launch.hpp"
#include "runtime/tensor_map.hpp"

namespace cake_moe::grouped_gemm {
namespace {

using sm90::GroupedGemmWgradGeometry;
using Geo = GroupedGemmWgradGeometry;

class Sm90WgradLaunch final : public BoundKernel<sm90::GroupedGemmWgradParams> {
 public:
  Sm90WgradLaunch(const Problem& p, bool pair) {
    bound_.device = p.device;
    runtime::ScopedDevice scope(p.device);  // tensor-map encoding needs a current context
    bound_.form = sm90_wgrad_form(p.variant, pair);
    const std::string kernel = "cake_" + bound_.form + "_128x256_" + (p.out_f32 ? "f32" : "bf16");
    const int sms = runtime::device_sm_count(p.device);
    std::memset(bound_.params.get(), 0, sizeof(sm90::GroupedGemmWgradParams));
    sm90::GroupedGemmWgradParams& q = *bound_.params;
    q.tmap_g = runtime::encode_bf16_rows(p.a, p.n, p.rows, 64, p.a_row_stride);
    q.tmap_x = runtime::encode_bf16_rows(p.b, p.k, p.rows, 64, p.b_row_stride);
    q.workspace = p.workspace;
    q.workspace_bytes = uint64_t(p.workspace_bytes);
    q.offs = p.offs;
    q.num_groups = p.num_groups;
    q.sum_m_capacity = int32_t(p.rows);
    q.n = p.n;
    q.k = p.k;
    bf16_out_ = !p.out_f32 && p.num_groups > 0;
    point_at(p.out);
    q.offs_has_leading_zero = p.offs_leading_zero ? 1 : 0;
    q.num_workers = sms;  // fixes the split granularity: det bits depend on it, not on timing
    q.ws_slots = p.workspace && !pair ? sm90::grouped_gemm_wgrad_slots_that_fit(Geo::kBM, Geo::kBN, q.workspace_bytes)
                                      : 0;
    bound_.kernel = runtime::get_kernel(bound_.form, kernel.c_str(), p.device);
    const uint32_t smem = Geo::smem_bytes(p.out_f32);
    runtime::set_max_dynamic_smem(bound_.kernel, p.device, smem);
    const int64_t tiles =
        int64_t(p.num_groups) * ((p.n + Geo::kBM - 1) / Geo::kBM) * ((p.k + Geo::kBN - 1) / Geo::kBN);
    bound_.cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(sms, tiles + 8 * int64_t(sms))));
    bound_.cfg.block[0] = Geo::kThreads;
    bound_.cfg.smem_bytes = smem;
    if (pair) {
      // as many pairs as can be resident at once (an H200 holds 66 pairs on 132 SMs only if every
      // GPC's SM count is even): a pair launched past them would start its statically assigned
      // units only when a whole earlier pair exits. CTAs past the last unit only sync and exit.
      bound_.cfg.cluster[0] = 2;
      bound_.cfg.cluster[1] = 1;
      bound_.cfg.cluster[2] = 1;
      const int pairs = std::min(sms / 2, runtime::max_active_clusters(bound_.kernel, p.device, bound_.cfg));
      if (pairs < 1) throw CudaError("the cluster-pair wgrad form cannot be resident on this device");
      bound_.cfg.grid[0] = unsigned(2 * pairs);
    }
  }

  void set_output(void* out) override {
    if (bound_.params->out == out) return;
    runtime::ScopedDevice scope(bound_.device);
    point_at(out);
  }

 private:
  bool bf16_out_ = false;  // stored by TMA through tmap_out
  // dW [E, N, K]: a store box past N or K of one expert is clipped, never written into the next
  // (the map first: if its encoding throws, the launch still points at the old output whole)
  void point_at(void* out) {
    sm90::GroupedGemmWgradParams& q = *bound_.params;
    if (bf16_out_) q.tmap_out = runtime::encode_bf16_experts(out, q.num_groups, q.n, q.k, 64);
    q.out = out;
  }
};

}  // namespace

std::string sm90_wgrad_form(Variant variant, bool pair) {
  return std::string("gg_sm90_wgrad_") + variant_name(variant) + (pair ? "_c2" : "");
}

int64_t sm90_wgrad_workspace_bytes(int device) {
  const int slots = sm90::grouped_gemm_wgrad_default_slots(runtime::device_sm_count(device));
  return int64_t(sm90::grouped_gemm_wgrad_workspace_bytes(Geo::kBM, Geo::kBN, slots));
}

std::unique_ptr<Launch> make_sm90_wgrad_launch(const Problem& p, bool pair) {
  if (p.op != Op::kWgrad) throw NotImplemented("the sm_90a wgrad launcher only runs wgrad");
  if (pair && p.out_f32) throw ValueError("the cluster-pair wgrad forms write bf16 only");
  return std::make_unique<Sm90WgradLaunch>(p, pair);
}

}  // namespace cake_moe::grouped_gemm
