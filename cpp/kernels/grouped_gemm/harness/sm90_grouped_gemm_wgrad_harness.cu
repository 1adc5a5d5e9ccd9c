// Standalone correctness + timing harness for the sm_90a ragged BF16 grouped GEMM
// weight gradient: dW[e] = G[g_e]^T @ X[g_e], dW [E, N, K] bf16 or f32.
//
// Build (from the repository root):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I cpp/kernels \
//        cpp/kernels/grouped_gemm/harness/sm90_grouped_gemm_wgrad_harness.cu -o wgrad_harness
// Run: ./wgrad_harness             correctness checks, then timings
//      --no-time / --time          correctness only / timings only
//      --small                     only the small cases (for compute-sanitizer:
//                                  compute-sanitizer --tool memcheck ./wgrad_harness --no-time --small)
//      --form SUBSTR               only forms whose name contains SUBSTR
//      --case SUBSTR               only correctness cases whose name contains SUBSTR
//      --extra-forms               also harness-only tuning forms (min chunk 4 k-blocks, never split)
// Exit status 0 iff every check passed. Last line: "<n> passed, <m> failed".
//
// Checks per (case, form): outputs poisoned with 0xFF first (bf16/f32 NaN) plus a
// guard band past dW; every element must be finite, the guard untouched, empty
// groups exactly +0 (bit pattern 0), relative RMS error against an FP32
// reference < 1e-2 while the same metric rejects a 2% perturbation (MoE shapes
// are compared on every 7th row n = 3 mod 7 of each dW[e], all columns; small
// cases on every row); the workspace must be all zero after every launch (its
// contract). det: bitwise identical over 3 runs on the default stream, one on a
// side stream and one with a different grid size (the decomposition does not
// depend on the grid). Small cases also run det without a workspace (static
// schedule, no split) and with a 2-slot workspace (coarsened split).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "grouped_gemm/instantiate_wgrad_example.cu"

using cake_moe::sm90::GroupedGemmWgradKernel;
using cake_moe::sm90::GroupedGemmWgradParams;
using cake_moe::sm90::WgradReduce;

#define CUDA_CHECK(x)                                                                               \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__,          \
                  cudaGetErrorString(e_));                                                          \
      std::printf("%d passed, %d failed\n", g_passed, g_failed + 1);                                \
      std::exit(3);                                                                                 \
    }                                                                                               \
  } while (0)

static int g_passed = 0, g_failed = 0;

using PFN_encodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static PFN_encodeTiled g_encode_tiled = nullptr;

static void load_driver_entry_points() {
  cudaDriverEntryPointQueryResult q;
  void* fn = nullptr;
  CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::printf("cuTensorMapEncodeTiled not available from the driver\n0 passed, 1 failed\n");
    std::exit(3);
  }
  g_encode_tiled = reinterpret_cast<PFN_encodeTiled>(fn);
}

// ------------------------------------------------------------------------------------------
// harness-only tuning forms (--extra-forms)
namespace hx {
using cake_moe::sm90::WgradReduce;
// 128 x 128 tiles (6 stages) measured 0.70x of 128 x 256 on the H200 (2026): not kept.
using DetMin4Bf16 = GroupedGemmWgradKernel<256, 4, WgradReduce::kDet, __nv_bfloat16, 8, 4>;
using FastMin4F32 = GroupedGemmWgradKernel<256, 4, WgradReduce::kFast, float, 8, 4>;
}  // namespace hx
CAKE_GGW_SM90_DEFINE_KERNEL(hx_wgrad_det_128x256_min4_bf16, hx::DetMin4Bf16)
CAKE_GGW_SM90_DEFINE_KERNEL(hx_wgrad_fast_128x256_min4_f32, hx::FastMin4F32)

struct Form {
  std::string name;
  bool det, f32;
  int bm, bn, stages;
  void (*fn)(GroupedGemmWgradParams);
  int threads;
  uint32_t smem;
  int ws_mode;  // 0: shared workspace, default slots; 1: no workspace; 2: ws_slots = 0 (no split, dynamic)
};

template <class K>
Form make_form(const char* name, void (*fn)(GroupedGemmWgradParams), int ws_mode = 0) {
  Form f;
  f.name = name;
  f.det = K::kDeterministic;
  f.f32 = K::kOutputF32;
  f.bm = K::kBlockM;
  f.bn = K::kBlockN;
  f.stages = K::kNumStages;
  f.fn = fn;
  f.threads = K::kNumThreads;
  f.smem = K::kSmemBytes;
  f.ws_mode = ws_mode;
  return f;
}

