// Device queries and a scoped current-device switch.
#pragma once

#include <cuda_runtime_api.h>

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

// Grid size for `work` items at `per_block` items per block, at least 1.
inline unsigned grid_for(long long work, long long per_block) {
  long long g = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

}  // namespace tessera::runtime
