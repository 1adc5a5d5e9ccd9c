// The decode GEMM1 mainloop's compute chain from shared memory only (no global traffic, no
// copies): what one narrow CTA (64 weight rows, eight warps each on 128 of a stage's 1024 K,
// token tile of 8 rows, a CTA barrier per stage) spends per stage on the E2M1 conversion and
// the MMAs, in the BF16 form the layer runs and in an FP8-operand form that the layer does not
// have, measured side by side:
//
//   0 bf16        the layer's own chain: `Mxfp4MoeGemm<kGemm1, DecodeNarrowTiling>::compute_stage`
//                 on a ring in the layer's stage layout (per 64-element unit and m16 block the two
//                 prepared words of rows g and g + 8, each bf16x2 register by rotate / mask or the
//                 slot-3 multiply and one HMUL2 by 2^(code - 1), four mma.sync m16n8k16 BF16,
//                 token rows by ldmatrix)
//   (1, one AND per register slot, a calibration bound, is retired: its figures stay in the
//   2026-12-02 result file)
//   2 fp8         E2M1 -> E4M3 by bit placement (an FP8 prepared layout: one weight of each byte
//                 at bits 2, 3, 4, 7, the other at 0, 1, 6, 5; five integer instructions per
//                 word of eight weights) and RS wgmma m64n8k32 E4M3 (sm_90a has no FP8 mma.sync:
//                 ptxas expands it into F2FP conversions and FP16 HMMAs): the two warpgroups
//                 take a stage's K halves, a warp one m16 block of the 64 rows; each k32 step's
//                 wgmma into zeroed temporaries (two sets: step s + 1 runs while step s is
//                 promoted), each temporary added into its accumulator by one FFMA with the
//                 factor 2^(wcode + xcode - 248) (one IMAD per row and token column from a
//                 per-stage table of (xcode - 121) << 23: weight block scale x activation block
//                 scale x the 2^6 the placement leaves)
//   3 fp8-noprom  mode 2 accumulating in place (no promotion: wrong for MX scales; the FP8
//                 conversion and the wgmma issue alone)
//   4 bf16-wg     mode 0's conversion on mode 2's organization: RS wgmma m64n8k16 BF16 per k16
//                 step, accumulated in place (one step in flight): wgmma against mma.sync alone
//
// Random data (weight codes 118..124, activations finite and nonzero), outputs written so that
// nothing is dead code. Each CTA computes `stages` stages; 264 CTAs (two per SM, as the layer's
// T = 1 GEMM1 on the SMs holding two) and 132 (one per SM). Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I cpp/kernels -o /tmp/dfc \
//        ci/decode_fp8_chain.cu && /tmp/dfc
// Results: bench/results/2026-12-02_h200_decode_fp8_chain.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/ptx/sm80.cuh"
#include "common/ptx/smem.cuh"
#include "common/ptx/wgmma.cuh"
#include "mxfp4_moe/mxfp4_moe_gemm.cuh"
#include "mxfp4_moe/weight_fragments.cuh"

