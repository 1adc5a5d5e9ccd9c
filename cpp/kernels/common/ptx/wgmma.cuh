// Thin inline-PTX wrappers for sm_90a warpgroup MMA (wgmma) with BF16 inputs
// and FP32 accumulators, both operands in shared memory (SS form) or A from
// registers (RS form), plus the
// shared-memory matrix descriptor for the 128-byte swizzle and setmaxnreg.
//
// Needs the arch-specific target: -gencode arch=compute_90a,code=sm_90a.
#pragma once

#include <cstdint>

namespace cake_moe {
namespace ptx {

// ---- register reconfiguration (warpgroup-wide, sm_90a) ----------------------
// Registers per thread a CTA of `threads` threads holds at one CTA per SM (the allocation unit
// is 8 per thread). setmaxnreg only moves registers between the warps of one CTA: the sum of
// the per-warpgroup budgets must not exceed threads x this, or setmaxnreg.inc waits forever.
constexpr uint32_t launch_regs_per_thread(uint32_t threads) { return 65536u / threads / 8u * 8u; }

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// This thread's warpgroup (threadIdx.x / 128), passed through a constant-lane shuffle so that the
// compiler knows it is warp-uniform: offsets derived from it (per-warpgroup shared-memory slices,
// hence wgmma descriptors) then stay in uniform registers, with no R2UR move before each wgmma
// (measured: the grouped GEMM's dgrad 2-4% faster, bench/results/*_grouped_gemm_uniform_ab.md).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0); }

// ---- wgmma ordering ---------------------------------------------------------
// Before the first wgmma of a batch (and after any ordinary register access of
// the accumulators) the warpgroup must fence.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator reads/writes across wgmma
// boundaries (the asm statements above only clobber memory).
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- shared-memory matrix descriptors (128-byte swizzle) ---------------------
// Bits: [0,14) start address >> 4, [16,30) leading-dimension byte offset >> 4,
// [32,46) stride-dimension byte offset >> 4, [49,52) base offset, [62,64)
// swizzle mode (1 = 128B). Every swizzle atom (8 rows x 128 B = 1024 B) must
// start on a 1024-byte boundary so the base offset stays 0; the start address
// may move inside an atom by multiples of 16 B (k-steps of a K-major tile).
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo_bytes,
                                                         uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// K-major operand, rows of 64 bf16 (128 B) stored row after row, 8-row groups
// 1024 B apart. LBO is unused for swizzled K-major layouts (encoded as 1).
__device__ __forceinline__ uint64_t make_desc_kmajor_sw128(uint32_t smem_byte_addr) {
  return make_smem_desc_sw128(smem_byte_addr, 16u, 1024u);
}

// The descriptor of the same layout `bytes` further on: a multiple of 16 bytes, and the start
// address field (14 bits of address >> 4) cannot carry below 256 KB of shared memory.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// MN-major operand (transposed B): each K row holds 64 contiguous MN elements
// (128 B); 8 K rows form a 1024-B atom (SBO = 1024 to the next 8 K rows); the
// next 64 MN elements start `mn_chunk_stride_bytes` later (LBO).
__device__ __forceinline__ uint64_t make_desc_mnmajor_sw128(uint32_t smem_byte_addr, uint32_t mn_chunk_stride_bytes) {
  return make_smem_desc_sw128(smem_byte_addr, mn_chunk_stride_bytes, 1024u);
}

// Inline-asm pieces shared by every shape below (undefined at the end of the file): the
// accumulator operands "+f"(d[i]) of an array `d`, and their placeholders "%0, %1, ...".
#define CAKE_WGMMA_ACC8(b)                                                                            \
  "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), \
      "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define CAKE_WGMMA_ACC16(b) CAKE_WGMMA_ACC8(b), CAKE_WGMMA_ACC8((b) + 8)
#define CAKE_WGMMA_ACC32(b) CAKE_WGMMA_ACC16(b), CAKE_WGMMA_ACC16((b) + 16)
#define CAKE_WGMMA_ACC48 CAKE_WGMMA_ACC32(0), CAKE_WGMMA_ACC16(32)
#define CAKE_WGMMA_ACC64 CAKE_WGMMA_ACC32(0), CAKE_WGMMA_ACC32(32)
#define CAKE_WGMMA_ACC80 CAKE_WGMMA_ACC64, CAKE_WGMMA_ACC16(64)
#define CAKE_WGMMA_ACC96 CAKE_WGMMA_ACC64, CAKE_WGMMA_ACC32(64)
#define CAKE_WGMMA_ACC128 CAKE_WGMMA_ACC96, CAKE_WGMMA_ACC32(96)
#define CAKE_WGMMA_D16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define CAKE_WGMMA_D32 CAKE_WGMMA_D16 ", " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CAKE_WGMMA_D48 CAKE_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define CAKE_WGMMA_D64                                                                          \
  CAKE_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CAKE_WGMMA_D80 \
  CAKE_WGMMA_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define CAKE_WGMMA_D96                                                                          \
  CAKE_WGMMA_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define CAKE_WGMMA_D128                                                                         \
  CAKE_WGMMA_D96 ", " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// ---- wgmma.mma_async m64nNk16 bf16 x bf16 -> f32, A and B from smem --------
// TransA = 0: A is K-major; 1: A is M-major (each k row of the smem tile holds 64
// contiguous M elements, 128 B, 8 k rows per 1024-B swizzle atom; describe it with
// make_desc_mnmajor_sw128; a k16 step is 16 rows = 2048 B) -- the weight gradient,
// where the reduction dim (tokens) is the strided dim of both operands.
// TransB = 0: B is K-major ([N][K] rows, the "NT" GEMM); 1: B is N-major ([K][N]
// rows). scale_d = 0 overwrites the accumulators, 1 accumulates. Accumulator
// fragment (per thread, lane = 4*g+q, warp w of the warpgroup): d[4*i + {0,1}] =
// row 16w+g, cols 8i+2q+{0,1}; d[4*i + {2,3}] = row 16w+g+8, same cols.
template <int N, int TransA, int TransB>
struct WgmmaBf16SSAB;

// One specialization per N: the shapes differ only in N, the accumulator count R and the
// operand numbers after the accumulators (R: desc_a, R+1: desc_b, R+2: scale_d, R+3/R+4: the
// transpose immediates), given here as literals IA..ITB for the asm string.
#define CAKE_WGMMA_SS_SHAPE(N, R, ACC, D, IA, IB, IS, ITA, ITB)                                             \
  template <int TransA, int TransB>                                                                        \
  struct WgmmaBf16SSAB<N, TransA, TransB> {                                                                \
    static constexpr int kAccRegs = R;                                                                     \
    __device__ __forceinline__ static void mma(float (&d)[R], uint64_t desc_a, uint64_t desc_b,           \
                                               uint32_t scale_d) {                                         \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                                      \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D "}, %" #IA ", %" #IB     \
                   ", p, 1, 1, %" #ITA ", %" #ITB ";\n}\n"                                                  \
                   : ACC                                                                                   \
                   : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB));                     \
    }                                                                                                      \
  };
