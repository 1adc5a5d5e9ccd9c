// Argument structs and layout rules of the number-format kernels, shared by the device code and
// its host launcher (cpp/host/formats). Plain data only: both g++ and nvcc compile this.
#pragma once
#include <cstdint>

#include "common/fast_divmod.hpp"
#include "common/host_device.hpp"

namespace cake_moe::formats {

enum class Fmt : int32_t { kMxfp8 = 0, kMxfp4 = 1, kNvfp4 = 2 };

// Elements sharing one scale: 32 for the MX formats, 16 for NVFP4 (SPEC §3).
CAKE_HD constexpr int block_size(Fmt f) { return f == Fmt::kNvfp4 ? 16 : 32; }
// Elements per stored byte: 1 for FP8, 2 for FP4 (low nibble = even element).
CAKE_HD constexpr int elems_per_byte(Fmt f) { return f == Fmt::kMxfp8 ? 1 : 2; }

// How a UE8M0 scale is chosen from the block amax (MX formats only).
enum class ScaleRule : int32_t {
  kRoundUp = 0,   // smallest power of two >= amax / max_elem (the seeds' kernels; default)
  kOcpFloor = 1,  // OCP MX v1.0: 2^(floor(log2 amax) - emax_elem)
};

// Byte offset of scale (row r, scale column c) in the 128x4-swizzled layout: 512-byte atoms of
// 128 rows x 4 columns, rows padded to 128 and columns to 4 (SPEC §3).
CAKE_HD int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t padded_cols) {
  const int64_t k_tiles = padded_cols / 4;
  return (r / 128) * k_tiles * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

CAKE_HD constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Threads work on 8-element chunks; chunk indices are 32-bit (tensors below 2^35 elements).
constexpr int kChunkElems = 8;
constexpr int64_t kMaxChunks = int64_t(1) << 32;
// Chunks per thread in quantize: 64 bytes of input in flight per thread for either dtype.
CAKE_HD constexpr int quantize_unroll(int in_bytes) { return 64 / (kChunkElems * in_bytes); }

struct QuantizeArgs {
  const void* x;               // [rows, cols] bf16 or f32, contiguous, 16-byte aligned
  uint8_t* q;                  // [rows, cols / elems_per_byte]
  uint8_t* scale;              // linear [rows, cols / block] or swizzled [round_up(rows,128) * round_up(cols/block,4)]
  const float* global_scale;   // NVFP4 encode scale q (device scalar); unused for MX
  int64_t rows;
  int64_t cols;                // multiple of block_size
  int32_t scale_rule;          // ScaleRule (MX only)
  FastDivmod chunks_per_row;   // cols / kChunkElems (set by the host launcher)
};

struct DequantizeArgs {
  const uint8_t* q;
  const uint8_t* scale;
  const float* global_scale;   // NVFP4: the encode scale used at quantization (value = e2m1 * s / q)
  void* out;                   // [rows, cols] bf16 or f32
  int64_t rows;
  int64_t cols;
  FastDivmod chunks_per_row;   // cols / kChunkElems (set by the host launcher)
};

}  // namespace cake_moe::formats
