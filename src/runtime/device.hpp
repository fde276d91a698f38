// Device queries and a scoped current-device switch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace tessera::runtime {

// Number of usable CUDA devices; 0 (not an error) when there is no GPU or driver.
int device_count();
// Why device_count() is 0, in one line for users and skip messages: no driver library, a driver
// older than this build's CUDA runtime (both versions named), no GPU; empty when GPUs exist.
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

// CTAs of `kernel` at `threads` threads that fit on the whole current device at once.
int resident_ctas(const void* kernel, int threads, std::size_t smem = 0);

// How many clusters of `cluster` CTAs of `threads` threads fit on `device` at once (cached); 0
// where the kernel cannot be launched as a cluster: the size does not fit, or the kernel holds no
// sm_90 code (code JIT-compiled from compute_80 PTX on an sm_90 GPU traps in its cluster paths).
// Sizes over 8 are allowed (non-portable) where the device takes them.
// `kernel` (here and in resident_*) must be a kernel of this library: every module links its own
// static CUDA runtime, which knows only the kernels compiled into that module.
int active_clusters(const void* kernel, int cluster, int threads, int device);

// Whether `kernel` (of this library) holds sm_90a code for the current device: its wgmma and
// setmaxnreg run only then. A build for sm_80 only also reports binary version 90 on Hopper (its
// PTX compiled there) with trap stubs for those instructions; the PTX version tells them apart.
// Asked once per kernel.
bool has_sm90a_code(const void* kernel);

// The launch attribute for clusters of `cluster` CTAs along x.
cudaLaunchAttribute cluster_attribute(int cluster);

inline long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Grid size for `work` items at `per_block` items per block, at least 1.
inline unsigned grid_for(long long work, long long per_block) {
  long long g = ceil_div(work, per_block);
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

// A block count as a grid dimension: clamped to [1, 2^31 - 1] (kernels loop over what is left).
inline unsigned grid_cap(long long blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 2147483647LL ? 2147483647LL : blocks);
}

}  // namespace tessera::runtime
