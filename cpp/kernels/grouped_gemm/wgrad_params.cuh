// Kernel parameters of the sm_90a ragged BF16 grouped GEMM weight gradient
// (family A, wgrad). Plain data, usable from host C++ without nvcc; passed to
// the kernel by value as `const __grid_constant__ GroupedGemmWgradParams`.
//
// Problem: for every group e with rows [b_e, en_e) of the packed tensors
//   dW[e] = G[b_e:en_e]^T @ X[b_e:en_e]          dW [E, N, K], row-major
// G [sum_m_capacity, N] bf16, X [sum_m_capacity, K] bf16 (unit last-axis
// stride, contiguous rows). The ragged dimension (tokens) is the reduction.
// FP32 accumulation, one rounding at the end; out dtype (bf16 or f32) is a
// property of the kernel form. Empty groups give exact (+0) zeros.
//
// Tensor maps (bf16, CU_TENSOR_MAP_SWIZZLE_128B, OOB fill NONE = zeros,
// interleave NONE, element strides 1):
//   tmap_g: 2D over G, dims {N, sum_m_capacity}, row stride N*2 bytes,
//           box {64, 64} (64 columns of G along N x 64 token rows).
//   tmap_x: 2D over X, dims {K, sum_m_capacity}, row stride K*2 bytes,
//           box {64, 64} (64 columns of X along K x 64 token rows).
//   tmap_out (bf16 output forms): 3D over dW, dims {K, N, E}, strides K*2 and
//           N*K*2 bytes, box {64, 64, 1}: the epilogue's TMA stores (clipped at
//           N and K by the hardware). E == 0: leave it zero (nothing is stored).
//   sum_m_capacity == 0: encode both operand maps over any valid 16-B aligned
//   buffer with 1 row (dims must be >= 1); nothing is read, dW is zero filled.
//   (Kernel::kBoxInner / kBoxRows in sm90_bf16_grouped_gemm_wgrad.cuh.) A box
//   may start at any token row; rows past the group end that a box brings in
//   are zeroed in shared memory by the kernel, rows past sum_m_capacity and
//   columns past N / K are zero filled by the TMA unit. The f32 forms write dW
//   with predicated 16-byte stores, never outside [E, N, K].
//
// Workspace (one per device and stream; never shared by two launches that can
// run at the same time):
//   bytes = grouped_gemm_wgrad_workspace_bytes(BM, BN, ws_slots)
//         = 256 (control words) + roundup(8 * ws_slots, 256) (per-slot flags)
//           + ws_slots * BM * BN * 4 (FP32 partial tiles of split tiles).
//   It must be ZEROED ONCE when it is allocated; every launch leaves ALL of it
//   zero again before it exits (control words, flags and the FP32 tiles: the
//   last chunk of a split tile clears its tile), so replays need no host work
//   and no memset launch, and any wgrad form / slot count may reuse the same
//   zeroed bytes. A launch that faults leaves it undefined: re-zero it.
//   ws_slots bounds the number of split output tiles; the kernel coarsens its
//   token split so that it never needs more (ws_slots = 0: no split at all).
//   Recommended: ws_slots = grouped_gemm_wgrad_default_slots(#SMs) = 4 * #SMs
//   (69 MB for 128 x 256 tiles on 132 SMs); smaller works, only less balanced.
//   workspace == nullptr is allowed: then tiles are statically strided over
//   the grid, nothing is split (ws_slots ignored) and nothing is written but dW.
//
// Determinism: the decomposition (which tokens form which chunk of which
// tile) depends only on offs, N, K, num_workers and ws_slots -- not on the grid
// size, timing or stream; det reduces chunks of a split tile in chunk order, so
// its bits are a function of the inputs and those two integers. Hosts pass
// num_workers = #SMs of the device (it sets the split granularity only).
//
// Host-side requirements (the kernel does not re-check them):
//   * N % 8 == 0 and K % 8 == 0 (16-byte TMA strides), N > 0, K > 0;
//   * G, X 16-byte aligned, dW 16-byte aligned, workspace 256-byte aligned;
//   * sum_m_capacity <= 2^31 - 256 (rows rounded up to k-blocks in 32 bits); E * ceil(N/BM) * ceil(K/BN) + 8 * num_workers
//     + ws_slots < 2^31 (work units); dW offsets are 64-bit (no E*N*K limit);
//   * offs int32 on the device, E entries of cumulative group ends
//     (offs_has_leading_zero = 0) or E+1 entries m_indptr (= 1). Values are
//     clamped to [0, sum_m_capacity], a decreasing entry gives an empty group.
//   * launch: gridDim.x = min(#SMs, E * ceil(N/BM) * ceil(K/BN) + ...) -- any
//     value >= 1 is correct (persistent CTAs take work units from a counter
//     in the workspace, or stride statically without one); blockDim.x =
//     Kernel::kNumThreads (384); dynamic smem = Kernel::kSmemBytes (after
//     raising MAX_DYNAMIC_SHARED_SIZE_BYTES). E == 0 is a no-op launch.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

