// Standalone correctness harness for the portable ragged BF16 grouped GEMM
// (fwd, dgrad, wgrad bf16/fp32; instantiate_portable_example.cu).
//
// Build (from the repository root; any arch the entries are built for):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I cpp/kernels
//        cpp/kernels/grouped_gemm/harness/portable_grouped_gemm_harness.cu -o portable_harness
//   (for a B200/B300/R200 use code=sm_100a / sm_103a / sm_107a instead)
// Run: ./portable_harness           all correctness cases
//      ./portable_harness --small   skip the large cases (for compute-sanitizer:
//                                   compute-sanitizer --tool memcheck ./portable_harness --small)
//      ./portable_harness --time    also time fwd/dgrad/wgrad on a 16384 x 2048 x 2048, E = 8 problem
// Exit status 0 iff every check passed. Last line: "<n> passed, <m> failed".
//
// Checks, per case (group pattern, N, K, offset convention, grid):
//   * inputs random, never zero (+-[0.25, 1)); rows of x / g that belong to no
//     group are NaN, so any read of them into a result shows up;
//   * outputs poisoned with 0xFF bytes (NaN) before every launch;
//   * fwd / dgrad / wgrad(bf16) / wgrad(fp32) against an FP32 reference kernel:
//     finite, relative RMS error < 1e-2; the same metric must reject the
//     result scaled by 1.02 (a 2% perturbation);
//   * Y / dX rows outside every group (past the last end, before the first
//     begin, a guard band past the tensor) still poisoned; dW guard band
//     poisoned; dW of empty groups exactly +0 (bit pattern 0);
//   * bitwise repeatability: each op run again (re-poisoned) with the same grid
//     and with a small grid (3 CTAs) gives identical bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "grouped_gemm/instantiate_portable_example.cu"

using cake_moe::portable::PortableGroupedGemmConfig;
using cake_moe::portable::PortableGroupedGemmParams;
using bf16 = __nv_bfloat16;

#define CUDA_CHECK(x)                                                                           \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                                     \
      std::exit(3);                                                                             \
    }                                                                                           \
  } while (0)

// ------------------------------------------------------------------------------------------
// device helpers
__device__ __forceinline__ uint32_t mix32(uint64_t v) {
  v ^= v >> 31;
  v *= 0x7fb5d329728ea185ULL;
  v ^= v >> 27;
  v *= 0x81dadef4bc2dd44dULL;
  v ^= v >> 33;
  return static_cast<uint32_t>(v);
}

// rows [0, rows) x cols; row_group[r] < 0 (row in no group): NaN, else +-[0.25, 1)
__global__ void fill_operand(bf16* p, int rows, int cols, const int* row_group, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / cols);
    if (row_group != nullptr && row_group[r] < 0) {
      p[i] = __ushort_as_bfloat16(static_cast<unsigned short>(0x7FC0));
      continue;
    }
    const uint32_t h = mix32(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i));
    const float mag = 0.25f + 0.75f * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((h & 1u) ? -mag : mag);
  }
}

// FP32 references (one thread per output element, FP32 accumulation in order).
// Y[r][n] = sum_k X[r][k] * W[e][n][k]
__global__ void ref_fwd(const bf16* x, const bf16* w, const int* row_group, float* y, int rows, int N, int K) {
  const int64_t total = static_cast<int64_t>(rows) * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / N), n = static_cast<int>(i % N);
    const int e = row_group[r];
    if (e < 0) continue;
    const bf16* xr = x + static_cast<int64_t>(r) * K;
    const bf16* wr = w + (static_cast<int64_t>(e) * N + n) * K;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(wr[k]), acc);
    y[i] = acc;
  }
}

// dX[r][k] = sum_n G[r][n] * W[e][n][k]
__global__ void ref_dgrad(const bf16* g, const bf16* w, const int* row_group, float* dx, int rows, int N, int K) {
  const int64_t total = static_cast<int64_t>(rows) * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / K), k = static_cast<int>(i % K);
    const int e = row_group[r];
    if (e < 0) continue;
    const bf16* gr = g + static_cast<int64_t>(r) * N;
    const bf16* we = w + static_cast<int64_t>(e) * N * K + k;
    float acc = 0.f;
    for (int n = 0; n < N; ++n) acc = fmaf(__bfloat162float(gr[n]), __bfloat162float(we[static_cast<int64_t>(n) * K]), acc);
    dx[i] = acc;
  }
}

