// Kernel parameters of the sm_90a ragged BF16 grouped GEMM (family A: forward
// and input gradient). Plain data, usable from host C++ without nvcc; passed
// to the kernel by value as `const __grid_constant__ GroupedGemmParams`.
//
// Problem (torch._grouped_mm convention), with Kred the reduction length and
// Nout the output width:
//   fwd  : Y[g_e]  = X[g_e] @ W[e]^T   A = X [sum_m, K]   Kred = K, Nout = N
//   dgrad: dX[g_e] = G[g_e] @ W[e]     A = G [sum_m, N]   Kred = N, Nout = K
// w is [E, N, K] bf16 contiguous in both cases (read in place).
//
// Tensor maps (all bf16, CU_TENSOR_MAP_SWIZZLE_128B, OOB fill NONE = zeros,
// interleave NONE, element strides 1):
//   tmap_a: 2D dims {Kred, sum_m_capacity}, row stride Kred*2 bytes,
//           box {64, BM}.
//   tmap_b: 3D over w, dims {K, N, E}, strides {K*2, N*K*2} bytes;
//           box fwd {64, BN, 1} (64 along K, BN rows of W[e]);
//           box dgrad {64, 64, 1} (64 output columns along K, 64 rows along N).
//   tmap_d: 2D over the output, dims {Nout, sum_m_capacity}, row stride
//           Nout*2 bytes, box {64, 64}; used for TMA stores of tiles whose 64
//           rows all lie inside their group (other tiles use predicated
//           16-byte stores through `out`).
//   tmap_b_half: fwd split-tail forms only: tmap_b with box {64, BN/2, 1}
//           (a half tile's weight rows); unused (zero) otherwise.
// Kernel<...>::kBoxA_rows / kBoxB_inner / kBoxB_rows in
// sm90_bf16_grouped_gemm.cuh give the boxes per form.
//
// Host-side requirements (the kernel does not re-check them):
//   * Nout % 8 == 0 and Kred % 8 == 0 (16-byte TMA strides), Kred > 0;
//   * x/g, w, out 16-byte aligned, unit last-axis stride, contiguous rows;
//   * sum_m_capacity <= 2^31 - 256 (a group's rows rounded up to whole tiles in 32 bits)
//     and the number of tiles
//     (ceil(sum_m_capacity / BM) + E) * ceil(Nout / BN) < 2^31;
//   * offs int32 on the device, E entries of cumulative group ends
//     (offs_has_leading_zero = 0) or E+1 entries m_indptr (= 1). Values are
//     clamped to [0, sum_m_capacity] and a decreasing entry gives an empty
//     group, so malformed offsets cannot make the kernel access memory out of
//     bounds; they are still a caller error.
//   * launch: gridDim.x = min(#SMs, tile upper bound above) (any value >= 1
//     is correct: the kernel is persistent and strides over tiles),
//     blockDim.x = Kernel::kNumThreads, dynamic smem = Kernel::kSmemBytes
//     (after cudaFuncSetAttribute / cuFuncSetAttribute
//     MAX_DYNAMIC_SHARED_SIZE_BYTES).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace cake_moe {
namespace sm90 {

struct GroupedGemmParams {
  CUtensorMap tmap_a;  // activations A (X or G), see above
  CUtensorMap tmap_b;  // weights w [E, N, K] as a 3D map
  CUtensorMap tmap_d;  // output (Y or dX), TMA-store map
  CUtensorMap tmap_b_half;  // fwd split tail: half tiles' weight rows (see above)
  void* out;           // output base, bf16 [sum_m_capacity, Nout] row-major
  const int32_t* offs;  // group offsets on the device
  int32_t num_groups;   // E
  int32_t sum_m_capacity;  // rows of the packed A / output tensors
  int32_t n_out;           // Nout: output width (N for fwd, K for dgrad)
  int32_t k_red;           // Kred: reduction length (K for fwd, N for dgrad)
  int32_t offs_has_leading_zero;  // 0: offs[E] cumulative ends; 1: offs[E+1] m_indptr
  int32_t split_tail;             // split-tail forms: 1 runs a short last wave as N halves
  int32_t reserved_[2];
};

static_assert(alignof(CUtensorMap) >= 64, "CUtensorMap must be at least 64-byte aligned (128 in CUDA 13 headers)");
static_assert(offsetof(GroupedGemmParams, tmap_a) % 64 == 0 && offsetof(GroupedGemmParams, tmap_b) % 64 == 0 &&
                  offsetof(GroupedGemmParams, tmap_d) % 64 == 0 && offsetof(GroupedGemmParams, tmap_b_half) % 64 == 0,
              "tensor maps must stay 64-byte aligned inside the parameter block");
static_assert(sizeof(GroupedGemmParams) <= 4096, "kernel parameters are limited to 4 KB");

}  // namespace sm90
}  // namespace cake_moe