// host + device under nvcc, plain constexpr in host-only C++
#if defined(__CUDACC__)
#define CAKE_GGW_HD __host__ __device__
#else
#define CAKE_GGW_HD
#endif

namespace cake_moe {
namespace sm90 {

struct GroupedGemmWgradParams {
  CUtensorMap tmap_g;     // G [cap, N], see above
  CUtensorMap tmap_x;     // X [cap, K]
  CUtensorMap tmap_out;   // dW [E, N, K] (bf16 forms; unused by the f32 forms), see above
  void* out;              // dW [E, N, K], bf16 or f32 (form)
  void* workspace;        // see above; may be nullptr
  const int32_t* offs;    // group offsets on the device
  uint64_t workspace_bytes;  // size of `workspace` (the kernel uses at most what fits)
  int32_t num_groups;        // E
  int32_t sum_m_capacity;    // rows of G and X
  int32_t n;                 // N: rows of each dW[e] (columns of G)
  int32_t k;                 // K: columns of each dW[e] (columns of X)
  int32_t offs_has_leading_zero;  // 0: offs[E] cumulative ends; 1: offs[E+1] m_indptr
  int32_t num_workers;       // split granularity: #SMs (<= 0: gridDim.x)
  int32_t ws_slots;          // split-tile buffers the workspace was sized for
  int32_t reserved_;
};

static_assert(alignof(CUtensorMap) >= 64, "CUtensorMap must be at least 64-byte aligned");
static_assert(offsetof(GroupedGemmWgradParams, tmap_g) % 64 == 0 &&
                  offsetof(GroupedGemmWgradParams, tmap_x) % 64 == 0 &&
                  offsetof(GroupedGemmWgradParams, tmap_out) % 64 == 0,
              "tensor maps must stay 64-byte aligned inside the parameter block");
static_assert(sizeof(GroupedGemmWgradParams) <= 4096, "kernel parameters are limited to 4 KB");

// ---- workspace layout (host and device) ----------------------------------------
constexpr uint64_t kWgradWsControlBytes = 256;  // [0]: unit counter, [1]: finished-CTA counter
CAKE_GGW_HD constexpr uint64_t grouped_gemm_wgrad_ws_flags_bytes(int slots) {
  return ((static_cast<uint64_t>(slots > 0 ? slots : 0) * 8u + 255u) / 256u) * 256u;  // 2 x u32 per slot
}
CAKE_GGW_HD constexpr uint64_t grouped_gemm_wgrad_ws_tile_bytes(int bm, int bn) { return static_cast<uint64_t>(bm) * bn * 4u; }
// Workspace bytes for `slots` split-tile buffers of a BM x BN form.
CAKE_GGW_HD constexpr uint64_t grouped_gemm_wgrad_workspace_bytes(int bm, int bn, int slots) {
  return kWgradWsControlBytes + grouped_gemm_wgrad_ws_flags_bytes(slots) +
         static_cast<uint64_t>(slots > 0 ? slots : 0) * grouped_gemm_wgrad_ws_tile_bytes(bm, bn);
}
// Largest slot count that fits in `bytes` (what the kernel uses when ws_slots asks for more).
CAKE_GGW_HD constexpr int grouped_gemm_wgrad_slots_that_fit(int bm, int bn, uint64_t bytes) {
  const uint64_t tile = grouped_gemm_wgrad_ws_tile_bytes(bm, bn);
  if (bytes < kWgradWsControlBytes + 256u + tile) return 0;
  // flags take <= 8 bytes per slot plus padding <= 256: solve conservatively
  const uint64_t avail = bytes - kWgradWsControlBytes - 256u;
  const uint64_t s = avail / (tile + 8u);
  return s > 0x3fffffffu ? 0x3fffffff : static_cast<int>(s);
}
CAKE_GGW_HD constexpr int grouped_gemm_wgrad_default_slots(int num_sms) { return 4 * (num_sms > 0 ? num_sms : 1); }

}  // namespace sm90
}  // namespace cake_moe