static std::vector<Form> all_forms(bool extra, const char* filter) {
  namespace wf = cake_moe::sm90::wgrad_forms;
  std::vector<Form> f = {
      make_form<wf::DetBf16>("det_128x256_bf16", cake_gg_sm90_wgrad_det_128x256_bf16),
      make_form<wf::FastBf16>("fast_128x256_bf16", cake_gg_sm90_wgrad_fast_128x256_bf16),
      make_form<wf::DetF32>("det_128x256_f32", cake_gg_sm90_wgrad_det_128x256_f32),
      make_form<wf::FastF32>("fast_128x256_f32", cake_gg_sm90_wgrad_fast_128x256_f32),
  };
  if (extra) {
    f.push_back(make_form<hx::DetMin4Bf16>("x_det_min4_bf16", hx_wgrad_det_128x256_min4_bf16));
    f.push_back(make_form<hx::FastMin4F32>("x_fast_min4_f32", hx_wgrad_fast_128x256_min4_f32));
    f.push_back(make_form<wf::DetBf16>("x_det_nosplit_bf16", cake_gg_sm90_wgrad_det_128x256_bf16, 2));
  }
  if (filter) {
    std::vector<Form> g;
    for (auto& x : f)
      if (x.name.find(filter) != std::string::npos) g.push_back(x);
    return g;
  }
  return f;
}

// ------------------------------------------------------------------------------------------
// device helpers
__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// values in +-[0.25, 1): never zero
__global__ void fill_random_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i);
    const float mag = 0.25f + 0.75f * (float)(h >> 8) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((h & 1u) ? -mag : mag);
  }
}

// FP32 reference of sampled rows of one dW[e]: C[i][c] = sum_m G[r0+m][off + i*stride] * X[r0+m][c],
// i < ns, c < K, m < M. 64 x 64 tile per block, 4 x 4 per thread.
__global__ void __launch_bounds__(256) ref_wgrad_kernel(const __nv_bfloat16* G, const __nv_bfloat16* X, int N, int K,
                                                        int r0, int M, int off, int stride, int ns, float* C) {
  __shared__ float As[16][64];
  __shared__ float Bs[16][64];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int i0 = blockIdx.y * 64, c0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int m0 = 0; m0 < M; m0 += 16) {
    for (int t = threadIdx.x; t < 16 * 64; t += 256) {
      const int mm = t / 64, ii = t % 64;
      const int m = m0 + mm;
      const int i = i0 + ii, c = c0 + ii;
      As[mm][ii] = (m < M && i < ns) ? __bfloat162float(G[(int64_t)(r0 + m) * N + off + (int64_t)i * stride]) : 0.f;
      Bs[mm][ii] = (m < M && c < K) ? __bfloat162float(X[(int64_t)(r0 + m) * K + c]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int mm = 0; mm < 16; ++mm) {
      float a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        a[u] = As[mm][ty + 16 * u];
        b[u] = Bs[mm][tx + 16 * u];
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[u][v] = fmaf(a[u], b[v], acc[u][v]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int i = i0 + ty + 16 * u, c = c0 + tx + 16 * v;
      if (i < ns && c < K) C[(int64_t)i * K + c] = acc[u][v];
    }
}

struct CheckAcc {
  double err2, ref2, pert2;
  unsigned long long nonfinite, nonzero_empty, sampled;
};

__global__ void check_kernel(const void* out, int f32, int64_t total, int N, int K, const float* ref, int ns, int off,
                             int stride, const uint8_t* empty, CheckAcc* res) {
  double err2 = 0, ref2 = 0, pert2 = 0;
  unsigned long long nonfinite = 0, nonzero_empty = 0, sampled = 0;
  const int64_t nk = (int64_t)N * K;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = idx / nk;
    const int64_t rem = idx - e * nk;
    const int n = (int)(rem / K);
    const int c = (int)(rem - (int64_t)n * K);
    float v;
    uint32_t bits;
    if (f32) {
      bits = reinterpret_cast<const uint32_t*>(out)[idx];
      v = __uint_as_float(bits);
    } else {
      bits = reinterpret_cast<const uint16_t*>(out)[idx];
      v = __uint_as_float(bits << 16);
    }
    if (!isfinite(v)) {
      ++nonfinite;
      continue;
    }
    if (empty[e] && bits != 0u) ++nonzero_empty;
    if (n >= off && (n - off) % stride == 0) {
      const int i = (n - off) / stride;
      if (i < ns) {
        const double r = ref[((int64_t)e * ns + i) * K + c];
        err2 += ((double)v - r) * ((double)v - r);
        pert2 += (1.02 * v - r) * (1.02 * v - r);
        ref2 += r * r;
        ++sampled;
      }
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    err2 += __shfl_xor_sync(0xffffffffu, err2, d);
    ref2 += __shfl_xor_sync(0xffffffffu, ref2, d);
    pert2 += __shfl_xor_sync(0xffffffffu, pert2, d);
    nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, d);
    nonzero_empty += __shfl_xor_sync(0xffffffffu, nonzero_empty, d);
    sampled += __shfl_xor_sync(0xffffffffu, sampled, d);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&res->err2, err2);
    atomicAdd(&res->ref2, ref2);
    atomicAdd(&res->pert2, pert2);
    atomicAdd(&res->nonfinite, nonfinite);
    atomicAdd(&res->nonzero_empty, nonzero_empty);
    atomicAdd(&res->sampled, sampled);
  }
}

