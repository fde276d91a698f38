#include "bench/fill.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "tile/indexing.cuh"
#include "tile/reduce.cuh"

namespace tessera::bench {

using runtime::DeviceBuffer;
using runtime::grid_for;

namespace {

// splitmix64: a good 64-bit mix, enough for test data (not for dropout).
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Integers take the floor, so [lo, hi) holds integer values lo .. hi - 1 with equal weight.
template <class T>
__device__ __forceinline__ T from_double(double x) { return static_cast<T>(floor(x)); }
template <> __device__ __forceinline__ float from_double<float>(double x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ double from_double<double>(double x) { return x; }
template <> __device__ __forceinline__ bool from_double<bool>(double x) { return floor(x) != 0.0; }
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_double<__nv_fp8_e4m3>(double x) {
  return __nv_fp8_e4m3(x);
}
template <> __device__ __forceinline__ __nv_fp8_e5m2 from_double<__nv_fp8_e5m2>(double x) {
  return __nv_fp8_e5m2(x);
}
template <> __device__ __forceinline__ __half from_double<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double x) {
  return __double2bfloat16(x);
}

template <class T>
__global__ void fill_uniform_kernel(T* out, int64_t n, double lo, double scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const double u = (mix64(seed ^ mix64(i)) >> 11) * 0x1.0p-53;  // [0, 1)
    out[i] = from_double<T>(lo + scale * u);
  }
}

template <class Bits>
__global__ void count_poison_kernel(const Bits* data, tile::StridedIndexer<1> idx, int64_t n,
                                    unsigned long long* count) {
  __shared__ unsigned long long scratch[32];
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t off[1];
    idx.offsets(i, off);
    local += data[off[0]] == static_cast<Bits>(~Bits(0));
  }
  local = tile::block_sum(local, scratch);
  if (threadIdx.x == 0 && local) atomicAdd(count, local);
}

}  // namespace

void fill_uniform(void* data, DType dtype, int64_t count, double lo, double hi, uint64_t seed,
                  cudaStream_t stream) {
  if (count <= 0) return;
  const unsigned grid = std::min<long long>(grid_for(count, 256), 132 * 32);
  const double scale = hi - lo;
  switch (dtype) {
    case DType::float32:
      fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<float*>(data), count, lo, scale, seed);
      break;
    case DType::float16:
      fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<__half*>(data), count, lo, scale, seed);
      break;
    case DType::bfloat16:
      fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, lo, scale, seed);
      break;
    case DType::float64:
      fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<double*>(data), count, lo, scale, seed);
      break;
    case DType::int8: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<int8_t*>(data), count, lo, scale, seed); break;
    case DType::int16: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<int16_t*>(data), count, lo, scale, seed); break;
    case DType::int32: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<int32_t*>(data), count, lo, scale, seed); break;
    case DType::int64: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<int64_t*>(data), count, lo, scale, seed); break;
    case DType::uint8: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<uint8_t*>(data), count, lo, scale, seed); break;
    case DType::bool_: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<bool*>(data), count, lo, scale, seed); break;
    case DType::float8_e4m3fn: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<__nv_fp8_e4m3*>(data), count, lo, scale, seed); break;
    case DType::float8_e5m2: fill_uniform_kernel<<<grid, 256, 0, stream>>>(static_cast<__nv_fp8_e5m2*>(data), count, lo, scale, seed); break;
  }
  TESSERA_LAUNCH_CHECK();
}

void poison(void* data, std::size_t bytes, cudaStream_t stream) {
  if (bytes) TESSERA_CUDA_CHECK(cudaMemsetAsync(data, 0xFF, bytes, stream));
}

int64_t count_poisoned(const TensorView& t, cudaStream_t stream) {
  const int64_t n = t.numel();
  if (n == 0) return 0;
  tile::StridedIndexer<1> idx{};
  idx.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    idx.shape[d] = t.shape[d];
    idx.strides[0][d] = t.strides[d];
  }
  DeviceBuffer counter(sizeof(unsigned long long));
  TESSERA_CUDA_CHECK(cudaMemsetAsync(counter.data(), 0, sizeof(unsigned long long), stream));
  auto* c = static_cast<unsigned long long*>(counter.data());
  const unsigned grid = std::min<long long>(grid_for(n, 256), 132 * 16);
  switch (dtype_size(t.dtype)) {
    case 2: count_poison_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint16_t*>(t.data), idx, n, c); break;
    case 4: count_poison_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint32_t*>(t.data), idx, n, c); break;
    case 8: count_poison_kernel<<<grid, 256, 0, stream>>>(static_cast<const unsigned long long*>(t.data), idx, n, c); break;
    default: count_poison_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(t.data), idx, n, c); break;
  }
  TESSERA_LAUNCH_CHECK();
  unsigned long long host = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&host, c, sizeof(host), cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<int64_t>(host);
}

std::vector<unsigned char> to_host(const void* device_data, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  if (bytes) TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), device_data, bytes, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace tessera::bench
