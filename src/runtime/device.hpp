// Device queries and a scoped current-device switch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace tessera::runtime {

// Number of usable CUDA devices; 0 (not an error) when there is no GPU or driver.
int device_count();
// Why device_count() is 0, for skip messages ("no CUDA driver", ...); empty when GPUs exist.
std::string no_gpu_reason();

// Cached cudaGetDeviceProperties.
const cudaDeviceProp& device_props(int device);

// Makes `device` current for its lifetime, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Raises `kernel`'s dynamic shared memory limit on the current device to `bytes` (once per kernel,
// device and size). The 48 KB default covers static and dynamic memory together, so any nonzero
// amount is declared: 48 KB of dynamic memory next to a few bytes of static memory fails to
// launch otherwise.
void allow_dynamic_smem(const void* kernel, std::size_t bytes);

// Bytes of static shared memory `kernel` declares (cached per kernel): what a launcher subtracts
// from the per-CTA limit before it sizes the dynamic part.
std::size_t static_smem_bytes(const void* kernel);

// CTAs of `kernel` at `threads` threads and `smem` bytes of dynamic shared memory that fit on one
// SM of the current device (at least 1), cached per kernel, size and device. Declares the shared
// memory first (allow_dynamic_smem).
int resident_blocks_per_sm(const void* kernel, int threads, std::size_t smem = 0);

// Grid size for `work` items at `per_block` items per block, at least 1.
inline unsigned grid_for(long long work, long long per_block) {
  long long g = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

}  // namespace tessera::runtime