// number of 32-bit words where a != b (b != nullptr) or a != value
__global__ void count_ne_kernel(const uint32_t* a, const uint32_t* b, uint32_t value, int64_t n,
                                unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    c += a[i] != (b ? b[i] : value);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) c += __shfl_xor_sync(0xffffffffu, c, d);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

// ------------------------------------------------------------------------------------------
// host helpers
static CUtensorMap map_2d(const void* base, uint64_t inner, uint64_t rows, uint32_t box_inner, uint32_t box_rows) {
  CUtensorMap m;
  cuuint64_t dims[2] = {inner, rows};
  cuuint64_t strides[1] = {inner * 2};
  cuuint32_t box[2] = {box_inner, box_rows};
  cuuint32_t es[2] = {1, 1};
  const CUresult r = g_encode_tiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                                    box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed (%d) inner=%llu rows=%llu\n", (int)r, (unsigned long long)inner,
                (unsigned long long)rows);
    std::printf("%d passed, %d failed\n", g_passed, g_failed + 1);
    std::exit(3);
  }
  return m;
}

static int g_num_sms = 0;
static void* g_ws = nullptr;
static uint64_t g_ws_bytes = 0;
static int g_ws_slots = 0;
static unsigned long long* g_count = nullptr;  // device scratch counter
static CheckAcc* g_check = nullptr;            // device scratch

struct Problem {
  const __nv_bfloat16* g;
  const __nv_bfloat16* x;
  void* out;
  const int32_t* offs;
  int E, N, K, cap;
  bool leading_zero;
};

static GroupedGemmWgradParams make_params(const Form& f, const Problem& pr, int ws_mode_override = -1,
                                          int slots_override = -1) {
  GroupedGemmWgradParams p;
  std::memset(&p, 0, sizeof(p));
  const uint64_t rows = (uint64_t)std::max(pr.cap, 1);  // cap = 0: maps over one (never read) row
  p.tmap_g = map_2d(pr.g, (uint64_t)pr.N, rows, 64, 64);
  p.tmap_x = map_2d(pr.x, (uint64_t)pr.K, rows, 64, 64);
  p.out = pr.out;
  p.offs = pr.offs;
  p.num_groups = pr.E;
  p.sum_m_capacity = pr.cap;
  p.n = pr.N;
  p.k = pr.K;
  p.offs_has_leading_zero = pr.leading_zero ? 1 : 0;
  p.num_workers = g_num_sms;
  const int mode = ws_mode_override >= 0 ? ws_mode_override : f.ws_mode;
  if (mode == 1) {
    p.workspace = nullptr;
    p.workspace_bytes = 0;
    p.ws_slots = 0;
  } else {
    p.workspace = g_ws;
    p.workspace_bytes = g_ws_bytes;
    p.ws_slots = mode == 2 ? 0 : (slots_override >= 0 ? slots_override : g_ws_slots);
  }
  return p;
}

static void launch(const Form& f, const GroupedGemmWgradParams& p, int grid, cudaStream_t s) {
  f.fn<<<grid, f.threads, f.smem, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

static void sync_or_die(cudaStream_t s, const std::string& what) {
  static const double seconds =
      std::getenv("CAKE_GG_WATCHDOG_S") ? std::atof(std::getenv("CAKE_GG_WATCHDOG_S")) : 20.0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      std::printf("FATAL: %s: %s (%s)\n%d passed, %d failed\n", what.c_str(), cudaGetErrorName(e),
                  cudaGetErrorString(e), g_passed, g_failed + 1);
      std::fflush(stdout);
      std::exit(4);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds) {
      std::printf("FATAL: %s: no completion after %.0f s (deadlock?)\n%d passed, %d failed\n", what.c_str(), seconds,
                  g_passed, g_failed + 1);
      std::fflush(stdout);
      std::exit(5);
    }
  }
}

