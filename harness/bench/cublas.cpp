#include "bench/cublas.hpp"

#include <cublas_v2.h>

#include <string>

#include "bench/toolkit_lib.hpp"
#include "tessera/error.hpp"

namespace tessera::bench {
namespace {

#define TESSERA_CUBLAS(fn) TESSERA_TOOLKIT_FN(cublas_library(), fn)

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::runtime, std::string("cuBLAS error ") +
                                        TESSERA_CUBLAS(cublasGetStatusString)(st) + " from " + what);
}

}  // namespace

CublasGemm::CublasGemm() {
  if (!cublas_library().available())
    throw Error(ErrorKind::runtime, "cuBLAS is not available: " + cublas_library().why_not());
  check(TESSERA_CUBLAS(cublasCreate)(&h_), "cublasCreate");
}

CublasGemm::~CublasGemm() {
  if (h_) TESSERA_CUBLAS(cublasDestroy)(h_);
}

void CublasGemm::run(DType dtype, bool tf32, int64_t m, int64_t n, int64_t k, const void* a,
                     const void* w, void* c, cudaStream_t stream) const {
  check(TESSERA_CUBLAS(cublasSetStream)(h_, stream), "cublasSetStream");
  const cudaDataType t = dtype == DType::bfloat16 ? CUDA_R_16BF
                         : dtype == DType::float16 ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute =
      dtype == DType::float32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  static const auto gemm = TESSERA_TOOLKIT_FN_AS(cublas_library(), cublasGemmEx, GemmEx);
  // Column-major, cuBLAS sees c^T [n, m] = w [n, k] (its k x n, transposed) @ a^T (its k x m).
  check(gemm(h_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, w, t, int(k), a, t,
             int(k), &beta, c, t, int(n), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace tessera::bench