// dW[e][n][k] = sum_{m in group e} G[m][n] * X[m][k]
__global__ void ref_wgrad(const bf16* g, const bf16* x, const int* gbeg, const int* gend, float* dw, int E, int N,
                          int K) {
  const int64_t total = static_cast<int64_t>(E) * N * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i / (static_cast<int64_t>(N) * K));
    const int64_t rem = i - static_cast<int64_t>(e) * N * K;
    const int n = static_cast<int>(rem / K), k = static_cast<int>(rem % K);
    float acc = 0.f;
    for (int m = gbeg[e]; m < gend[e]; ++m)
      acc = fmaf(__bfloat162float(g[static_cast<int64_t>(m) * N + n]), __bfloat162float(x[static_cast<int64_t>(m) * K + k]),
                 acc);
    dw[i] = acc;
  }
}

// ------------------------------------------------------------------------------------------
// host helpers
static int g_passed = 0, g_failed = 0;

static void report(bool ok, const std::string& what, const std::string& detail) {
  (ok ? g_passed : g_failed)++;
  std::printf("[%s] %s%s%s\n", ok ? "PASS" : "FAIL", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stdout);
}

static float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t count = 0;
  explicit DevBuf(size_t n) : count(n) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  size_t bytes() const { return count * sizeof(T); }
  void poison() { CUDA_CHECK(cudaMemset(p, 0xFF, std::max<size_t>(count, 1) * sizeof(T))); }
  std::vector<T> get() const {
    std::vector<T> h(count);
    if (count) CUDA_CHECK(cudaMemcpy(h.data(), p, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
};

enum class Op { kFwd, kDgrad, kWgradBf16, kWgradF32 };
static const char* op_name(Op op) {
  switch (op) {
    case Op::kFwd: return "fwd";
    case Op::kDgrad: return "dgrad";
    case Op::kWgradBf16: return "wgrad_bf16";
    default: return "wgrad_f32";
  }
}

static void launch(Op op, const PortableGroupedGemmParams& p, int grid, cudaStream_t s = 0) {
  const dim3 block(PortableGroupedGemmConfig::kThreads);
  const size_t smem = PortableGroupedGemmConfig::kSmemBytes;
  switch (op) {
    case Op::kFwd: cake_gg_portable_fwd<<<grid, block, smem, s>>>(p); break;
    case Op::kDgrad: cake_gg_portable_dgrad<<<grid, block, smem, s>>>(p); break;
    case Op::kWgradBf16: cake_gg_portable_wgrad_bf16<<<grid, block, smem, s>>>(p); break;
    case Op::kWgradF32: cake_gg_portable_wgrad_f32<<<grid, block, smem, s>>>(p); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

static void set_smem_attributes() {
  const int smem = static_cast<int>(PortableGroupedGemmConfig::kSmemBytes);
  CUDA_CHECK(cudaFuncSetAttribute(cake_gg_portable_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_CHECK(cudaFuncSetAttribute(cake_gg_portable_dgrad, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_CHECK(cudaFuncSetAttribute(cake_gg_portable_wgrad_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_CHECK(cudaFuncSetAttribute(cake_gg_portable_wgrad_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

// error accumulator: relative RMS of out vs ref, and of 1.02 * out vs ref
struct ErrAcc {
  double err2 = 0, ref2 = 0, pert2 = 0;
  int64_t count = 0, nonfinite = 0;
  void add(float out, float ref) {
    if (!std::isfinite(out)) {
      ++nonfinite;
      return;
    }
    const double d = static_cast<double>(out) - ref;
    const double dp = 1.02 * static_cast<double>(out) - ref;
    err2 += d * d;
    ref2 += static_cast<double>(ref) * ref;
    pert2 += dp * dp;
    ++count;
  }
  double rel() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0.0); }
  double rel_pert() const { return ref2 > 0 ? std::sqrt(pert2 / ref2) : 0.0; }
};

static constexpr double kBudget = 1e-2;
static constexpr int kGuardRows = 8;        // rows past sum_m in Y / dX
static constexpr int64_t kGuardElems = 1024;  // elements past dW

static void report_accuracy(const std::string& what, const ErrAcc& a, bool expect_values) {
  char buf[256];
  if (a.count == 0 && a.nonfinite == 0) {
    report(!expect_values, what + " accuracy", expect_values ? "no elements compared" : "no group rows (nothing to compare)");
    return;
  }
  std::snprintf(buf, sizeof(buf), "rel RMS %.3e over %lld elements, %lld non-finite", a.rel(),
                static_cast<long long>(a.count), static_cast<long long>(a.nonfinite));
  report(a.nonfinite == 0 && a.rel() < kBudget, what + " accuracy", buf);
  std::snprintf(buf, sizeof(buf), "rel RMS of 1.02 x out = %.3e (must be >= %.0e)", a.rel_pert(), kBudget);
  report(a.nonfinite == 0 && a.rel_pert() >= kBudget, what + " 2% perturbation rejected", buf);
}

struct Case {
  std::string name;
  std::vector<int> offs;  // device offsets, as given to the kernel
  bool leading_zero = false;
  int num_groups = 0;
  int capacity = 0;  // sum_m
  int n = 0, k = 0;
  int grid = 0;  // 0: 2 x #SMs
  bool safety_only = false;  // overlapping groups: check bounds only
  bool big = false;
};

// cumulative ends (or m_indptr) from group sizes, plus `tail` rows past the last end
static Case make_case(const std::string& name, const std::vector<int>& sizes, int n, int k, bool leading_zero,
                      int tail = 37) {
  Case c;
  c.name = name;
  c.n = n;
  c.k = k;
  c.leading_zero = leading_zero;
  c.num_groups = static_cast<int>(sizes.size());
  int sum = 0;
  if (leading_zero) c.offs.push_back(0);
  for (int s : sizes) {
    sum += s;
    c.offs.push_back(sum);
  }
  c.capacity = sum + tail;
  for (int s : sizes) c.big |= s > 2000;
  return c;
}

static std::string shape_str(const Case& c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s [E=%d sum_m=%d N=%d K=%d %s]", c.name.c_str(), c.num_groups, c.capacity, c.n,
                c.k, c.leading_zero ? "indptr" : "ends");
  return buf;
}

static void run_case(const Case& c, int default_grid) {
  const int E = c.num_groups, cap = c.capacity, N = c.n, K = c.k;
  const int grid = c.grid > 0 ? c.grid : default_grid;
  const std::string tag = shape_str(c) + (c.grid > 0 ? " grid=" + std::to_string(grid) : std::string());
  std::printf("-- %s\n", tag.c_str());

  // host view of the groups, same clamping rule as the kernels
  std::vector<int> gbeg(std::max(E, 1), 0), gend(std::max(E, 1), 0);
  std::vector<int> row_group(std::max(cap, 1), -1);
  for (int e = 0; e < E; ++e) {
    int b = c.leading_zero ? c.offs[e] : (e == 0 ? 0 : c.offs[e - 1]);
    int en = c.leading_zero ? c.offs[e + 1] : c.offs[e];
    b = std::min(std::max(b, 0), cap);
    en = std::min(std::max(en, b), cap);
    gbeg[e] = b;
    gend[e] = en;
    for (int r = b; r < en; ++r) row_group[r] = e;
  }

  DevBuf<int> d_offs(std::max<size_t>(c.offs.size(), 1));
  if (!c.offs.empty())
    CUDA_CHECK(cudaMemcpy(d_offs.p, c.offs.data(), c.offs.size() * sizeof(int), cudaMemcpyHostToDevice));
  DevBuf<int> d_row_group(std::max(cap, 1)), d_gbeg(std::max(E, 1)), d_gend(std::max(E, 1));
  CUDA_CHECK(cudaMemcpy(d_row_group.p, row_group.data(), row_group.size() * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_gbeg.p, gbeg.data(), gbeg.size() * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_gend.p, gend.data(), gend.size() * sizeof(int), cudaMemcpyHostToDevice));

  const size_t nx = static_cast<size_t>(cap) * K, ng = static_cast<size_t>(cap) * N;
  const size_t nw = static_cast<size_t>(E) * N * K;
  DevBuf<bf16> x(nx), g(ng), w(nw);
  DevBuf<bf16> y(static_cast<size_t>(cap + kGuardRows) * N), dx(static_cast<size_t>(cap + kGuardRows) * K);
  DevBuf<bf16> dwb(nw + kGuardElems);
  DevBuf<float> dwf(nw + kGuardElems);
  DevBuf<float> ry(ng), rdx(nx), rdw(nw);
  const uint64_t seed = 0x1234ull + static_cast<uint64_t>(E) * 7919u + static_cast<uint64_t>(cap) * 104729u + N * 31u + K;
  if (nx) fill_operand<<<1024, 256>>>(x.p, cap, K, d_row_group.p, seed * 3 + 1);
  if (ng) fill_operand<<<1024, 256>>>(g.p, cap, N, d_row_group.p, seed * 3 + 2);
  if (nw) fill_operand<<<1024, 256>>>(w.p, E * N, K, nullptr, seed * 3 + 3);
  CUDA_CHECK(cudaGetLastError());
  if (!c.safety_only) {
    if (ng) ref_fwd<<<2048, 256>>>(x.p, w.p, d_row_group.p, ry.p, cap, N, K);
    if (nx) ref_dgrad<<<2048, 256>>>(g.p, w.p, d_row_group.p, rdx.p, cap, N, K);
    if (nw) ref_wgrad<<<2048, 256>>>(g.p, x.p, d_gbeg.p, d_gend.p, rdw.p, E, N, K);
    CUDA_CHECK(cudaGetLastError());
  }
  CUDA_CHECK(cudaDeviceSynchronize());

  PortableGroupedGemmParams p;
  std::memset(&p, 0, sizeof(p));
  p.x = x.p;
  p.g = g.p;
  p.w = w.p;
  p.offs = d_offs.p;
  p.num_groups = E;
  p.sum_m = cap;
  p.n = N;
  p.k = K;
  p.offs_has_leading_zero = c.leading_zero ? 1 : 0;

  for (Op op : {Op::kFwd, Op::kDgrad, Op::kWgradBf16, Op::kWgradF32}) {
    const std::string what = tag + " " + op_name(op);
    const bool is_w = op == Op::kWgradBf16 || op == Op::kWgradF32;
    const bool is_f32 = op == Op::kWgradF32;
    void* outp = op == Op::kFwd ? static_cast<void*>(y.p)
                 : op == Op::kDgrad ? static_cast<void*>(dx.p)
                 : is_f32 ? static_cast<void*>(dwf.p)
                          : static_cast<void*>(dwb.p);
    const size_t out_bytes = op == Op::kFwd ? y.bytes() : op == Op::kDgrad ? dx.bytes() : is_f32 ? dwf.bytes() : dwb.bytes();
    auto run_once = [&](int grid_n) -> std::vector<uint8_t> {
      CUDA_CHECK(cudaMemset(outp, 0xFF, std::max<size_t>(out_bytes, 1)));
      PortableGroupedGemmParams q = p;
      q.out = outp;
      launch(op, q, grid_n);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint8_t> h(out_bytes);
      if (out_bytes) CUDA_CHECK(cudaMemcpy(h.data(), outp, out_bytes, cudaMemcpyDeviceToHost));
      return h;
    };
    const std::vector<uint8_t> first = run_once(grid);

    if (!is_w) {
      const int cols = op == Op::kFwd ? N : K;
      const std::vector<float> ref = c.safety_only ? std::vector<float>() : (op == Op::kFwd ? ry.get() : rdx.get());
      const uint16_t* o = reinterpret_cast<const uint16_t*>(first.data());
      ErrAcc acc;
      int64_t touched_rows = 0;
      for (int r = 0; r < cap + kGuardRows; ++r) {
        const bool in_group = r < cap && row_group[r] >= 0;
        const uint16_t* orow = o + static_cast<size_t>(r) * cols;
        if (in_group) {
          if (!c.safety_only)
            for (int j = 0; j < cols; ++j) acc.add(bf16_bits_to_float(orow[j]), ref[static_cast<size_t>(r) * cols + j]);
        } else {
          bool poisoned = true;
          for (int j = 0; j < cols; ++j) poisoned &= orow[j] == 0xFFFF;
          touched_rows += !poisoned;
        }
      }
      if (!c.safety_only) report_accuracy(what, acc, std::count_if(row_group.begin(), row_group.begin() + cap, [](int v) { return v >= 0; }) > 0 && cols > 0);
      report(touched_rows == 0, what + " rows outside the groups untouched",
             std::to_string(touched_rows) + " rows written");
    } else {
      ErrAcc acc;
      int64_t nonzero_empty = 0, guard_touched = 0;
      const std::vector<float> ref = c.safety_only ? std::vector<float>() : rdw.get();
      for (int e = 0; e < E; ++e) {
        const bool empty = gend[e] == gbeg[e];
        for (size_t i = static_cast<size_t>(e) * N * K; i < static_cast<size_t>(e + 1) * N * K; ++i) {
          float v;
          bool zero_bits;
          if (is_f32) {
            uint32_t b;
            std::memcpy(&b, first.data() + i * 4, 4);
            std::memcpy(&v, &b, 4);
            zero_bits = b == 0;
          } else {
            uint16_t b;
            std::memcpy(&b, first.data() + i * 2, 2);
            v = bf16_bits_to_float(b);
            zero_bits = b == 0;
          }
          if (empty) nonzero_empty += !zero_bits;
          else if (!c.safety_only) acc.add(v, ref[i]);
        }
      }
      const size_t esz = is_f32 ? 4 : 2;
      for (size_t i = nw * esz; i < out_bytes; ++i) guard_touched += first[i] != 0xFF;
      bool any_nonempty = false;
      for (int e = 0; e < E; ++e) any_nonempty |= gend[e] > gbeg[e];
      if (!c.safety_only) report_accuracy(what, acc, any_nonempty && N > 0 && K > 0);
      report(nonzero_empty == 0, what + " empty groups exact +0", std::to_string(nonzero_empty) + " non-zero elements");
      report(guard_touched == 0, what + " guard band past dW untouched", std::to_string(guard_touched) + " bytes written");
    }

    // bitwise repeatability: same grid, then a 3-CTA grid (not for overlapping
    // groups, whose shared rows are written by two CTAs in either order)
    if (c.safety_only && !is_w) continue;
    const std::vector<uint8_t> again = run_once(grid);
    const std::vector<uint8_t> small = run_once(3);
    report(again == first, what + " bitwise repeatable (same grid)", "");
    report(small == first, what + " bitwise identical with 3 CTAs", "");
  }
}

static void time_ops(int default_grid) {
  const int E = 8, rows = 16384, N = 2048, K = 2048;
  std::vector<int> offs(E);
  for (int e = 0; e < E; ++e) offs[e] = (e + 1) * (rows / E);
  DevBuf<int> d_offs(E);
  CUDA_CHECK(cudaMemcpy(d_offs.p, offs.data(), E * sizeof(int), cudaMemcpyHostToDevice));
  DevBuf<bf16> x(static_cast<size_t>(rows) * K), g(static_cast<size_t>(rows) * N), w(static_cast<size_t>(E) * N * K);
  DevBuf<bf16> y(static_cast<size_t>(rows) * N), dx(static_cast<size_t>(rows) * K), dw(static_cast<size_t>(E) * N * K);
  DevBuf<float> dwf(static_cast<size_t>(E) * N * K);
  fill_operand<<<1024, 256>>>(x.p, rows, K, nullptr, 11);
  fill_operand<<<1024, 256>>>(g.p, rows, N, nullptr, 12);
  fill_operand<<<1024, 256>>>(w.p, E * N, K, nullptr, 13);
  CUDA_CHECK(cudaDeviceSynchronize());
  PortableGroupedGemmParams p;
  std::memset(&p, 0, sizeof(p));
  p.x = x.p;
  p.g = g.p;
  p.w = w.p;
  p.offs = d_offs.p;
  p.num_groups = E;
  p.sum_m = rows;
  p.n = N;
  p.k = K;
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  const double flops = 2.0 * rows * N * K;
  for (Op op : {Op::kFwd, Op::kDgrad, Op::kWgradBf16, Op::kWgradF32}) {
    p.out = op == Op::kFwd ? static_cast<void*>(y.p) : op == Op::kDgrad ? static_cast<void*>(dx.p)
            : op == Op::kWgradBf16 ? static_cast<void*>(dw.p) : static_cast<void*>(dwf.p);
    for (int i = 0; i < 3; ++i) launch(op, p, default_grid);
    const int iters = 20;
    CUDA_CHECK(cudaEventRecord(t0));
    for (int i = 0; i < iters; ++i) launch(op, p, default_grid);
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    ms /= iters;
    std::printf("time %-10s E=%d sum_m=%d N=%d K=%d grid=%d: %.3f ms, %.1f TFLOP/s\n", op_name(op), E, rows, N, K,
                default_grid, ms, flops / (ms * 1e-3) / 1e12);
  }
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
}

int main(int argc, char** argv) {
  bool small = false, timing = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) small = true;
    else if (!std::strcmp(argv[i], "--time")) timing = true;
    else {
      std::fprintf(stderr, "usage: %s [--small] [--time]\n", argv[0]);
      return 2;
    }
  }
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  set_smem_attributes();
  int occ = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cake_gg_portable_fwd, PortableGroupedGemmConfig::kThreads,
                                                           PortableGroupedGemmConfig::kSmemBytes));
  const int default_grid = 2 * sms;
  std::printf("device %s (sm_%d%d, %d SMs); portable grouped GEMM: %d threads, %u B smem, %d CTAs/SM resident, grid %d\n",
              prop.name, prop.major, prop.minor, sms, PortableGroupedGemmConfig::kThreads,
              PortableGroupedGemmConfig::kSmemBytes, occ, default_grid);

  std::vector<Case> cases;
  const int N0 = 256, K0 = 384;  // N != K so that a transposed operand shows up
  cases.push_back(make_case("g[300,0,1,700]", {300, 0, 1, 700}, N0, K0, false));
  cases.push_back(make_case("g[300,0,1,700]", {300, 0, 1, 700}, N0, K0, true));
  cases.push_back(make_case("g[1,257,511,4099,0,33]", {1, 257, 511, 4099, 0, 33}, N0, K0, true));
  cases.push_back(make_case("g[1,2,3,0,4]", {1, 2, 3, 0, 4}, N0, K0, false));
  {
    Case c = make_case("g[1,2,3,0,4]", {1, 2, 3, 0, 4}, N0, K0, false);
    c.grid = 1;  // one persistent CTA walks every tile
    cases.push_back(c);
  }
  cases.push_back(make_case("g[6145,0,12289]", {6145, 0, 12289}, N0, K0, false));
  cases.push_back(make_case("all-empty", {0, 0, 0, 0}, N0, K0, false, 16));
  cases.push_back(make_case("all-empty sum_m=0", {0, 0, 0}, N0, K0, true, 0));
  cases.push_back(make_case("E=0", {}, N0, K0, false, 16));
  cases.push_back(make_case("N/K tails g[300,0,1,700]", {300, 0, 1, 700}, 200, 264, false));
  cases.push_back(make_case("N/K tails g[1,257,511,4099,0,33]", {1, 257, 511, 4099, 0, 33}, 200, 264, true));
  cases.push_back(make_case("small N/K g[129,0,1,255]", {129, 0, 1, 255}, 8, 24, false));
  {
    std::vector<int> sizes(1100, 3);
    cases.push_back(make_case("E=1100 x 3 rows", sizes, 136, 72, false));
    Case c = make_case("E=1100 x 3 rows", sizes, 136, 72, true);
    c.grid = 5;
    cases.push_back(c);
  }
  {
    // offsets past sum_m / negative are clamped (monotonic: groups stay disjoint)
    Case c;
    c.name = "clamped offs [-7,100,150,99999,100000]";
    c.offs = {-7, 100, 150, 99999, 100000};
    c.leading_zero = true;
    c.num_groups = 4;
    c.capacity = 200;
    c.n = N0;
    c.k = K0;
    cases.push_back(c);
    // m_indptr that does not start at 0: rows before it are in no group
    Case d;
    d.name = "indptr starting at 5 [5,40,40,90]";
    d.offs = {5, 40, 40, 90};
    d.leading_zero = true;
    d.num_groups = 3;
    d.capacity = 120;
    d.n = N0;
    d.k = K0;
    cases.push_back(d);
    // non-monotonic offsets (a caller error): overlapping groups; only memory safety is promised
    Case s;
    s.name = "non-monotonic offs [100,50,99999,-7]";
    s.offs = {100, 50, 99999, -7};
    s.leading_zero = false;
    s.num_groups = 4;
    s.capacity = 200;
    s.n = N0;
    s.k = K0;
    s.safety_only = true;
    cases.push_back(s);
  }

  for (const Case& c : cases) {
    if (small && c.big) continue;
    run_case(c, default_grid);
  }
  if (timing) time_ops(default_grid);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