static unsigned long long count_ne(const void* a, const void* b, uint32_t value, int64_t words, cudaStream_t s = 0) {
  CUDA_CHECK(cudaMemsetAsync(g_count, 0, sizeof(unsigned long long), s));
  if (words > 0)
    count_ne_kernel<<<1024, 256, 0, s>>>(reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(b),
                                         value, words, g_count);
  CUDA_CHECK(cudaGetLastError());
  unsigned long long c = 0;
  CUDA_CHECK(cudaMemcpyAsync(&c, g_count, sizeof(c), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return c;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 2862933555777941757ULL + 3037000493ULL) {}
  uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(s >> 33);
  }
  double uniform() { return (next() + 0.5) / 2147483648.0; }
  double gauss() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

static std::vector<int> imbalanced_groups(int T, int E, uint64_t seed, double sigma = 1.0) {
  Rng rng(seed);
  std::vector<double> w(E);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += (w[e] = std::exp(sigma * rng.gauss()));
  std::vector<int> g(E);
  int used = 0;
  std::vector<std::pair<double, int>> rem;
  for (int e = 0; e < E; ++e) {
    const double x = T * w[e] / sum;
    g[e] = (int)std::floor(x);
    used += g[e];
    rem.push_back({x - g[e], e});
  }
  std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (int i = 0; used < T; ++i, ++used) g[rem[i % E].second] += 1;
  return g;
}

// Host replica of the scheduler's chunking (for the statistics printed per case).
struct SplitStats {
  long long units = 0, split_tiles = 0;
  int max_chunks = 1, kb_chunk_max = 0;
};
static SplitStats split_stats(const std::vector<int>& groups, int N, int K, int bm, int bn, int slots, int q = 8,
                              int min_kb = 32) {
  SplitStats s;
  const long long tiles = (long long)((N + bm - 1) / bm) * ((K + bn - 1) / bn);
  long long rows = 0;
  for (int m : groups) rows += m;
  long long kbl = 0x7fffffff;
  if (slots > 0 && tiles > 0) {
    const long long work = tiles * rows;
    const long long w = (long long)g_num_sms * q * 64;
    kbl = std::max<long long>({(long long)min_kb, (work + w - 1) / w, (work + slots * 64LL - 1) / (slots * 64LL)});
  }
  s.kb_chunk_max = (int)std::min<long long>(kbl, 0x7fffffff);
  for (int m : groups) {
    const long long kb = (m + 63) / 64;
    long long chunks = 1;
    if (kb > kbl) {
      const long long sp = (kb + kbl - 1) / kbl;
      const long long ckb = (kb + sp - 1) / sp;
      chunks = (kb + ckb - 1) / ckb;
    }
    s.units += chunks * tiles;
    if (chunks > 1) s.split_tiles += tiles;
    s.max_chunks = std::max<int>(s.max_chunks, (int)chunks);
  }
  return s;
}

// ------------------------------------------------------------------------------------------
// correctness
struct Case {
  std::string name;
  int N, K;
  std::vector<int> groups;
  int extra_rows;
  bool leading_zero;
  bool sampled;  // compare every 7th row only (big shapes)
};

static void report(bool ok, const std::string& line) {
  (ok ? g_passed : g_failed) += 1;
  std::printf("[%s] %s\n", ok ? "PASS" : "FAIL", line.c_str());
  std::fflush(stdout);
}

static void run_case(const Case& c, const std::vector<Form>& forms, uint64_t seed, bool small_mode) {
  const int E = (int)c.groups.size();
  std::vector<int> offs_host;
  int total = 0;
  if (c.leading_zero) offs_host.push_back(0);
  for (int g : c.groups) offs_host.push_back(total += g);
  const int cap = total + c.extra_rows;
  const int rows_alloc = std::max(cap, 1);
  const int64_t out_elems = (int64_t)E * c.N * c.K;
  const int64_t guard_bytes = 65536;
  const int64_t out_bytes_max = out_elems * 4 + guard_bytes;
  const int stride = c.sampled ? 7 : 1, off = c.sampled ? 3 : 0;
  const int ns = c.N > off ? (c.N - off + stride - 1) / stride : 0;

  __nv_bfloat16 *d_g = nullptr, *d_x = nullptr;
  void *d_out = nullptr, *d_first = nullptr;
  int32_t* d_offs = nullptr;
  float* d_ref = nullptr;
  uint8_t* d_empty = nullptr;
  CUDA_CHECK(cudaMalloc(&d_g, (size_t)rows_alloc * c.N * 2));
  CUDA_CHECK(cudaMalloc(&d_x, (size_t)rows_alloc * c.K * 2));
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)out_bytes_max));
  CUDA_CHECK(cudaMalloc(&d_first, (size_t)out_bytes_max));
  CUDA_CHECK(cudaMalloc(&d_offs, std::max<size_t>(1, offs_host.size()) * 4));
  CUDA_CHECK(cudaMalloc(&d_ref, std::max<size_t>(1, (size_t)E * ns * c.K) * 4));
  CUDA_CHECK(cudaMalloc(&d_empty, std::max(E, 1)));
  if (!offs_host.empty())
    CUDA_CHECK(cudaMemcpy(d_offs, offs_host.data(), offs_host.size() * 4, cudaMemcpyHostToDevice));
  std::vector<uint8_t> empty_host(std::max(E, 1), 0);
  for (int e = 0; e < E; ++e) empty_host[e] = c.groups[e] == 0;
  CUDA_CHECK(cudaMemcpy(d_empty, empty_host.data(), empty_host.size(), cudaMemcpyHostToDevice));
  fill_random_bf16<<<2048, 256>>>(d_g, (int64_t)rows_alloc * c.N, seed * 3 + 1);
  fill_random_bf16<<<2048, 256>>>(d_x, (int64_t)rows_alloc * c.K, seed * 3 + 2);
  CUDA_CHECK(cudaGetLastError());
  // reference
  CUDA_CHECK(cudaMemset(d_ref, 0, std::max<size_t>(1, (size_t)E * ns * c.K) * 4));
  {
    int row = 0;
    for (int e = 0; e < E; ++e) {
      const int m = c.groups[e];
      if (m > 0 && ns > 0) {
        dim3 grid((c.K + 63) / 64, (ns + 63) / 64);
        ref_wgrad_kernel<<<grid, 256>>>(d_g, d_x, c.N, c.K, row, m, off, stride, ns,
                                        d_ref + (size_t)e * ns * c.K);
        CUDA_CHECK(cudaGetLastError());
      }
      row += m;
    }
    sync_or_die(0, c.name + " reference");
  }
  const SplitStats st = split_stats(c.groups, c.N, c.K, 128, 256, g_ws_slots);
  std::printf("-- case %s: E=%d N=%d K=%d rows=%d cap=%d | 128x256 units=%lld split_tiles=%lld max_chunks=%d "
              "chunk<=%d kb\n",
              c.name.c_str(), E, c.N, c.K, total, cap, st.units, st.split_tiles, st.max_chunks, st.kb_chunk_max);

  cudaStream_t side;
  CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const int64_t ws_words = (int64_t)(g_ws_bytes / 4);

  struct Variant {
    const Form* f;
    int ws_mode;  // -1: the form's own
    int slots;    // -1: default
    const char* tag;
  };
  std::vector<Variant> variants;
  for (const Form& f : forms) variants.push_back({&f, -1, -1, ""});
  if (small_mode || !c.sampled) {
    for (const Form& f : forms) {
      if (f.name == "det_128x256_bf16") {
        variants.push_back({&f, 1, -1, "+no_workspace"});
        variants.push_back({&f, 0, 2, "+2_slots"});
      }
      if (f.name == "fast_128x256_f32") variants.push_back({&f, 0, 2, "+2_slots"});
    }
  }

  for (const Variant& v : variants) {
    const Form& f = *v.f;
    const int64_t out_bytes = out_elems * (f.f32 ? 4 : 2);
    const int64_t words = out_bytes / 4;
    Problem pr{d_g, d_x, d_out, d_offs, E, c.N, c.K, cap, c.leading_zero};
    const GroupedGemmWgradParams p = make_params(f, pr, v.ws_mode, v.slots);
    const std::string label = c.name + " " + f.name + v.tag;

    CUDA_CHECK(cudaMemset(d_out, 0xFF, (size_t)(out_bytes + guard_bytes)));
    launch(f, p, g_num_sms, 0);
    sync_or_die(0, label);

    CUDA_CHECK(cudaMemset(g_check, 0, sizeof(CheckAcc)));
    if (out_elems > 0)
      check_kernel<<<2048, 256>>>(d_out, f.f32 ? 1 : 0, out_elems, c.N, c.K, d_ref, ns, off, stride, d_empty, g_check);
    CUDA_CHECK(cudaGetLastError());
    CheckAcc r;
    CUDA_CHECK(cudaMemcpy(&r, g_check, sizeof(r), cudaMemcpyDeviceToHost));
    const unsigned long long guard_broken =
        count_ne(reinterpret_cast<uint8_t*>(d_out) + out_bytes, nullptr, 0xFFFFFFFFu, guard_bytes / 4);
    const unsigned long long ws_dirty = g_ws ? count_ne(g_ws, nullptr, 0u, ws_words) : 0;

    // repeatability
    std::string rep = "-";
    bool repeat_ok = true;
    if (f.det) {
      CUDA_CHECK(cudaMemcpy(d_first, d_out, (size_t)out_bytes, cudaMemcpyDeviceToDevice));
      // runs 2 and 3 on the default stream, one on a side stream, one (not too big) with grid 37
      const bool grid_run = total <= 300000;
      int diffs = 0;
      for (int rr = 0; rr < (grid_run ? 4 : 3); ++rr) {
        cudaStream_t s = rr == 2 ? side : 0;
        const int grid = rr == 3 ? 37 : g_num_sms;
        CUDA_CHECK(cudaMemsetAsync(d_out, 0xFF, (size_t)out_bytes, s));
        launch(f, p, grid, s);
        sync_or_die(s, label + " (repeat)");
        diffs += count_ne(d_out, d_first, 0, words, s) != 0;
      }
      repeat_ok = diffs == 0;
      rep = repeat_ok ? (grid_run ? "bitwise_same(3 runs+side stream+grid 37)" : "bitwise_same(3 runs+side stream)")
                      : "DIFFERS";
    } else {
      CUDA_CHECK(cudaMemcpy(d_first, d_out, (size_t)out_bytes, cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemset(d_out, 0xFF, (size_t)out_bytes));
      launch(f, p, g_num_sms, side);
      sync_or_die(side, label + " (repeat)");
      const unsigned long long d = count_ne(d_out, d_first, 0, words);
      char b[64];
      std::snprintf(b, sizeof(b), "rerun_words_differ=%llu", d);
      rep = b;
    }
    const unsigned long long ws_dirty2 = g_ws ? count_ne(g_ws, nullptr, 0u, ws_words) : 0;

    const double rel = r.ref2 > 0 ? std::sqrt(r.err2 / r.ref2) : 0.0;
    const double rel_pert = r.ref2 > 0 ? std::sqrt(r.pert2 / r.ref2) : 1.0;
    const bool any_nonempty = total > 0;
    const bool ok = r.nonfinite == 0 && r.nonzero_empty == 0 && guard_broken == 0 && ws_dirty == 0 &&
                    ws_dirty2 == 0 && repeat_ok && rel < 1e-2 && (!any_nonempty || rel_pert >= 1e-2);
    char buf[768];
    std::snprintf(buf, sizeof(buf),
                  "%-28s %-24s rel_rms=%.3e (2%%-perturbed %.3e, %llu sampled) nonfinite=%llu "
                  "nonzero_in_empty=%llu guard_broken=%llu ws_dirty=%llu/%llu %s",
                  (f.name + v.tag).c_str(), c.name.c_str(), rel, rel_pert, r.sampled, r.nonfinite, r.nonzero_empty,
                  guard_broken, ws_dirty, ws_dirty2, rep.c_str());
    report(ok, buf);
  }
  CUDA_CHECK(cudaStreamDestroy(side));
  CUDA_CHECK(cudaFree(d_g));
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_out));
  CUDA_CHECK(cudaFree(d_first));
  CUDA_CHECK(cudaFree(d_offs));
  CUDA_CHECK(cudaFree(d_ref));
  CUDA_CHECK(cudaFree(d_empty));
}

