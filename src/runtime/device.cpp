#include "runtime/device.hpp"

#include <map>
#include <mutex>

#include "runtime/check.hpp"

namespace tessera::runtime {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string no_gpu_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return std::string("no usable CUDA GPU (") + cudaGetErrorString(err) + ")";
  if (n == 0) return "no CUDA GPU present";
  return "";
}

const cudaDeviceProp& device_props(int device) {
  static std::mutex mu;
  static std::map<int, cudaDeviceProp> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it == cache.end()) {
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    it = cache.emplace(device, p).first;
  }
  return it->second;
}

DeviceGuard::DeviceGuard(int device) {
  TESSERA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    TESSERA_CUDA_CHECK(cudaSetDevice(device));
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
}

}  // namespace tessera::runtime
