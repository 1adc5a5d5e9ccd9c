// Entries of the portable ragged BF16 grouped GEMM (family A), one extern "C"
// name per op; the runtime finds them by name in the fatbin. The same source is
// built for every arch (sm_80+ instructions only), e.g.
//   nvcc -std=c++17 -O3 -I cpp/kernels
//        -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100a,code=sm_100a
//        -gencode arch=compute_103a,code=sm_103a -gencode arch=compute_107a,code=sm_107a
//        -fatbin cpp/kernels/grouped_gemm/instantiate_portable_example.cu -o gg_portable.fatbin
// (sm_107a needs nvcc >= 13.5.)
//
// Launch (all four): gridDim.x = any value >= 1 (persistent; e.g. 2 * #SMs),
// blockDim.x = PortableGroupedGemmConfig::kThreads (256), dynamic smem =
// PortableGroupedGemmConfig::kSmemBytes (69,760 B; raise the function's
// MAX_DYNAMIC_SHARED_SIZE_BYTES first). Parameters: portable_params.hpp.
//
// Names: cake_gg_portable_<op>, tile 128 x 128 x 32, 4 stages, 256 threads.
#include "grouped_gemm/portable_bf16_grouped_gemm.cuh"

namespace {
using cake_moe::portable::PortableGroupedGemmConfig;
using cake_moe::portable::PortableGroupedGemmParams;
constexpr int kThreads = PortableGroupedGemmConfig::kThreads;
constexpr int kMinBlocks = PortableGroupedGemmConfig::kMinBlocksPerSM;
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    cake_gg_portable_fwd(const __grid_constant__ PortableGroupedGemmParams p) {
  cake_moe::portable::portable_grouped_gemm_fwd(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    cake_gg_portable_dgrad(const __grid_constant__ PortableGroupedGemmParams p) {
  cake_moe::portable::portable_grouped_gemm_dgrad(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    cake_gg_portable_wgrad_bf16(const __grid_constant__ PortableGroupedGemmParams p) {
  cake_moe::portable::portable_grouped_gemm_wgrad_bf16(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    cake_gg_portable_wgrad_f32(const __grid_constant__ PortableGroupedGemmParams p) {
  cake_moe::portable::portable_grouped_gemm_wgrad_f32(p);
}