struct MoeShape {
  int H, I, E;
};
static const MoeShape kMoeShapes[] = {{2048, 768, 16}, {2048, 1536, 8}, {4096, 2048, 9}, {7168, 2048, 8}};
static const int kTs[] = {4096, 16384, 65536};

static const char* g_case_filter = nullptr;

static void correctness(const std::vector<Form>& forms, bool small_only) {
  std::vector<Case> cases;
  cases.push_back({"g[300,0,1,700]", 256, 512, {300, 0, 1, 700}, 37, false, false});
  cases.push_back({"g[1,257,511,4099,0,33]", 384, 192, {1, 257, 511, 4099, 0, 33}, 5, false, false});
  cases.push_back({"g[1,2,3,0,4]", 128, 128, {1, 2, 3, 0, 4}, 64, false, false});
  cases.push_back({"g[6145,0,12289]", 512, 256, {6145, 0, 12289}, 11, false, false});
  cases.push_back({"all_empty", 128, 128, {0, 0, 0, 0}, 100, false, false});
  cases.push_back({"sum_m=0", 64, 72, {0, 0, 0}, 0, false, false});
  cases.push_back({"one_hot", 256, 256, {0, 0, 5000, 0, 0, 0}, 3, false, false});
  // one group, one output tile: a 47-link det chain (2 chunks with the 2-slot workspace)
  cases.push_back({"single_12000", 128, 128, {12000}, 0, false, false});
  cases.push_back({"N200_K264", 200, 264, {300, 0, 1, 700, 129}, 9, false, false});
  cases.push_back({"N72_K136_tiny", 72, 136, {5, 64, 0, 65, 128, 1}, 2, false, false});
  cases.push_back({"m_indptr[300,0,1,700]", 192, 320, {300, 0, 1, 700}, 21, true, false});
  {
    Rng rng(77);
    std::vector<int> g(1500);
    for (int& x : g) x = (rng.next() % 4 == 0) ? 0 : (int)(rng.next() % 41);
    cases.push_back({"E1500_small_groups", 136, 72, g, 17, false, false});
  }
  {
    Rng rng(78);
    std::vector<int> g(1100);
    for (int& x : g) x = (rng.next() % 3 == 0) ? 0 : (int)(rng.next() % 300);
    g[17] = 9000;  // one big group among many small: splits with span > 1 table slots
    cases.push_back({"E1100_one_big", 264, 200, g, 0, false, false});
  }
  if (!small_only) {
    for (const MoeShape& s : kMoeShapes)
      for (int wsel = 0; wsel < 2; ++wsel)
        for (int T : kTs) {
          const int N = wsel == 0 ? 2 * s.I : s.H;
          const int K = wsel == 0 ? s.H : s.I;
          char name[96];
          std::snprintf(name, sizeof(name), "moe(%d,%d,%d)_%s_T%d", s.H, s.I, s.E, wsel == 0 ? "w13" : "w2", T);
          cases.push_back({name, N, K, imbalanced_groups(T, s.E, 1000 + T + 7 * s.E + N), 0, false, true});
        }
  }
  uint64_t seed = 1;
  for (const Case& c : cases) {
    int64_t rows = 0;
    for (int g : c.groups) rows += g;
    const bool small = rows <= 12000 && !c.sampled;
    const bool selected = !g_case_filter || c.name.find(g_case_filter) != std::string::npos;
    if ((!small_only || small) && selected) run_case(c, forms, seed, small_only);
    ++seed;
  }
}

