// What the labs share (dev/gemm_lab.cu, dev/gemv_lab.cu): exiting on a CUDA or cuBLAS error, bf16
// inputs from a hash of their index, a call timed by events after an L2 flush, and the median of a
// run's rounds. Not part of the build.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

template <class E>
void check(E e, const char* what, int line) {
  if (int(e) == 0) return;
  std::fprintf(stderr, "%s failed (%d) at line %d\n", what, int(e), line);
  std::exit(1);
}
#define CK(x) check((x), #x, __LINE__)

// Values in [-0.5, 0.5), a function of the index and the seed (bf16 or float).
template <class T>
__global__ void fill(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * int64_t(blockDim.x)) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = T(float(h & 0xffff) / 65536.0f - 0.5f);
  }
}

// A call's time in us, by events around it, after a write over `flush` (larger than L2) evicts
// what the previous call left there.
struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)), CK(cudaEventCreate(&b)); }
  template <class F>
  float us(F&& f, void* flush, size_t flush_bytes) {
    CK(cudaMemsetAsync(flush, 0, flush_bytes));
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.0f;
  }
};

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
