// The decode GEMM1 weight stream without the GEMM: the tp8 T = 1 weight rows (16 experts x 768
// rows x 3584 B, 47 MB) read by CTAs of kBM rows with kDepth 16-byte loads in flight per thread,
// row-major per stage (as the prepared layout is read) or contiguous; DRAM-cold (rotating
// experts), CUDA events around each launch (they include ~6.5 us of launch and event overhead,
// printed first). Build and run on the GPU machine: nvcc -O3 -arch=sm_90a -o /tmp/ds
// ci/decode_stream.cu && /tmp/ds (results: docs/mxfp4_moe_experiments.md, "Decode stream").
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
constexpr int L = 896, M = 768, ROWB = 3584;
__device__ __forceinline__ uint4 ldg(const uint8_t* p) {
  uint4 v; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }
// kBM rows per CTA, each thread keeps kDepth 16-byte loads in flight; row-major (kRowMajor: a
// batch covers kBatchCols bytes of each row) or contiguous.
template <int kBM, int kDepth, bool kRowMajor>
__global__ void __launch_bounds__(256) kern(const uint8_t* w, const int* experts, uint32_t* out) {
  constexpr int kBlocks = M / kBM;
  const int e = experts[blockIdx.x / kBlocks], rb = blockIdx.x % kBlocks;
  const uint8_t* base = w + (size_t(e) * M + rb * kBM) * ROWB;
  constexpr int kBatch = kDepth * 256 * 16;              // bytes per batch
  constexpr int kBatchCols = kBatch / kBM;               // bytes of each row per batch
  constexpr int kBatches = kBM * ROWB / kBatch;
  static_assert(kBM * ROWB % kBatch == 0 && ROWB % kBatchCols == 0, "whole batches");
  uint32_t acc = 0;
  const int t = threadIdx.x;
#pragma unroll 1
  for (int s = 0; s < kBatches; ++s) {
    uint4 v[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const int c = i * 256 + t;
      const uint8_t* p = kRowMajor ? base + (c / (kBatchCols / 16)) * ROWB + s * kBatchCols + (c % (kBatchCols / 16)) * 16
                                   : base + size_t(s) * kBatch + c * 16;
      v[i] = ldg(p);
    }
#pragma unroll
    for (int i = 0; i < kDepth; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x12345678u) out[t] = acc;
}
__global__ void empty_kern() {}
template <int kBM, int kDepth, bool kRowMajor>
float timeit(const uint8_t* w, const int* ex, uint32_t* out, int sets) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ts;
  for (int it = 0; it < sets; ++it) {
    cudaEventRecord(a);
    kern<kBM, kDepth, kRowMajor><<<16 * (M / kBM), 256>>>(w, ex + it * 16, out);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
int main() {
  uint8_t* w; int* ex; uint32_t* out;
  size_t wb = size_t(L) * M * ROWB;
  cudaMalloc(&w, wb); cudaMalloc(&out, 1 << 20);
  cudaMemset(w, 0x5A, wb);
  const int sets = 48;
  std::vector<int> h(sets * 16);
  for (int i = 0; i < sets * 16; ++i) h[i] = (i * 37 + (i / 16) * 11) % L;
  cudaMalloc(&ex, h.size() * 4); cudaMemcpy(ex, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  const double mb = 16.0 * M * ROWB / 1e6;
  {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> ts;
    for (int i = 0; i < 48; ++i) { cudaEventRecord(a); empty_kern<<<192, 256>>>(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000); }
    std::sort(ts.begin(), ts.end()); printf("empty launch: %.1f us\n", ts[24]);
  }
#define ROW(BM, D, RM) { float x[3]; for (int r = 0; r < 3; ++r) x[r] = timeit<BM, D, RM>(w, ex, out, sets); std::sort(x, x + 3); \
  printf("BM %3d CTAs %3d in-flight/CTA %4d KB %-10s %6.1f us %5.2f TB/s\n", BM, 16 * (M / BM), D * 4, RM ? "row-major" : "contig", x[1], mb / x[1]); }
  ROW(64, 8, true) ROW(64, 14, true) ROW(64, 28, true) ROW(64, 8, false) ROW(64, 14, false) ROW(64, 28, false)
  ROW(32, 4, true) ROW(32, 7, true) ROW(32, 14, true) ROW(32, 28, true) ROW(32, 14, false)
  ROW(128, 16, true) ROW(128, 28, true)
  ROW(256, 28, false)
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
}
