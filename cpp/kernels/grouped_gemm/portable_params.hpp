// Kernel parameters of the portable ragged BF16 grouped GEMM (family A: forward,
// input gradient, weight gradient). Plain data, usable from host C++ without
// nvcc; passed to every entry by value as
// `const __grid_constant__ PortableGroupedGemmParams`.
//
// The portable form serves the arches that have no native grouped GEMM (today
// sm_100a / sm_103a / sm_107a). It uses only sm_80+ instructions (mma.sync
// m16n8k16 bf16, ldmatrix, 16-byte cp.async), so the same source is built for
// sm_90a too and validated on an H200. Kernels: portable_bf16_grouped_gemm.cuh;
// entries: instantiate_portable_example.cu.
//
// Problem (torch._grouped_mm convention), group e = rows [begin_e, end_e):
//   fwd  : Y[g_e]  = X[g_e] @ W[e]^T    reads x, w; out = Y  [sum_m, N] bf16
//   dgrad: dX[g_e] = G[g_e] @ W[e]      reads g, w; out = dX [sum_m, K] bf16
//   wgrad: dW[e]   = G[g_e]^T @ X[g_e]  reads g, x; out = dW [E, N, K] bf16 or fp32
// x [sum_m, K], g [sum_m, N], w [E, N, K]: bf16, row-major, each row contiguous; rows (and w's
// experts) start the element strides below apart (0: packed).
// FP32 accumulation of the exact BF16 products, one rounding at the store.
//
// Offsets: `offs` int32 on the device, either E cumulative group ends
// (offs_has_leading_zero = 0: begin_e = offs[e-1] (0 for e = 0), end_e = offs[e])
// or E+1 entries m_indptr (= 1: begin_e = offs[e], end_e = offs[e+1]). The
// kernels read them only on the device. Each bound is clamped into [0, sum_m]
// and end_e < begin_e gives an empty group, so malformed offsets can never make
// a kernel access memory outside the tensors (they are still a caller error:
// overlapping groups of non-monotonic offsets are written in an unspecified
// order by fwd/dgrad).
//
// Results:
//   fwd/dgrad write exactly the rows of the groups (and columns [0, Nout));
//     every other row of Y / dX (for example rows past the last group end) is
//     left untouched.
//   wgrad writes all of dW [E, N, K]; an empty group gives exact (+0) zeros.
//     Deterministic: one CTA owns each 128 x 128 output tile and reduces the
//     group's rows in increasing order (32 rows per step, one fixed mma
//     sequence), so dW is bitwise repeatable for any grid size.
//   fwd/dgrad are deterministic too (one CTA per output tile, fixed k order).
//
// Host-side requirements (the kernels do not re-check them):
//   * n % 8 == 0, k % 8 == 0, n >= 0, k >= 0 (16-byte vectors along both);
//     n == 0 or k == 0 is allowed (fwd/dgrad then write zeros or nothing,
//     wgrad zeros or nothing);
//   * x, g, w, out 16-byte aligned; offs 4-byte aligned and readable for
//     E (+1) entries; pointers of unused operands may be null;
//   * 0 <= sum_m, N, K <= 2^31 - 256 (32-bit row/column indices with tile
//     headroom), num_groups >= 0;
//   * fwd/dgrad tile count (ceil(sum_m / 128) + E) * ceil(Nout / 128) < 2^31
//     (Nout = N for fwd, K for dgrad); wgrad E * ceil(N / 128) * ceil(K / 128)
//     < 2^31. Element offsets are computed in 64 bits, so tensors larger than
//     2^31 elements are fine.
//   * outputs must not overlap inputs.
//
// Launch (every entry; the kernels are persistent and stride over tiles, so
// any grid >= 1 is correct):
//   gridDim  = (num_ctas, 1, 1), e.g. min(2 * #SMs, tile upper bound above);
//              2 CTAs fit per SM on sm_90 / sm_100 (registers and smem);
//   blockDim = (PortableGroupedGemmConfig::kThreads, 1, 1) = 256;
//   dynamic shared memory = PortableGroupedGemmConfig::kSmemBytes (69,760 B):
//              above 48 KB, so first set the function attribute
//              MAX_DYNAMIC_SHARED_SIZE_BYTES to it (cuFuncSetAttribute /
//              cudaFuncSetAttribute).
//   No workspace, no host synchronisation; CUDA-graph capturable.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cake_moe {
namespace portable {

struct PortableGroupedGemmParams {
  const void* x;        // X [sum_m, K] bf16 (fwd, wgrad); unused by dgrad
  const void* g;        // G [sum_m, N] bf16 (dgrad, wgrad); unused by fwd
  const void* w;        // W [E, N, K] bf16 (fwd, dgrad); unused by wgrad
  void* out;            // Y [sum_m, N] / dX [sum_m, K] bf16, dW [E, N, K] bf16 or fp32
  const int32_t* offs;  // group offsets on the device (see above)
  int32_t num_groups;   // E
  int32_t sum_m;        // rows of x / g / Y / dX (the clamp bound of offs)
  int32_t n;            // N
  int32_t k;            // K
  int32_t offs_has_leading_zero;  // 0: offs[E] cumulative ends; 1: offs[E+1] m_indptr
  int32_t reserved_;              // zero
  int64_t x_row_stride;           // elements between rows of x (0: K)
  int64_t g_row_stride;           // elements between rows of g (0: N)
  int64_t w_row_stride;           // elements between rows of w[e] (0: K)
  int64_t w_expert_stride;        // elements between w[e] and w[e + 1] (0: N * K)
};

static_assert(sizeof(PortableGroupedGemmParams) == 96, "parameter block layout is part of the ABI");
static_assert(offsetof(PortableGroupedGemmParams, num_groups) == 40, "parameter block layout is part of the ABI");

// Tiling of the shipped portable forms (the kernels static_assert against it).
struct PortableGroupedGemmConfig {
  static constexpr int kBlockM = 128;  // output tile rows
  static constexpr int kBlockN = 128;  // output tile columns
  static constexpr int kBlockK = 32;   // reduction step per pipeline stage
  static constexpr int kStages = 4;    // cp.async pipeline depth
  static constexpr int kThreads = 256;  // 8 warps: 2 (M) x 4 (N), 64 x 32 each
  static constexpr int kMinBlocksPerSM = 2;
  static constexpr int kTableSize = 1024;  // scheduler prefix-table slots (fwd/dgrad)
  static constexpr uint32_t kStageBytes = (kBlockM + kBlockN) * kBlockK * 2;
  static constexpr uint32_t kTableBytes = (kTableSize + 32) * 4;
  static constexpr uint32_t kSmemBytes = kStages * kStageBytes + kTableBytes;  // 69,760
};

static_assert(PortableGroupedGemmConfig::kSmemBytes == 69760, "documented above");

}  // namespace portable
}  // namespace cake_moe
