// Owning device and host buffers, random fills and the poison check used by verify, the tests and
// the benchmark cases.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::runtime {

// cudaMalloc'd bytes on the current device, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

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

}  // namespace tessera::runtime
