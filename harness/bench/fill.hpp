// Test data on the device: random fills, the poison pattern and its count, copies to the host.
// Used by verify, the benchmark cases and the tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::bench {

// Fills `count` elements of `dtype` at `data` with values uniform in [lo, hi), from a
// counter-based hash of (seed, index): fast on the GPU for tensors of billions of elements.
void fill_uniform(void* data, DType dtype, int64_t count, double lo, double hi, uint64_t seed,
                  cudaStream_t stream);

// Sets every byte to 0xFF: NaN in every float dtype, so an element a kernel forgot to write
// is visible.
void poison(void* data, std::size_t bytes, cudaStream_t stream);

// Number of elements of a (possibly strided) float view still holding the poison pattern.
// Synchronizes `stream`.
int64_t count_poisoned(const TensorView& t, cudaStream_t stream);

// Copies `bytes` from device to a new host vector (synchronous).
std::vector<unsigned char> to_host(const void* device_data, std::size_t bytes);

}  // namespace tessera::bench
