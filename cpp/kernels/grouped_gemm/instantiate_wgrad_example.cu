// How the sm_90a grouped GEMM weight-gradient forms are instantiated: one
// extern "C" entry per (reduction, tile, output dtype); the runtime finds them
// by name in the fatbin. Build one translation unit per form or small family:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I cpp/kernels \
//        -fatbin cpp/kernels/grouped_gemm/instantiate_wgrad_example.cu -o ggw_sm90.fatbin
// Launch: gridDim.x = #SMs (any value >= 1 is correct), blockDim.x = kNumThreads
// (384), dynamic smem = kSmemBytes (raise the function's dynamic-smem limit
// first). Tensor maps, workspace (size, zero-once rule) and num_workers:
// wgrad_params.cuh.
//
// Names: cake_gg_sm90_wgrad_<det|fast>_<BM>x<BN>_<bf16|f32>.
//   det : split tiles reduced in chunk order through the FP32 workspace
//         (bitwise deterministic, the default variant);
//   fast: split tiles added with FP32 red.global.add (last bits vary run to run).
// Both: 128 x 256 tiles (two m64 x n256 consumer warpgroups), 4 stages of 64 token rows.
#include "grouped_gemm/sm90_bf16_grouped_gemm_wgrad.cuh"

namespace cake_moe {
namespace sm90 {
namespace wgrad_forms {
using DetBf16 = GroupedGemmWgradKernel<256, 4, WgradReduce::kDet, __nv_bfloat16>;
using DetF32 = GroupedGemmWgradKernel<256, 4, WgradReduce::kDet, float>;
using FastBf16 = GroupedGemmWgradKernel<256, 4, WgradReduce::kFast, __nv_bfloat16>;
using FastF32 = GroupedGemmWgradKernel<256, 4, WgradReduce::kFast, float>;
}  // namespace wgrad_forms
}  // namespace sm90
}  // namespace cake_moe

#ifndef CAKE_GGW_DECLARE_ONLY
CAKE_GGW_SM90_DEFINE_KERNEL(cake_gg_sm90_wgrad_det_128x256_bf16, ::cake_moe::sm90::wgrad_forms::DetBf16)
CAKE_GGW_SM90_DEFINE_KERNEL(cake_gg_sm90_wgrad_det_128x256_f32, ::cake_moe::sm90::wgrad_forms::DetF32)
CAKE_GGW_SM90_DEFINE_KERNEL(cake_gg_sm90_wgrad_fast_128x256_bf16, ::cake_moe::sm90::wgrad_forms::FastBf16)
CAKE_GGW_SM90_DEFINE_KERNEL(cake_gg_sm90_wgrad_fast_128x256_f32, ::cake_moe::sm90::wgrad_forms::FastF32)
#endif
