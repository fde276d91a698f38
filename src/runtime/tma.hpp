// Tensor maps for the copy engine (TMA): the descriptor a kernel's bulk tensor copies read,
// built on the host from a tensor view. The driver encodes it (cuTensorMapEncodeTiled), reached
// through the runtime's entry-point query, so the library links no libcuda of its own.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/tensor.hpp"

namespace tessera::runtime {

enum class TmaSwizzle { none, b32, b64, b128 };

// A tiled map of 2 to 5 dimensions, given innermost first, as the copy engine takes them. Boxes
// are box[0] x box[1] x ... elements; out-of-range elements of a box read as zeros and are not
// written.
struct TmaShape {
  int rank = 2;
  uint64_t dims[5] = {0, 0, 1, 1, 1};     // elements, innermost first
  uint64_t strides[5] = {0, 0, 0, 0, 0};  // elements; strides[0] must be 1
  uint32_t box[5] = {0, 0, 1, 1, 1};
};

// Whether the copy engine can address `shape` of `dtype` at `base`: a 16-byte aligned base, 16-byte
// multiples (nonzero) for every stride but the innermost, an innermost stride of 1, and sizes within its
// limits. Launchers check this and take another path where it fails.
bool tma_can_map(DType dtype, const void* base, const TmaShape& shape, TmaSwizzle swizzle);

// The encoded map; throws tessera::Error (naming `op`) if the driver refuses it.
CUtensorMap tma_map(const char* op, DType dtype, const void* base, const TmaShape& shape,
                    TmaSwizzle swizzle);

}  // namespace tessera::runtime
