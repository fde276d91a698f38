#include "runtime/device.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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

namespace {

// Whether the NVIDIA driver library can be loaded: without it every CUDA call fails, and the
// runtime's own message for that case ("driver version is insufficient") points at an upgrade.
bool driver_library_loads() {
  if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) return true;
  // Kept open: the CUDA runtime loads the same library on its next call anyway.
  return dlopen("libcuda.so.1", RTLD_LAZY) != nullptr;
}

// "13.0" from cudaDriverGetVersion's 13000.
std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string old_driver_reason() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (driver == 0) return "the NVIDIA driver library loads but reports no CUDA version";
  return "the NVIDIA driver supports CUDA " + cuda_version(driver) + ", this build needs CUDA " +
         cuda_version(runtime) + " or newer";
}

}  // namespace

std::string no_gpu_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err == cudaSuccess) return n == 0 ? "no CUDA GPU present" : "";
  if (!driver_library_loads()) return "no NVIDIA driver found (libcuda.so.1 could not be loaded)";
  if (err == cudaErrorInsufficientDriver) return old_driver_reason();
  if (err == cudaErrorNoDevice) return "no CUDA GPU present (the NVIDIA driver sees none)";
  return std::string("no usable CUDA GPU (") + cudaGetErrorName(err) + ": " +
         cudaGetErrorString(err) + ")";
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

void allow_dynamic_smem(const void* kernel, std::size_t bytes) {
  if (bytes == 0) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, std::size_t> done;  // per kernel and device
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  std::size_t& have = done[{kernel, device}];
  if (have >= bytes) return;
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
  have = bytes;
}

std::size_t static_smem_bytes(const void* kernel) {
  static std::mutex mu;
  static std::map<const void*, std::size_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(kernel); it != cache.end()) return it->second;
  cudaFuncAttributes attr{};
  TESSERA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return cache.emplace(kernel, attr.sharedSizeBytes).first->second;
}

int resident_blocks_per_sm(const void* kernel, int threads, std::size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, std::size_t, int>, int> cache;
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(kernel, threads, smem, device);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  allow_dynamic_smem(kernel, smem);
  int n = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  n = std::max(n, 1);
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, n);
  return n;
}

int resident_ctas(const void* kernel, int threads, std::size_t smem) {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  return resident_blocks_per_sm(kernel, threads, smem) * device_props(device).multiProcessorCount;
}

cudaLaunchAttribute cluster_attribute(int cluster) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

int active_clusters(const void* kernel, int cluster, int threads, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, cluster, threads, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int n = 0;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && fa.ptxVersion >= 90 && fa.binaryVersion >= 90 &&
      (cluster <= 8 ||
       cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess)) {
    cudaLaunchAttribute attr = cluster_attribute(cluster);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cluster);
    cfg.blockDim = dim3(threads);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) n = 0;
  }
  (void)cudaGetLastError();  // a refused query is an answer (no clusters), not an error to report
  cache[key] = n;
  return n;
}

bool has_sm90a_code(const void* kernel) {
  static std::mutex mu;
  static std::map<const void*, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(kernel); it != cache.end()) return it->second;
  cudaFuncAttributes fa{};
  const bool ok = cudaFuncGetAttributes(&fa, kernel) == cudaSuccess;
  (void)cudaGetLastError();
  return cache[kernel] = ok && fa.binaryVersion == 90 && fa.ptxVersion >= 90;
}

}  // namespace tessera::runtime