namespace {
using namespace cake_moe;
using namespace cake_moe::mxfp4_moe;

constexpr int kWarps = 8, kThreads = 32 * kWarps, kRows = 64, kBN = 8;
constexpr int kKStage = 128 * kWarps;                    // 1024
constexpr int kWBytes = kRows * kKStage / 2;             // 32 KB of FP4 per stage
constexpr int kSfBytes = kRows * kKStage / 32;           // 2 KB of weight codes
constexpr int kXBf16Bytes = kBN * kKStage * 2;           // 16 KB of BF16 token rows
constexpr int kXCodeBytes = kBN * kKStage / 32 * 4;      // fp8: (xcode - 121) << 23 per token and block
constexpr int kSlotBytes = (kWBytes + kSfBytes + kXBf16Bytes + kXCodeBytes + 1023) / 1024 * 1024;
constexpr int kSlots = 2;
// mode 0: the layer's narrow GEMM1 and its ring (two stages of 64 rows x 1024 K)
using Layer = Mxfp4MoeGemm<GemmStage::kGemm1, DecodeNarrowTiling>;
static_assert(DecodeNarrowTiling::kThreads == kThreads && DecodeNarrowTiling::kKStage == kKStage &&
                  DecodeNarrowTiling::kBM == kRows && DecodeNarrowTiling::kBN == kBN,
              "mode 0 runs the layer's CTA shape");
constexpr int kLayerRingBytes = DecodeNarrowTiling::kStages * DecodeNarrowTiling::kStageBytes;
constexpr int kOwnBytes = kSlots * kSlotBytes > kLayerRingBytes ? kSlots * kSlotBytes : kLayerRingBytes;
constexpr int kSmemBytes = kOwnBytes + 1024;  // ~100 KB, as the layer's narrow CTA: two per SM

struct Slot {
  uint32_t w, sf, x, xc;  // shared-window addresses
};
__device__ __forceinline__ Slot slot_of(uint32_t base, int s) {
  const uint32_t b = base + uint32_t(s) * kSlotBytes;
  return {b, b + kWBytes, b + kWBytes + kSfBytes, b + kWBytes + kSfBytes + kXBf16Bytes};
}

__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

// Weight word offset: row r, 16-byte chunk c of the row's 512 stage bytes, XOR-swizzled by row.
__device__ __forceinline__ uint32_t w_off(int r, int chunk) { return r * (kKStage / 2) + 16 * (chunk ^ (r & 7)); }
// RS wgmma m64n8k32 E4M3 (warpgroup-wide): d = A B (+ d when scale_d), A from registers
// (a[0] row g k 4q..4q+3, a[1] row g + 8, a[2] row g k 16 + 4q.., a[3] row g + 8 of the warp's
// m16 block), B 8 token rows x 32 K bytes from a 128-byte-swizzled K-major tile.
__device__ __forceinline__ void wgmma_e4m3_m64n8k32(float (&d)[4], const uint32_t (&a)[4], uint64_t db,
                                                    uint32_t scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// RS wgmma m64n8k16 BF16, accumulating: B 8 token rows x 16 BF16 from a 128-byte-swizzled
// K-major tile.
__device__ __forceinline__ void wgmma_bf16_m64n8k16(float (&d)[4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, "
               "1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// The FP8 placement's two E4M3 registers of a word: weights at bits 2, 3, 4, 7 of each byte (one
// mask), and at 0 (m), 1 (e0), 6 (e1), 5 (sign).
__device__ __forceinline__ uint32_t e4m3_lo(uint32_t w) { return w & 0x9C9C9C9Cu; }
__device__ __forceinline__ uint32_t e4m3_hi(uint32_t w) {
  return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u);
}

// The two prepared words (k32 blocks 2i, 2i + 1 of the 64-element unit at stage element k0) and
// the two codes of rows row0 + g and row0 + g + 8 of ring slot `sl`: one m16 block's share of a
// unit, as the layer's load_unit reads it.
__device__ __forceinline__ void load_block(const Slot& sl, int row0, int k0, int g, int q, uint2 (&wrow)[2],
                                           uint32_t (&codes)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h + g;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(wrow[h].x), "=r"(wrow[h].y)
                 : "r"(sl.w + w_off(r, k0 / 32 + (q >> 1)) + 8 * (q & 1)));
    uint16_t c16;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(c16) : "r"(sl.sf + r * 32 + k0 / 32));
    codes[h] = c16;
  }
}

// The layer's BF16 A fragment of k16 sub-step s (0..3) of a unit, s known at compile time after
// unrolling.
__device__ __forceinline__ void bf16_step_fragment(int s, uint32_t (&a)[4], const uint2 (&wrow)[2], uint32_t cg,
                                                   uint32_t cg8) {
  switch (s) {
    case 0: a_fragment<0, false>(a, wrow[0], wrow[1], cg, cg8); break;
    case 1: a_fragment<1, false>(a, wrow[0], wrow[1], cg, cg8); break;
    case 2: a_fragment<2, false>(a, wrow[0], wrow[1], cg, cg8); break;
    default: a_fragment<3, false>(a, wrow[0], wrow[1], cg, cg8); break;
  }
}

