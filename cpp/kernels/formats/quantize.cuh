// MXFP8 / MXFP4 / NVFP4 quantization (SPEC §3), bit-identical to cake_moe.reference.formats.
//
// One thread owns one 8-element chunk per iteration; the 4 (MX, block 32) or 2 (NVFP4, block 16)
// lanes of a scale block meet through warp shuffles for the amax. Each thread issues its loads
// for kUnroll iterations before any arithmetic so enough bytes are in flight to reach HBM
// bandwidth. The per-block scale work is spread over the block's lanes (lane j decides
// iteration j), which matters because the FP4 paths are instruction-bound on sm_90.
#pragma once
#include "common/numerics.cuh"
#include "formats/args.hpp"
#include "formats/chunk_io.cuh"

#include <type_traits>

namespace cake_moe::formats {

namespace detail {

constexpr float kInv448 = 1.0f / 448.0f;  // rounded once to FP32, as in the reference
constexpr float kInv6 = 1.0f / 6.0f;      // RN(1 / 6): div_by_reciprocal's reciprocal of 6

// Encodes one chunk and returns its packed element bytes (FP8: 8 bytes in a uint2; FP4: 4 bytes
// in .x). `carried` is what block_scale passes on besides `factor` (0 for blocks that encode as
// zeros): the scale byte for MX, the scale s as FP32 bits for NVFP4; `nv_global` is NVFP4's q.
template <Fmt F>
__device__ __forceinline__ uint2 encode_chunk(const float (&v)[kChunk], bool nan, uint32_t carried, float factor,
                                              float nv_global) {
  using namespace numerics;
  uint32_t w[2] = {0u, 0u};
  if constexpr (F == Fmt::kMxfp8) {
    if (nan) return make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
    if (carried == 0u) return make_uint2(0u, 0u);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i / 2] |= e4m3_encode2(__fmul_rn(v[2 * i], factor), __fmul_rn(v[2 * i + 1], factor)) << (16 * (i % 2));
  } else {
    // FP4: a NaN block, an all-zero MX block (code 0) and an NVFP4 block with s == 0 are zeros
    if (nan || factor == 0.0f) return make_uint2(0u, 0u);
    float y[kChunk];
    if constexpr (F == Fmt::kNvfp4) {
      // SPEC's order: (x * q) / s, each step rounded once. The division is exact for every
      // E4M3 s where x * q / s lies in [2^-126, 2^119]; past the top the quotient is NaN and
      // E2M1 rounding saturates it to 6, as the true one; below, it rounds to 0 either way.
      // The sign is the element's own (that of (x * q) / s, as q and s share theirs).
      const float s = __uint_as_float(carried);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) y[i] = div_by_reciprocal(__fmul_rn(v[i], nv_global), s, factor);
      w[0] = e2m1_pack8(y, v);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) y[i] = __fmul_rn(v[i], factor);   // exact: a power of two
      w[0] = e2m1_pack8(y, y);
    }
  }
  return make_uint2(w[0], w[1]);
}

// A block's scale byte `code`, the factor its elements are encoded with (2^(127 - code) for MX,
// a multiply; RN(1 / s) for NVFP4, div_by_reciprocal's reciprocal; 0 for blocks that encode as
// zeros: NaN, all-zero, NVFP4 s == 0) and what encode_chunk needs besides (`carried`).
template <Fmt F>
__device__ __forceinline__ void block_scale(float amax, int32_t rule, float nv_global, uint32_t& code,
                                            float& factor, uint32_t& carried) {
  using namespace numerics;
  const bool nan = amax != amax;
  if constexpr (F == Fmt::kNvfp4) {
    // s = e4m3((amax * q) / 6). From 2^20 on (and for inf / NaN) p itself rounds to the same
    // E4M3 code as p / 6 (both saturate), and keeps the division's range finite.
    const float p = __fmul_rn(amax, nv_global);
    code = nan ? uint32_t(kE4m3Nan) : e4m3_encode(fabsf(p) < 0x1p20f ? div_by_reciprocal(p, 6.0f, kInv6) : p);
    const float s = nan ? 0.0f : e4m3_decode(code);
    factor = s == 0.0f ? 0.0f : __frcp_rn(s);
    carried = __float_as_uint(s);
  } else {
    constexpr int emax = F == Fmt::kMxfp8 ? kE4m3Emax : kE2m1Emax;
    const float t = F == Fmt::kMxfp8 ? __fmul_rn(amax, kInv448) : __fdiv_rn(amax, 6.0f);
    code = nan ? kUe8m0Nan : (rule == int32_t(ScaleRule::kOcpFloor) ? ue8m0_ocp_floor(amax, emax) : ue8m0_round_up(t));
    factor = ue8m0_to_elem(code);
    carried = code;
  }
}

// MXFP8 requantization elsewhere (the family-B epilogue) needs only the byte and the factor.
template <Fmt F>
__device__ __forceinline__ void block_scale(float amax, int32_t rule, float nv_global, uint32_t& code,
                                            float& factor) {
  uint32_t carried;
  block_scale<F>(amax, rule, nv_global, code, factor, carried);
}

template <Fmt F>
__device__ __forceinline__ void store_elements(uint8_t* q, int64_t chunk, uint2 packed) {
  if constexpr (F == Fmt::kMxfp8) {
    __stcs(reinterpret_cast<uint2*>(q) + chunk, packed);
  } else {
    __stcs(reinterpret_cast<unsigned int*>(q) + chunk, packed.x);
  }
}