// ------------------------------------------------------------------------------------------
// timing
static void timing(const std::vector<Form>& forms) {
  int maxN = 0, maxK = 0, maxE = 0;
  for (const MoeShape& s : kMoeShapes) {
    maxN = std::max({maxN, 2 * s.I, s.H});
    maxK = std::max({maxK, 2 * s.I, s.H});
    maxE = std::max(maxE, s.E);
  }
  const int Tmax = 65536;
  size_t max_out = 0;
  for (const MoeShape& s : kMoeShapes) max_out = std::max(max_out, (size_t)s.E * 2 * s.I * s.H * 4);
  __nv_bfloat16 *d_g, *d_x;
  void* d_out;
  int32_t* d_offs;
  void* d_flush;
  const size_t flush_bytes = 256ull << 20;
  CUDA_CHECK(cudaMalloc(&d_g, (size_t)Tmax * maxN * 2));
  CUDA_CHECK(cudaMalloc(&d_x, (size_t)Tmax * maxK * 2));
  CUDA_CHECK(cudaMalloc(&d_out, max_out));
  CUDA_CHECK(cudaMalloc(&d_offs, 64 * 4));
  CUDA_CHECK(cudaMalloc(&d_flush, flush_bytes));
  fill_random_bf16<<<4096, 256>>>(d_g, (int64_t)Tmax * maxN, 99);
  fill_random_bf16<<<4096, 256>>>(d_x, (int64_t)Tmax * maxK, 98);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  CUDA_CHECK(cudaEventCreate(&ev0));
  CUDA_CHECK(cudaEventCreate(&ev1));
  std::vector<double> logsum(forms.size(), 0.0);
  int rows_timed = 0;

  std::printf("\n# timing: TFLOP/s = 2*sum_m*N*K / median of 15 launches per form, forms interleaved (CUDA events "
              "around the kernel alone; a 256 MB memset before each launch evicts L2), random imbalanced groups "
              "(log-normal, sigma 1)\n");
  for (const MoeShape& sh : kMoeShapes) {
    for (int wsel = 0; wsel < 2; ++wsel) {
      const int N = wsel == 0 ? 2 * sh.I : sh.H;
      const int K = wsel == 0 ? sh.H : sh.I;
      for (int T : kTs) {
        const std::vector<int> g = imbalanced_groups(T, sh.E, 1000 + T + 7 * sh.E + N);
        std::vector<int32_t> offs;
        int acc = 0;
        for (int x : g) offs.push_back(acc += x);
        CUDA_CHECK(cudaMemcpy(d_offs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
        const double flops = 2.0 * T * (double)N * K;
        const SplitStats st = split_stats(g, N, K, 128, 256, g_ws_slots);
        std::string line;
        char buf[256];
        std::snprintf(buf, sizeof(buf), "(%d,%d,%2d) %-3s N=%-4d K=%-4d T=%-5d units=%-5lld split=%-4lld |", sh.H, sh.I,
                      sh.E, wsel == 0 ? "w13" : "w2", N, K, T, st.units, st.split_tiles);
        line += buf;
        // forms interleaved round-robin inside each row, so that clock / thermal drift
        // over the run does not favour the forms measured first
        std::vector<GroupedGemmWgradParams> ps;
        for (const Form& f : forms) {
          Problem pr{d_g, d_x, d_out, d_offs, sh.E, N, K, T, false};
          ps.push_back(make_params(f, pr));
          for (int i = 0; i < 2; ++i) launch(f, ps.back(), g_num_sms, s);
        }
        sync_or_die(s, "warm-up");
        std::vector<std::vector<float>> ms(forms.size());
        for (int i = 0; i < 15; ++i) {
          for (size_t fi = 0; fi < forms.size(); ++fi) {
            CUDA_CHECK(cudaMemsetAsync(d_flush, i & 0xFF, flush_bytes, s));
            CUDA_CHECK(cudaEventRecord(ev0, s));
            launch(forms[fi], ps[fi], g_num_sms, s);
            CUDA_CHECK(cudaEventRecord(ev1, s));
            sync_or_die(s, forms[fi].name);
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, ev0, ev1));
            ms[fi].push_back(t);
          }
        }
        for (size_t fi = 0; fi < forms.size(); ++fi) {
          std::sort(ms[fi].begin(), ms[fi].end());
          const double med = ms[fi][7];
          const double tf = flops / (med * 1e-3) / 1e12;
          logsum[fi] += std::log(tf);
          std::snprintf(buf, sizeof(buf), " %s %5.1f (%6.0f us) |", forms[fi].name.c_str(), tf, med * 1e3);
          line += buf;
        }
        ++rows_timed;
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
    }
  }
  std::printf("# geomean TFLOP/s over %d rows:", rows_timed);
  for (size_t fi = 0; fi < forms.size(); ++fi)
    std::printf(" %s %.1f |", forms[fi].name.c_str(), std::exp(logsum[fi] / std::max(rows_timed, 1)));
  std::printf("\n");
  CUDA_CHECK(cudaFree(d_g));
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_out));
  CUDA_CHECK(cudaFree(d_offs));
  CUDA_CHECK(cudaFree(d_flush));
  CUDA_CHECK(cudaStreamDestroy(s));
}

