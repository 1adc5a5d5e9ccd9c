// Portable ragged BF16 grouped GEMM (family A): forward, input gradient and
// weight gradient, for the arches without a native form (sm_100a / sm_103a /
// sm_107a today; also built for sm_90a, where it is validated).
//
// Only sm_80+ instructions: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
// ldmatrix(.trans) and 16-byte cp.async (zero-filling when predicated off).
// No TMA, wgmma or tcgen05.
//
//   fwd  : Y[g_e]  = X[g_e] @ W[e]^T   A = X  (K-major),    B = W[e] [N, K] (K-major)
//   dgrad: dX[g_e] = G[g_e] @ W[e]     A = G  (K-major),    B = W[e] [N, K] read in place
//                                      (reduction-major: N rows, output K contiguous)
//   wgrad: dW[e]   = G[g_e]^T @ X[g_e] A = G^T (G [m, n] is reduction-major),
//                                      B = X  (X [m, k] is reduction-major)
//
// Structure: 256 threads (8 warps, 2 along M x 4 along N, each a 64 x 32 warp
// tile of 4 x 4 m16n8 accumulators), CTA tile 128 x 128, reduction steps of 32
// through a 4-stage cp.async ring (one __syncthreads per step). Operands are
// kept in shared memory in their global orientation:
//   K-major tile  [128 rows][32 k]  64-B rows, 16-B chunk c stored at c ^ ((row >> 1) & 3)
//   MN-major tile [32 k][128 cols]  256-B rows, 16-B chunk c stored at c ^ (k & 7)
// Both swizzles make every 8-address phase of ldmatrix hit 8 distinct 16-B bank
// groups; MN-major operands are read with ldmatrix.trans.
// Loads are predicated per 16-byte chunk (rows outside the group / past N or
// K, reduction tails): a predicated-off chunk is zero-filled and not read.
// Epilogue: each thread rounds its accumulators (bf16x2 or float2) and stores
// them straight to global memory, predicated on the group's rows and [0, Nout).
//
// Scheduling: persistent; CTA b visits tiles b, b + gridDim.x, ...
//   fwd/dgrad: ragged tile space (sum over groups of ceil(m_e/128) x
//     ceil(Nout/128)); every CTA builds the inclusive prefix sum of the
//     per-group tile counts in shared memory from the device offsets (no host
//     sync, no preparation launch) and maps a tile index to its group by
//     binary search (RaggedTileScheduler, scheduler.cuh).
//   wgrad: E x ceil(N/128) x ceil(K/128) tiles (empty groups included, they
//     store zeros); each tile reduces its group's rows in order.
//
// Parameters and launch rules: portable_params.hpp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx/sm80.cuh"
#include "grouped_gemm/group_rows.cuh"
#include "grouped_gemm/portable_params.hpp"
#include "grouped_gemm/scheduler.cuh"

namespace cake_moe {
namespace portable {

enum class PortableOp : int { kFwd = 0, kDgrad = 1, kWgrad = 2 };

namespace detail {

// ---- PTX wrappers (sm_80+): common/ptx/sm80.cuh ------------------------------------
using ptx::cp_async_16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::ldmatrix_x4_trans;
using ptx::mma_bf16_16816;
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return ptx::smem_addr(p); }

}  // namespace detail

// ---- the GEMM ------------------------------------------------------------------------
// kOp selects the operand orientation and the scheduling; OutT is __nv_bfloat16
// (all ops) or float (wgrad only).
template <PortableOp kOp, typename OutT>
struct PortableGroupedGemm {
  using Cfg = PortableGroupedGemmConfig;
  using bf16 = __nv_bfloat16;
  static constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4, kThreads = 256, kTableSize = 1024;
  static_assert(kBM == Cfg::kBlockM && kBN == Cfg::kBlockN && kBK == Cfg::kBlockK && kStages == Cfg::kStages &&
                    kThreads == Cfg::kThreads && kTableSize == Cfg::kTableSize,
                "kernel tiling must match PortableGroupedGemmConfig (host launch constants)");
  static_assert(kOp == PortableOp::kWgrad || std::is_same<OutT, bf16>::value, "fwd/dgrad write bf16");
  static_assert(std::is_same<OutT, bf16>::value || std::is_same<OutT, float>::value, "bf16 or fp32 output");