CAKE_WGMMA_SS_SHAPE(64, 32, CAKE_WGMMA_ACC32(0), CAKE_WGMMA_D32, 32, 33, 34, 35, 36)
CAKE_WGMMA_SS_SHAPE(128, 64, CAKE_WGMMA_ACC64, CAKE_WGMMA_D64, 64, 65, 66, 67, 68)
CAKE_WGMMA_SS_SHAPE(192, 96, CAKE_WGMMA_ACC96, CAKE_WGMMA_D96, 96, 97, 98, 99, 100)
CAKE_WGMMA_SS_SHAPE(256, 128, CAKE_WGMMA_ACC128, CAKE_WGMMA_D128, 128, 129, 130, 131, 132)
#undef CAKE_WGMMA_SS_SHAPE

// ---- wgmma.mma_async m64nNk16 bf16 x bf16 -> f32, A from registers (RS form) --
// A is this warpgroup's 64 x 16 tile as four bf16x2 registers per thread, in the
// mma.sync m16n8k16 A-fragment order per warp (warp w supplies rows 16w..16w+15:
// a[0] row g k 2q..+1, a[1] row g+8, a[2] row g k+8, a[3] row g+8 k+8). The
// registers may only be rewritten after a wgmma_wait that retires this wgmma
// (ptxas keeps them live or serializes). B from smem and the accumulator
// fragment as in the SS form.
template <int N, int TransB>
struct WgmmaBf16RS;

// As for the SS form: operands after the R accumulators are the four A registers (IA0..IA3),
// desc_b (IB), scale_d (IS) and the transpose immediate (ITB).
#define CAKE_WGMMA_RS_SHAPE(N, R, ACC, D, IA0, IA1, IA2, IA3, IB, IS, ITB)                                \
  template <int TransB>                                                                                    \
  struct WgmmaBf16RS<N, TransB> {                                                                          \
    static constexpr int kAccRegs = R;                                                                     \
    __device__ __forceinline__ static void mma(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,    \
                                               uint32_t scale_d) {                                         \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                                      \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D "}, {%" #IA0 ", %" #IA1  \
                   ", %" #IA2 ", %" #IA3 "}, %" #IB ", p, 1, 1, %" #ITB ";\n}\n"                              \
                   : ACC                                                                                   \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));   \
    }                                                                                                      \
  };
CAKE_WGMMA_RS_SHAPE(32, 16, CAKE_WGMMA_ACC16(0), CAKE_WGMMA_D16, 16, 17, 18, 19, 20, 21, 22)
CAKE_WGMMA_RS_SHAPE(64, 32, CAKE_WGMMA_ACC32(0), CAKE_WGMMA_D32, 32, 33, 34, 35, 36, 37, 38)
CAKE_WGMMA_RS_SHAPE(96, 48, CAKE_WGMMA_ACC48, CAKE_WGMMA_D48, 48, 49, 50, 51, 52, 53, 54)
CAKE_WGMMA_RS_SHAPE(128, 64, CAKE_WGMMA_ACC64, CAKE_WGMMA_D64, 64, 65, 66, 67, 68, 69, 70)
CAKE_WGMMA_RS_SHAPE(160, 80, CAKE_WGMMA_ACC80, CAKE_WGMMA_D80, 80, 81, 82, 83, 84, 85, 86)
#undef CAKE_WGMMA_RS_SHAPE

// K-major A: the forward and the input gradient.
template <int N, int TransB>
using WgmmaBf16SS = WgmmaBf16SSAB<N, 0, TransB>;

}  // namespace ptx
}  // namespace cake_moe

#undef CAKE_WGMMA_ACC8
#undef CAKE_WGMMA_ACC16
#undef CAKE_WGMMA_ACC32
#undef CAKE_WGMMA_ACC48
#undef CAKE_WGMMA_ACC64
#undef CAKE_WGMMA_ACC80
#undef CAKE_WGMMA_ACC96
#undef CAKE_WGMMA_ACC128
#undef CAKE_WGMMA_D16
#undef CAKE_WGMMA_D32
#undef CAKE_WGMMA_D48
#undef CAKE_WGMMA_D64
#undef CAKE_WGMMA_D80
#undef CAKE_WGMMA_D96
#undef CAKE_WGMMA_D128