int main(int argc, char** argv) {
  bool do_check = true, do_time = true, extra = false, small_only = false;
  const char* filter = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-time")) do_time = false;
    if (!std::strcmp(argv[i], "--time")) do_check = false;
    if (!std::strcmp(argv[i], "--extra-forms")) extra = true;
    if (!std::strcmp(argv[i], "--small")) small_only = true;
    if (!std::strcmp(argv[i], "--form") && i + 1 < argc) filter = argv[++i];
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) g_case_filter = argv[++i];
  }
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaFree(nullptr));
  load_driver_entry_points();
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_num_sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  if (prop.major != 9) {
    std::printf("this harness needs an sm_90 device\n0 passed, 1 failed\n");
    return 1;
  }
  const std::vector<Form> forms = all_forms(extra, filter);
  int max_bn = 0;
  for (const Form& f : forms) {
    CUDA_CHECK(cudaFuncSetAttribute(f.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)f.smem));
    cudaFuncAttributes a;
    CUDA_CHECK(cudaFuncGetAttributes(&a, f.fn));
    std::printf("form %-28s threads=%d dyn_smem=%u regs=%d local=%zu\n", f.name.c_str(), f.threads, f.smem,
                a.numRegs, a.localSizeBytes);
    max_bn = std::max(max_bn, f.bn);
  }
  // one workspace for every form (all-zero between launches), zeroed once here
  g_ws_slots = cake_moe::sm90::grouped_gemm_wgrad_default_slots(g_num_sms);
  g_ws_bytes = cake_moe::sm90::grouped_gemm_wgrad_workspace_bytes(128, std::max(max_bn, 128), g_ws_slots);
  CUDA_CHECK(cudaMalloc(&g_ws, g_ws_bytes));
  CUDA_CHECK(cudaMemset(g_ws, 0, g_ws_bytes));
  CUDA_CHECK(cudaMalloc(&g_count, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMalloc(&g_check, sizeof(CheckAcc)));
  std::printf("workspace: %d slots, %.1f MB\n", g_ws_slots, g_ws_bytes / 1e6);

  if (do_check) correctness(forms, small_only);
  if (do_time) timing(forms);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