// Zero the swizzled layout's padding (rows up to a multiple of 128, scale columns up to a
// multiple of 4) so the whole scale buffer is defined; grid-stride over the padding bytes.
__device__ __forceinline__ void zero_scale_padding(uint8_t* scale, int64_t rows, int64_t cols_sf) {
  const int64_t rows_p = round_up(rows, 128), cols_p = round_up(cols_sf, 4);
  const int64_t pad_rows = (rows_p - rows) * cols_p;        // whole padded rows
  const int64_t pad_cols = rows * (cols_p - cols_sf);       // tail columns of real rows
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pad_rows + pad_cols; i += stride) {
    int64_t r, c;
    if (i < pad_rows) {
      r = rows + i / cols_p;
      c = i % cols_p;
    } else {
      const int64_t j = i - pad_rows, w = cols_p - cols_sf;
      r = j / w;
      c = cols_sf + j % w;
    }
    scale[swizzled_scale_offset(r, c, cols_p)] = 0;
  }
}

}  // namespace detail

template <Fmt F, typename In, bool kSwizzled>
__device__ __forceinline__ void quantize(const QuantizeArgs& a) {
  using namespace numerics;
  constexpr int kBlock = block_size(F);
  constexpr int kLanes = kBlock / kChunk;  // lanes sharing one scale
  static_assert(kBlock % kChunk == 0 && (kLanes == 2 || kLanes == 4), "a scale block is 2 or 4 chunks");
  static_assert(32 % kLanes == 0, "scale blocks must not straddle warps");

  constexpr int kUnroll = quantize_unroll(sizeof(In));
  static_assert(kUnroll >= 1, "at least one chunk per thread");

  const int64_t chunks = a.rows * a.cols / kChunk;  // < 2^32, checked by the host
  const int64_t cols_sf = a.cols / kBlock;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  const float nv_global = F == Fmt::kNvfp4 ? *a.global_scale : 0.0f;

  // All loads first: kUnroll independent 16/32-byte loads in flight per thread.
  using Chunk = std::conditional_t<F == Fmt::kMxfp8 && std::is_same_v<In, __nv_bfloat16>, WidenedBf16Chunk,
                                   InputChunk<In>>;
  Chunk in[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = first + int64_t(u) * blockDim.x;
    if (c < chunks) {
      in[u].load(a.x, c);
    } else {
      in[u].zero();
    }
  }

  // 1. Block amax per iteration, with NaN propagation (a NaN anywhere makes amax NaN). Every lane
  // takes part in the shuffles (chunks past the end carry zeros): a scale block's lanes are
  // either all in range or all out, since cols is a multiple of kBlock.
  float amax[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    amax[u] = in[u].amax();
#pragma unroll
    for (int m = 1; m < kLanes; m <<= 1) amax[u] = max_abs_nan(amax[u], __shfl_xor_sync(0xFFFFFFFFu, amax[u], m));
  }

  // 2. Scales: the kLanes lanes of a block hold the same amaxes, so lane j of the group decides
  // the scale of iteration (pass * kLanes + j) and stores its byte; a shuffle hands the result to
  // the group. One scale computation per warp instruction stream serves kLanes iterations.
  constexpr int kPasses = (kUnroll + kLanes - 1) / kLanes;
  const int lane = int(threadIdx.x % 32u), j = lane % kLanes, group_lane0 = lane - j;
  uint32_t carried[kUnroll];
  float factor[kUnroll];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int mine = pass * kLanes + j;  // the iteration this lane decides (>= kUnroll: unused)
    float m = amax[pass * kLanes];
#pragma unroll
    for (int k = 1; k < kLanes; ++k)
      if (pass * kLanes + k < kUnroll && j == k) m = amax[pass * kLanes + k];
    uint32_t my_code, my_carried;
    float my_factor;
    detail::block_scale<F>(m, a.scale_rule, nv_global, my_code, my_factor, my_carried);
    const int64_t c = first + int64_t(mine) * blockDim.x;
    if (mine < kUnroll && c < chunks) {
      int64_t at;
      if constexpr (kSwizzled) {
        const uint32_t r = a.chunks_per_row.div(uint32_t(c));
        const uint32_t sc = a.chunks_per_row.mod(uint32_t(c), r) / kLanes;
        at = swizzled_scale_offset(r, sc, round_up(cols_sf, 4));
      } else {
        at = uint32_t(c) / kLanes;  // row-major [rows, cols_sf]: a row is kLanes * cols_sf chunks
      }
      a.scale[at] = uint8_t(my_code);
    }
#pragma unroll
    for (int k = 0; k < kLanes; ++k) {
      if (pass * kLanes + k < kUnroll) {
        carried[pass * kLanes + k] = __shfl_sync(0xFFFFFFFFu, my_carried, group_lane0 + k);
        factor[pass * kLanes + k] = __shfl_sync(0xFFFFFFFFu, my_factor, group_lane0 + k);
      }
    }
  }

  // 3. Elements.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = first + int64_t(u) * blockDim.x;
    if (c < chunks) {
      float v[kChunk];
      in[u].values(v);
      detail::store_elements<F>(a.q, c, detail::encode_chunk<F>(v, amax[u] != amax[u], carried[u], factor[u], nv_global));
    }
  }
  if constexpr (kSwizzled) detail::zero_scale_padding(a.scale, a.rows, cols_sf);
}

}  // namespace cake_moe::formats
