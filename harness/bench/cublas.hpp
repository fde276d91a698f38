// cuBLAS as the in-process peer of the GEMM benchmarks and the GEMM peak: the library opened at
// first use (toolkit_lib.hpp), one handle per object.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/tensor.hpp"

typedef struct cublasContext* cublasHandle_t;

namespace tessera::bench {

class CublasGemm {
 public:
  // Throws tessera::Error (runtime) where cuBLAS cannot be opened or initialised.
  CublasGemm();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // c[m, n] (row-major) = a[m, k] (row-major) @ w[n, k]^T (a linear layer's layout): bfloat16 or
  // float16 in and out with float32 accumulation; float32 exact, or TF32 where `tf32`.
  void run(DType dtype, bool tf32, int64_t m, int64_t n, int64_t k, const void* a, const void* w,
           void* c, cudaStream_t stream) const;

 private:
  cublasHandle_t h_ = nullptr;
};

}  // namespace tessera::bench