// Mode 0's ring in the layer's stage layout: random FP4 bytes, codes 118..124, BF16 token values.
__device__ void fill_layer_ring(uint8_t* smem) {
  using T = DecodeNarrowTiling;
  for (int i = threadIdx.x; i < kLayerRingBytes / 4; i += kThreads) {
    const int off = (i * 4) % T::kStageBytes;
    uint32_t v = hash(uint32_t(i) * 2654435761u + blockIdx.x);
    if (off >= T::kBM * T::kWRowBytes && off < T::kBM * (T::kWRowBytes + T::kSfRowBytes)) {
      v = 0x76767676u + (v & 0x03030303u) + ((v >> 4) & 0x03030303u);  // 118..124
    } else if (off >= T::kBOffset) {
      v = (v & 0x807F807Fu) | 0x3E003E00u;  // BF16 values in [0.125, 0.25)
    }
    reinterpret_cast<uint32_t*>(smem)[i] = v;
  }
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2) chain(int stages, float* out) {
  extern __shared__ uint8_t smem_dyn[];
  uint8_t* smem = smem_dyn + ((1024u - (ptx::smem_addr(smem_dyn) & 1023u)) & 1023u);  // swizzle atoms
  // fill the ring: random FP4 bytes, codes 118..124, finite BF16 / E4M3 token values, and the
  // activation code table from codes 120..134 (mode 0: the layer's layout)
  if constexpr (kMode == 0) fill_layer_ring(smem);
  for (int i = threadIdx.x; kMode != 0 && i < kSlots * kSlotBytes / 4; i += kThreads) {
    const int off = (i * 4) % kSlotBytes;
    uint32_t v = hash(uint32_t(i) * 2654435761u + blockIdx.x);
    if (off >= kWBytes && off < kWBytes + kSfBytes) {
      v = 0x76767676u + (v & 0x03030303u) + ((v >> 4) & 0x03030303u);  // 118..124
    } else if (off >= kWBytes + kSfBytes && off < kWBytes + kSfBytes + kXBf16Bytes) {
      v = (kMode == 2 || kMode == 3) ? (v & 0xF6F6F6F6u) | 0x08080808u       // E4M3 bytes, never NaN, nonzero
                       : (v & 0x807F807Fu) | 0x3E003E00u;      // BF16 values in [0.125, 0.25)
    } else if (off >= kWBytes + kSfBytes + kXBf16Bytes) {
      v = ((120u + v % 15u) - 121u) << 23;
    }
    reinterpret_cast<uint32_t*>(smem)[i] = v;
  }
  __syncthreads();
  const uint32_t base = ptx::smem_addr(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float acc[4][4] = {};
  if constexpr (kMode == 4) {
    // mode 2's organization with the BF16 chain: warpgroup wg on K half wg, warp w on m16 block
    // w; 32 k16 steps per stage
    const int wg = warp / 4, w = warp % 4;
    for (int ks = 0; ks < stages; ++ks) {
      __syncthreads();  // the layer's per-stage barrier
      const Slot sl = slot_of(base, ks % kSlots);
      const uint64_t desc0 = ptx::make_desc_kmajor_sw128(sl.x + wg * 8192);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        uint2 wrow[2];
        uint32_t codes[2];
        load_block(sl, 16 * w, wg * 512 + u * 64, g, q, wrow, codes);
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {  // k16 sub-steps of the unit; step j of the stage
          const int j = 4 * u + s4;
          const uint32_t cg = (codes[0] >> (8 * (s4 / 2))) & 0xFFu, cg8 = (codes[1] >> (8 * (s4 / 2))) & 0xFFu;
          uint32_t a[4];
          bf16_step_fragment(s4, a, wrow, cg, cg8);
          ptx::wgmma_fence();
          wgmma_bf16_m64n8k16(acc[0], a, desc0 + uint64_t(((j / 4) * 1024 + 32 * (j % 4)) >> 4));
          ptx::wgmma_commit();
          ptx::wgmma_wait<1>();
        }
      }
    }
    ptx::wgmma_wait<0>();
    ptx::reg_fence(acc[0]);
  } else if constexpr (kMode >= 2) {
    // warpgroup wg: K half wg of every stage (16 k32 steps); warp w of it: m16 block w (rows
    // 16 w + g, + 8).
    const int wg = warp / 4, w = warp % 4;
    for (int ks = 0; ks < stages; ++ks) {
      __syncthreads();  // the layer's per-stage barrier
      const Slot sl = slot_of(base, ks % kSlots);
      // the stage's B descriptor; a step moves its start address (bits 0..13, 16-byte units)
      const uint64_t desc0 = ptx::make_desc_kmajor_sw128(sl.x + wg * 4096);
#pragma unroll
      for (int u = 0; u < 8; ++u) {  // 64-element units: two k32 steps each
        uint2 wrow[2];
        uint32_t codes[2];
        load_block(sl, 16 * w, wg * 512 + u * 64, g, q, wrow, codes);
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
          const int j = 2 * u + kb;
          const uint32_t wg_ = kb ? wrow[0].y : wrow[0].x, wg8 = kb ? wrow[1].y : wrow[1].x;
          const uint32_t a[4] = {e4m3_lo(wg_), e4m3_lo(wg8), e4m3_hi(wg_), e4m3_hi(wg8)};
          const uint64_t db = desc0 + uint64_t(((j / 4) * 1024 + 32 * (j % 4)) >> 4);
          if constexpr (kMode == 3) {
            ptx::wgmma_fence();
            wgmma_e4m3_m64n8k32(acc[0], a, db, 1u);
            ptx::wgmma_commit();
            ptx::wgmma_wait<1>();
          } else {
            // each step's wgmma waited for before its promotion (a second temporary set with the
            // next step in flight makes ptxas serialize the wgmmas anyway, C7514); the other
            // warpgroups' wgmmas run meanwhile
            float t[4];
            ptx::wgmma_fence();
            wgmma_e4m3_m64n8k32(t, a, db, 0u);
            ptx::wgmma_commit();
            uint32_t xs0, xs1;  // (xcode - 121) << 23 of token columns 2q, 2q + 1, block wg * 16 + j
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(xs0), "=r"(xs1)
                         : "r"(sl.xc + ((wg * 16 + j) * kBN + 2 * q) * 4));
            const uint32_t cg = (codes[0] >> (8 * kb)) & 0xFFu, cg8 = (codes[1] >> (8 * kb)) & 0xFFu;
            ptx::wgmma_wait<0>();
            ptx::reg_fence(t);
            acc[0][0] = fmaf(t[0], __uint_as_float(cg * 0x800000u + xs0), acc[0][0]);
            acc[0][1] = fmaf(t[1], __uint_as_float(cg * 0x800000u + xs1), acc[0][1]);
            acc[0][2] = fmaf(t[2], __uint_as_float(cg8 * 0x800000u + xs0), acc[0][2]);
            acc[0][3] = fmaf(t[3], __uint_as_float(cg8 * 0x800000u + xs1), acc[0][3]);
          }
        }
      }
    }
    ptx::wgmma_wait<0>();
    ptx::reg_fence(acc[0]);
  } else {
    static_assert(kMode == 0, "modes 0, 2, 3, 4");
    float lacc[4][1][4] = {};
    const Layer::Smem sm{smem};
    const Layer::FragOffsets frag = Layer::frag_offsets(0, warp);
    for (int ks = 0; ks < stages; ++ks) {
      __syncthreads();  // the layer's per-stage barrier
      Layer::compute_stage(sm, ks % DecodeNarrowTiling::kStages, 0, warp, frag, false, lacc);
    }
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mb][j] = lacc[mb][0][j];
  }
  float s = 0.0f;
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int j = 0; j < 4; ++j) s += acc[mb][j];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
}