  // operand orientation in global memory (and shared memory)
  static constexpr bool kAKMajor = kOp != PortableOp::kWgrad;  // A[row][red] contiguous along the reduction
  static constexpr bool kBKMajor = kOp == PortableOp::kFwd;    // B[col][red] contiguous along the reduction

  static constexpr int kWarpsM = 2, kWarpsN = 4;
  static constexpr int kWarpM = kBM / kWarpsM;  // 64
  static constexpr int kWarpN = kBN / kWarpsN;  // 32
  static constexpr int kFragM = kWarpM / 16;    // 4 m16 tiles
  static constexpr int kFragN = kWarpN / 8;     // 4 n8 tiles
  static_assert(kWarpsM * kWarpsN * 32 == kThreads, "8 warps");
  static_assert(kFragN % 2 == 0, "B fragments are loaded in pairs of n8 tiles");

  static constexpr uint32_t kABytes = kBM * kBK * 2;  // 8 KB
  static constexpr uint32_t kBBytes = kBN * kBK * 2;  // 8 KB
  static constexpr uint32_t kOffA = 0;
  static constexpr uint32_t kOffB = kStages * kABytes;
  static constexpr uint32_t kOffTable = kOffB + kStages * kBBytes;
  using Scheduler = RaggedTileScheduler<kBM, kBN, 0, kTableSize>;  // no raster bands
  static constexpr uint32_t kSmemBytes = kOffTable + Scheduler::kSmemBytes;
  static_assert(kABytes + kBBytes == Cfg::kStageBytes && kSmemBytes == Cfg::kSmemBytes, "smem budget");
  static_assert(kBK == 32, "the K-major swizzle assumes 64-byte rows (4 chunks)");
  static_assert(kBM == 128 && kBN == 128, "the MN-major swizzle assumes 256-byte rows (16 chunks)");

  // chunks (16 B) per operand tile and per thread
  static constexpr int kChunks = kBM * kBK / 8;  // 512 (same for A and B)
  static constexpr int kChunksPerThread = kChunks / kThreads;
  static_assert(kChunks % kThreads == 0 && kBM == kBN, "even load split");

  // Byte offsets inside one operand stage, (row, 16-byte chunk) -> swizzled.
  // K-major: [128][32] bf16, 4 chunks per 64-B row.
  static __device__ __forceinline__ uint32_t kmajor_off(int row, int chunk) {
    return static_cast<uint32_t>(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
  }
  // MN-major: [32][128] bf16, 16 chunks per 256-B row.
  static __device__ __forceinline__ uint32_t mnmajor_off(int kr, int chunk) {
    return static_cast<uint32_t>(kr * 256 + ((chunk ^ (kr & 7)) << 4));
  }

  // One operand of a tile, in global memory.
  //  K-major : element (r, j) of the tile (r output row/col, j reduction index) at
  //            base + r * ld + j; rows r >= outer_valid are outside.
  //  MN-major: element (j, c) at base + j * ld + c; columns c >= outer_valid are outside.
  // Reduction indices j >= red_len are outside. Outside chunks are zero-filled.
  struct Operand {
    const bf16* base;
    int64_t ld;
    int32_t outer_valid;
  };

  template <bool kKMajor>
  static __device__ __forceinline__ void load_operand(uint32_t smem_stage, const Operand& op, int32_t red0,
                                                      int32_t red_len) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int id = static_cast<int>(threadIdx.x) + i * kThreads;
      if (kKMajor) {
        const int r = id >> 2, c = id & 3;
        const int32_t j = red0 + c * 8;
        const bool valid = r < op.outer_valid && j < red_len;
        const bf16* src = valid ? op.base + static_cast<int64_t>(r) * op.ld + j : op.base;
        detail::cp_async_16(smem_stage + kmajor_off(r, c), src, valid);
      } else {
        const int kr = id >> 4, c = id & 15;
        const int32_t j = red0 + kr;
        const bool valid = j < red_len && c * 8 < op.outer_valid;
        const bf16* src = valid ? op.base + static_cast<int64_t>(j) * op.ld + c * 8 : op.base;
        detail::cp_async_16(smem_stage + mnmajor_off(kr, c), src, valid);
      }
    }
  }

