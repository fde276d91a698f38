// Error construction and CUDA return-code checks shared by every layer above the tile layer.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/tensor.hpp"

namespace tessera::detail {

// "tessera.add: argument 'b': expected <expected>, got <got>"
[[noreturn]] void throw_arg(ErrorKind kind, const char* op, const char* arg,
                            const std::string& expected, const std::string& got);

[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line);

std::string shape_str(const int64_t* shape, int ndim);

}  // namespace tessera::detail

#define TESSERA_CUDA_CHECK(expr)                                                     \
  do {                                                                               \
    cudaError_t tessera_err_ = (expr);                                               \
    if (tessera_err_ != cudaSuccess)                                                 \
      ::tessera::detail::throw_cuda(tessera_err_, #expr, __FILE__, __LINE__);        \
  } while (0)

// After every launch: configuration errors surface here, not at the next unrelated call.
#define TESSERA_LAUNCH_CHECK() TESSERA_CUDA_CHECK(cudaGetLastError())