template <int kMode>
float time_us(int ctas, int stages, float* out) {
  cudaFuncSetAttribute(chain<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  chain<kMode><<<ctas, kThreads, kSmemBytes>>>(stages, out);  // warm-up
  std::vector<float> ts;
  for (int r = 0; r < 9; ++r) {
    cudaEventRecord(a);
    chain<kMode><<<ctas, kThreads, kSmemBytes>>>(stages, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.0f);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
}  // namespace

int main() {
  float* out;
  cudaMalloc(&out, 264 * kThreads * sizeof(float));
  const int stages = 2000;
  const char* names[5] = {"bf16 (the layer's chain, mma.sync)", "(retired)", "fp8 wgmma + promotion",
                          "fp8 wgmma, no promotion (bound)", "bf16 wgmma m64n8k16"};
  printf("per stage of 1024 K x 64 rows per CTA, %d stages per CTA, median of 9 launches\n", stages);
  printf("| mode | 132 CTAs (one per SM): us per stage | 264 CTAs (two per SM): us per stage | vs bf16 (264) |\n");
  printf("|---|---|---|---|\n");
  float t[5][2];
  for (int pass = 0; pass < 2; ++pass) {  // two passes, the second reported: clocks settle
    for (int c = 0; c < 2; ++c) {
      const int ctas = c ? 264 : 132;
      t[0][c] = time_us<0>(ctas, stages, out) / stages;
      t[2][c] = time_us<2>(ctas, stages, out) / stages;
      t[3][c] = time_us<3>(ctas, stages, out) / stages;
      t[4][c] = time_us<4>(ctas, stages, out) / stages;
    }
  }
  for (int m = 0; m < 5; ++m)
    if (m != 1) printf("| %d %s | %.3f | %.3f | %.3f |\n", m, names[m], t[m][0], t[m][1], t[m][1] / t[0][1]);
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
