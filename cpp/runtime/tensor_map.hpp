// TMA descriptor helpers: row-major tensors of up to 5 dims, described outermost-last the way
// cuTensorMapEncodeTiled wants (dim 0 innermost). Encoded once at plan time; launches only
// swap base addresses (cuTensorMapReplaceAddress) or pass the descriptor by value.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <vector>

namespace cake_moe::runtime {

struct TensorMapSpec {
  CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  void* base = nullptr;
  std::vector<uint64_t> dims;      // elements per dim, innermost first
  std::vector<uint64_t> strides;   // bytes, for dims 1.. (innermost is contiguous)
  std::vector<uint32_t> box;       // box extent per dim, innermost first
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
};

// Encodes a tiled tensor map; throws ValueError for unencodable geometry (alignment, box
// sizes) and CudaError for driver failures.
CUtensorMap encode_tiled(const TensorMapSpec& spec);

// A row-major bf16 matrix [rows, cols] whose rows start `row_stride` elements apart (0: packed,
// = cols; a multiple of 8), read in boxes of 64 columns x `box_rows` rows with the 128-byte
// swizzle (one box row = one swizzle row): the operand maps of the grouped GEMMs.
CUtensorMap encode_bf16_rows(const void* base, int64_t cols, int64_t rows, uint32_t box_rows, int64_t row_stride = 0);

// A bf16 tensor [experts, rows, cols] as a 3D map (cols innermost), boxes of 64 columns x
// `box_rows` rows of one expert: a box past `rows` or `cols` is clipped within its expert, never
// reaching into the next. Strides in elements (0: packed, cols and rows * row stride): the
// expert weights W [E, N, K] of the grouped GEMM and its weight gradient dW [E, N, K].
CUtensorMap encode_bf16_experts(const void* base, int64_t experts, int64_t rows, int64_t cols, uint32_t box_rows,
                                int64_t row_stride = 0, int64_t expert_stride = 0);

// Points an encoded map at a new base address (same geometry).
void replace_address(CUtensorMap& map, void* base);

// Element size in bytes of a tensor-map data type.
unsigned element_bytes(CUtensorMapDataType t);

}  // namespace cake_moe::runtime
