// Offsets of an element in several strided tensors that share one logical shape (broadcast
// inputs have stride 0). 64-bit throughout: tensors may exceed 2^31 elements.
#pragma once

#include <cstdint>

namespace tessera::tile {

inline constexpr int kMaxIndexDims = 8;

template <int NT>
struct StridedIndexer {
  int ndim;
  int64_t shape[kMaxIndexDims];
  int64_t strides[NT][kMaxIndexDims];  // elements

  // Offsets (elements) of row-major linear index i in each of the NT tensors.
  __host__ __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[NT]) const {
#pragma unroll
    for (int t = 0; t < NT; ++t) off[t] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t c = i % shape[d];
      i /= shape[d];
#pragma unroll
      for (int t = 0; t < NT; ++t) off[t] += c * strides[t][d];
    }
  }
};

}  // namespace tessera::tile
