// How the sm_90a grouped GEMM forms are instantiated: one extern "C" entry per
// (op, tile, stages); the runtime finds them by name in the fatbin. Build one
// translation unit per form or per small family, e.g.
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I cpp/kernels \
//        -fatbin cpp/kernels/grouped_gemm/instantiate_example.cu -o gg_sm90.fatbin
// Launch: gridDim.x = min(#SMs, tile upper bound), blockDim.x = kNumThreads
// (384), dynamic smem = kSmemBytes (raise the function's dynamic-smem limit
// first). Tensor-map boxes per form: kBoxA*/kBoxB*/kBoxD* (see params.cuh).
//
// Names: cake_gg_sm90_<op>_<BM>x<BN>x<BK>_s<stages>.
#include "grouped_gemm/sm90_bf16_grouped_gemm.cuh"

namespace {
using cake_moe::sm90::GroupedGemmKernel;
using cake_moe::sm90::GroupedGemmOp;
using cake_moe::sm90::GroupedGemmParams;

// big groups: 128 x 128 tile, two consumer warpgroups of m64 x n128, 5 stages
using FwdL = GroupedGemmKernel<GroupedGemmOp::kFwd, 128, 128, 5>;
using DgradL = GroupedGemmKernel<GroupedGemmOp::kDgrad, 128, 128, 5>;
// big groups, wide: 128 x 256 tile, two consumer warpgroups of m64 x n256, 3 stages
using FwdW = GroupedGemmKernel<GroupedGemmOp::kFwd, 128, 256, 3>;
using DgradW = GroupedGemmKernel<GroupedGemmOp::kDgrad, 128, 256, 3>;
// small groups: 64 x 128 tile, the two consumer warpgroups split N (m64 x n64 each), 8 stages
using FwdS = GroupedGemmKernel<GroupedGemmOp::kFwd, 64, 128, 8>;
using DgradS = GroupedGemmKernel<GroupedGemmOp::kDgrad, 64, 128, 8>;
}  // namespace

extern "C" __global__ void __launch_bounds__(FwdL::kNumThreads, 1)
    cake_gg_sm90_fwd_128x128x64_s5(const __grid_constant__ GroupedGemmParams p) {
  FwdL::run(p);
}

extern "C" __global__ void __launch_bounds__(DgradL::kNumThreads, 1)
    cake_gg_sm90_dgrad_128x128x64_s5(const __grid_constant__ GroupedGemmParams p) {
  DgradL::run(p);
}

extern "C" __global__ void __launch_bounds__(FwdW::kNumThreads, 1)
    cake_gg_sm90_fwd_128x256x64_s3(const __grid_constant__ GroupedGemmParams p) {
  FwdW::run(p);
}

extern "C" __global__ void __launch_bounds__(DgradW::kNumThreads, 1)
    cake_gg_sm90_dgrad_128x256x64_s3(const __grid_constant__ GroupedGemmParams p) {
  DgradW::run(p);
}

extern "C" __global__ void __launch_bounds__(FwdS::kNumThreads, 1)
    cake_gg_sm90_fwd_64x128x64_s8(const __grid_constant__ GroupedGemmParams p) {
  FwdS::run(p);
}

extern "C" __global__ void __launch_bounds__(DgradS::kNumThreads, 1)
    cake_gg_sm90_dgrad_64x128x64_s8(const __grid_constant__ GroupedGemmParams p) {
  DgradS::run(p);
}
