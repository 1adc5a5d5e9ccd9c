#include "runtime/tensor_map.hpp"

#include <string>

#include "runtime/driver.hpp"
#include "runtime/errors.hpp"

namespace cake_moe::runtime {

unsigned element_bytes(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return 4;
    default: throw ValueError("unsupported tensor-map data type");
  }
}

CUtensorMap encode_tiled(const TensorMapSpec& s) {
  const std::size_t rank = s.dims.size();
  if (rank < 1 || rank > 5 || s.box.size() != rank || s.strides.size() + 1 != rank)
    throw ValueError("tensor map: rank/box/stride lengths disagree");
  if (reinterpret_cast<std::uintptr_t>(s.base) % 16 != 0)
    throw ValueError("tensor map: base address must be 16-byte aligned");
  for (uint64_t st : s.strides) {
    if (st % 16 != 0) throw ValueError("tensor map: strides must be multiples of 16 bytes (got " + std::to_string(st) + ")");
    if (st >= (uint64_t(1) << 40)) throw ValueError("tensor map: a stride of " + std::to_string(st) + " bytes reaches 2^40");
  }
  for (uint64_t d : s.dims)   // (cuTensorMapEncodeTiled's limits, named here rather than as its error code)
    if (d > (uint64_t(1) << 32)) throw ValueError("tensor map: a dimension of " + std::to_string(d) + " elements exceeds 2^32");
  for (uint32_t b : s.box)
    if (b == 0 || b > 256) throw ValueError("tensor map: box extents must be in [1, 256]");
  cuuint64_t dims[5];
  cuuint64_t strides[4];
  cuuint32_t box[5];
  cuuint32_t elem_strides[5];
  for (std::size_t i = 0; i < rank; ++i) {
    dims[i] = s.dims[i];
    box[i] = s.box[i];
    elem_strides[i] = 1;
    if (i + 1 < rank) strides[i] = s.strides[i];
  }
  CUtensorMap map;
  CUresult r = driver().TensorMapEncodeTiled(&map, s.dtype, cuuint32_t(rank), s.base, dims, strides, box,
                                             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, s.swizzle, s.l2,
                                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r, "cuTensorMapEncodeTiled");
  return map;
}

CUtensorMap encode_bf16_rows(const void* base, int64_t cols, int64_t rows, uint32_t box_rows, int64_t row_stride) {
  TensorMapSpec s;
  s.base = const_cast<void*>(base);
  s.dims = {uint64_t(cols), uint64_t(rows)};
  s.strides = {uint64_t(row_stride > 0 ? row_stride : cols) * 2};
  s.box = {64, box_rows};
  return encode_tiled(s);
}

CUtensorMap encode_bf16_experts(const void* base, int64_t experts, int64_t rows, int64_t cols, uint32_t box_rows,
                                int64_t row_stride, int64_t expert_stride) {
  const uint64_t row = uint64_t(row_stride > 0 ? row_stride : cols);
  const uint64_t expert = uint64_t(expert_stride > 0 ? expert_stride : int64_t(row) * rows);
  TensorMapSpec s;
  s.base = const_cast<void*>(base);
  s.dims = {uint64_t(cols), uint64_t(rows), uint64_t(experts)};
  s.strides = {row * 2, expert * 2};
  s.box = {64, box_rows, 1};
  return encode_tiled(s);
}

void replace_address(CUtensorMap& map, void* base) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0)
    throw ValueError("tensor map: base address must be 16-byte aligned");
  check(driver().TensorMapReplaceAddress(&map, base), "cuTensorMapReplaceAddress");
}

}  // namespace cake_moe::runtime