  // A fragment (m16 x k16) of rows [m, m + 16), reduction [ks, ks + 16) of the stage.
  static __device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], uint32_t stage, int m, int ks, int lane) {
    if (kAKMajor) {
      // matrices: (rows 0-7, k 0-7) (rows 8-15, k 0-7) (rows 0-7, k 8-15) (rows 8-15, k 8-15)
      const int row = m + (lane & 15);
      const int chunk = (ks >> 3) + (lane >> 4);
      detail::ldmatrix_x4(a, stage + kmajor_off(row, chunk));
    } else {
      // stored [k][m]; transposed matrices in the same order as above
      const int q = lane >> 3;
      const int kr = ks + ((q >> 1) << 3) + (lane & 7);
      const int chunk = (m >> 3) + (q & 1);
      detail::ldmatrix_x4_trans(a, stage + mnmajor_off(kr, chunk));
    }
  }

  // B fragments of two n8 tiles [n, n + 16), reduction [ks, ks + 16):
  // b[0], b[1] for columns n..n+7 and b[2], b[3] for n+8..n+15.
  static __device__ __forceinline__ void load_b_frag(uint32_t (&b)[4], uint32_t stage, int n, int ks, int lane) {
    const int q = lane >> 3;
    if (kBKMajor) {
      // stored [n][k]; matrices (n 0-7, k 0-7) (n 0-7, k 8-15) (n 8-15, k 0-7) (n 8-15, k 8-15)
      const int row = n + ((q >> 1) << 3) + (lane & 7);
      const int chunk = (ks >> 3) + (q & 1);
      detail::ldmatrix_x4(b, stage + kmajor_off(row, chunk));
    } else {
      // stored [k][n]; transposed, same order
      const int kr = ks + ((q & 1) << 3) + (lane & 7);
      const int chunk = (n >> 3) + (q >> 1);
      detail::ldmatrix_x4_trans(b, stage + mnmajor_off(kr, chunk));
    }
  }

  // acc += A(tile) * B(tile) over reduction [0, red_len). Leaves the ring idle
  // (all copies landed, all warps past their last read) on return.
  static __device__ __forceinline__ void mainloop(float (&acc)[kFragM][kFragN][4], uint32_t smem_base,
                                                  const Operand& a, const Operand& b, int32_t red_len) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wm = (warp / kWarpsN) * kWarpM;
    const int wn = (warp % kWarpsN) * kWarpN;
    const int32_t num_k = (red_len + kBK - 1) / kBK;

    auto load_stage = [&](int slot, int32_t kb) {
      const int32_t red0 = kb * kBK;
      load_operand<kAKMajor>(smem_base + kOffA + slot * kABytes, a, red0, red_len);
      load_operand<kBKMajor>(smem_base + kOffB + slot * kBBytes, b, red0, red_len);
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k) load_stage(s, s);
      detail::cp_async_commit();
    }

    int slot = 0;
    for (int32_t kb = 0; kb < num_k; ++kb) {
      detail::cp_async_wait<kStages - 2>();  // step kb has landed (this thread's copies) ...
      __syncthreads();                       // ... everyone's, and step kb-1's slot is free
      {
        const int32_t next = kb + kStages - 1;
        int next_slot = slot + kStages - 1;
        if (next_slot >= kStages) next_slot -= kStages;
        if (next < num_k) load_stage(next_slot, next);
        detail::cp_async_commit();
      }
      const uint32_t sa = smem_base + kOffA + slot * kABytes;
      const uint32_t sb = smem_base + kOffB + slot * kBBytes;
#pragma unroll
      for (int ks = 0; ks < kBK; ks += 16) {
        uint32_t af[kFragM][4];
        uint32_t bfr[kFragN / 2][4];
#pragma unroll
        for (int i = 0; i < kFragM; ++i) load_a_frag(af[i], sa, wm + i * 16, ks, lane);
#pragma unroll
        for (int jp = 0; jp < kFragN / 2; ++jp) load_b_frag(bfr[jp], sb, wn + jp * 16, ks, lane);
#pragma unroll
        for (int i = 0; i < kFragM; ++i) {
#pragma unroll
          for (int j = 0; j < kFragN; ++j) {
            const uint32_t* bb = bfr[j >> 1] + (j & 1) * 2;
            detail::mma_bf16_16816(acc[i][j], af[i], bb[0], bb[1]);
          }
        }
      }
      if (++slot == kStages) slot = 0;
    }
    detail::cp_async_wait<0>();
    __syncthreads();
  }

  static __device__ __forceinline__ void store_pair(bf16* p, float v0, float v1) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  }
  static __device__ __forceinline__ void store_pair(float* p, float v0, float v1) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  }

  // Store the CTA tile at out + row * ld + col for rows [row0, row_lim) and
  // columns [col0, col_lim) (tile-relative rows/cols from the fragments).
  static __device__ __forceinline__ void epilogue(const float (&acc)[kFragM][kFragN][4], OutT* out, int64_t ld,
                                                  int32_t row0, int32_t row_lim, int32_t col0, int32_t col_lim) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t r_base = row0 + (warp / kWarpsN) * kWarpM + (lane >> 2);
    const int32_t c_base = col0 + (warp % kWarpsN) * kWarpN + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < kFragM; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t r = r_base + i * 16 + h * 8;
        if (r < row_lim) {
          OutT* row_ptr = out + static_cast<int64_t>(r) * ld;
#pragma unroll
          for (int j = 0; j < kFragN; ++j) {
            const int32_t c = c_base + j * 8;
            // col_lim is a multiple of 8 and c even: c < col_lim covers c + 1 too
            if (c < col_lim) store_pair(row_ptr + c, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
      }
    }
  }

  static __device__ __forceinline__ void zero(float (&acc)[kFragM][kFragN][4]) {
#pragma unroll
    for (int i = 0; i < kFragM; ++i)
#pragma unroll
      for (int j = 0; j < kFragN; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
  }

  // Entry body; call from a __global__ with blockDim.x == kThreads and
  // kSmemBytes of dynamic shared memory.
  static __device__ __forceinline__ void run(const PortableGroupedGemmParams& p) {
    extern __shared__ __align__(128) uint8_t portable_gg_smem[];
    const uint32_t smem_base = detail::smem_u32(portable_gg_smem);
    const int32_t n = max(p.n, 0);
    const int32_t k = max(p.k, 0);
    const int64_t ld_x = p.x_row_stride > 0 ? p.x_row_stride : k;
    const int64_t ld_g = p.g_row_stride > 0 ? p.g_row_stride : n;
    const int64_t ld_w = p.w_row_stride > 0 ? p.w_row_stride : k;
    float acc[kFragM][kFragN][4];

    if constexpr (kOp == PortableOp::kWgrad) {
      const int32_t num_groups = max(p.num_groups, 0);
      const int32_t capacity = max(p.sum_m, 0);
      const int32_t tiles_r = (n + kBM - 1) / kBM;  // along N (rows of dW[e])
      const int32_t tiles_c = (k + kBN - 1) / kBN;  // along K (columns of dW[e])
      const int64_t per_group = static_cast<int64_t>(tiles_r) * tiles_c;
      const int64_t total = per_group * num_groups;
      const bf16* g = static_cast<const bf16*>(p.g);
      const bf16* x = static_cast<const bf16*>(p.x);
      OutT* out = static_cast<OutT*>(p.out);
      for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        const int32_t e = static_cast<int32_t>(t / per_group);
        const int32_t rem = static_cast<int32_t>(t - static_cast<int64_t>(e) * per_group);
        const int32_t tr = rem / tiles_c;
        const int32_t n0 = tr * kBM;
        const int32_t k0 = (rem - tr * tiles_c) * kBN;
        int32_t begin, end;
        ragged_group_rows(p.offs, e, p.offs_has_leading_zero, capacity, begin, end);
        zero(acc);
        // A = G^T: element (j, r) of the MN-major tile is G[begin + j][n0 + r]
        const Operand a{g + static_cast<int64_t>(begin) * ld_g + n0, ld_g, n - n0};
        // B = X:  element (j, c) is X[begin + j][k0 + c]
        const Operand b{x + static_cast<int64_t>(begin) * ld_x + k0, ld_x, k - k0};
        mainloop(acc, smem_base, a, b, end - begin);
        epilogue(acc, out + static_cast<int64_t>(e) * n * k, k, n0, n, k0, k);
      }
    } else {
      constexpr bool kFwd = kOp == PortableOp::kFwd;
      const int32_t n_out = kFwd ? n : k;  // output width
      const int32_t k_red = kFwd ? k : n;  // reduction length
      const bf16* act = static_cast<const bf16*>(kFwd ? p.x : p.g);
      const int64_t ld_act = kFwd ? ld_x : ld_g;
      const int64_t w_expert = p.w_expert_stride > 0 ? p.w_expert_stride : static_cast<int64_t>(n) * k;
      const bf16* w = static_cast<const bf16*>(p.w);
      bf16* out = static_cast<bf16*>(p.out);
      Scheduler sched;
      sched.init(reinterpret_cast<int32_t*>(portable_gg_smem + kOffTable), p.offs, p.num_groups, p.sum_m,
                 p.offs_has_leading_zero, n_out);
      for (int32_t t = blockIdx.x; t < sched.total_tiles; t += gridDim.x) {
        const GroupTile tile = sched.tile(t);
        zero(acc);
        // A: element (r, j) = act[m0 + r][j]
        const Operand a{act + static_cast<int64_t>(tile.m0) * ld_act, ld_act, tile.row_end - tile.m0};
        const bf16* we = w + static_cast<int64_t>(tile.group) * w_expert;
        Operand b;
        if (kFwd) {  // K-major: element (c, j) = W[e][n0 + c][j]
          b = Operand{we + static_cast<int64_t>(tile.n0) * ld_w, ld_w, n - tile.n0};
        } else {  // MN-major: element (j, c) = W[e][j][n0 + c] (n0 along K)
          b = Operand{we + tile.n0, ld_w, k - tile.n0};
        }
        mainloop(acc, smem_base, a, b, k_red);
        epilogue(acc, out, n_out, tile.m0, tile.row_end, tile.n0, n_out);
      }
    }
  }
};

