// Parameters of zero_unrouted_rows (unrouted_rows.cuh), shared with its host launcher.
#pragma once
#include <cstdint>

namespace cake_moe {

struct UnroutedRowsParams {
  void* out;              // [rows, row_bytes / 2] bf16, rows row_bytes apart (16-byte aligned)
  const int32_t* offs;    // the GEMM's offsets
  int64_t row_bytes;      // bytes between rows = bytes of a row: a multiple of 16
  int32_t row_chunks;     // 16-byte stores per row
  int32_t rows;           // the packed row capacity (x.shape[0])
  int32_t num_offs;       // entries of offs (E or E + 1); 0: no group, every row is zeroed
  int32_t leading_zero;   // 1: offs is m_indptr [E + 1], whose first entry is the first group's start
};

constexpr int kUnroutedRowsThreads = 256;  // __launch_bounds__ in forms.py; a multiple of 32 (a warp per row)
static_assert(kUnroutedRowsThreads % 32 == 0);

}  // namespace cake_moe