// ---- extern "C"-ready entry bodies ------------------------------------------------
// Wrap each in `extern "C" __global__ void __launch_bounds__(256, 2)
// name(const __grid_constant__ PortableGroupedGemmParams p) { ...(p); }`
// (see instantiate_portable_example.cu).
using PortableFwd = PortableGroupedGemm<PortableOp::kFwd, __nv_bfloat16>;
using PortableDgrad = PortableGroupedGemm<PortableOp::kDgrad, __nv_bfloat16>;
using PortableWgradBf16 = PortableGroupedGemm<PortableOp::kWgrad, __nv_bfloat16>;
using PortableWgradF32 = PortableGroupedGemm<PortableOp::kWgrad, float>;

__device__ __forceinline__ void portable_grouped_gemm_fwd(const PortableGroupedGemmParams& p) { PortableFwd::run(p); }
__device__ __forceinline__ void portable_grouped_gemm_dgrad(const PortableGroupedGemmParams& p) {
  PortableDgrad::run(p);
}
__device__ __forceinline__ void portable_grouped_gemm_wgrad_bf16(const PortableGroupedGemmParams& p) {
  PortableWgradBf16::run(p);
}
__device__ __forceinline__ void portable_grouped_gemm_wgrad_f32(const PortableGroupedGemmParams& p) {
  PortableWgradF32::run(p);
}

}  // namespace portable
}  // namespace cake_moe
