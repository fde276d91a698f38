// Error construction and CUDA return-code checks shared by every layer above the tile layer.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/tensor.hpp"

namespace tessera::detail {

// "tessera.add: argument 'other': expected <expected>, got <got>"
[[noreturn]] void throw_arg(ErrorKind kind, const char* op, const char* arg,
                            const std::string& expected, const std::string& got);

// `file` should come from source_path(__FILE__): the message is shown to users.
[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line);

// The source root as the compiler spelled it: this header's __FILE__ less its path in the tree.
// Errors show locations relative to it, so no build machine's directory reaches a user.
constexpr std::string_view source_root() {
  constexpr std::string_view self = __FILE__, tail = "src/runtime/check.hpp";
  return self.size() >= tail.size() && self.substr(self.size() - tail.size()) == tail
             ? self.substr(0, self.size() - tail.size())
             : std::string_view();
}

// "src/bench/peaks.cpp" for a file under the source root; the bare file name for any other
// absolute path (a file compiled from another tree).
constexpr const char* source_path(const char* file) {
  const std::string_view path = file, root = source_root();
  const std::string_view rel = path.substr(0, root.size()) == root ? path.substr(root.size()) : path;
  if (rel.empty() || rel.front() != '/') return file + (path.size() - rel.size());
  return file + path.rfind('/') + 1;
}

std::string shape_str(const int64_t* shape, int ndim);

}  // namespace tessera::detail

#define TESSERA_CUDA_CHECK(expr)                                                              \
  do {                                                                                        \
    cudaError_t tessera_err_ = (expr);                                                        \
    if (tessera_err_ != cudaSuccess) {                                                        \
      (void)cudaGetLastError(); /* reported here: not again by a later, unrelated check */   \
      ::tessera::detail::throw_cuda(tessera_err_, #expr,                                      \
                                    ::tessera::detail::source_path(__FILE__), __LINE__);      \
    }                                                                                         \
  } while (0)

// After every launch: configuration errors surface here, not at the next unrelated call.
#define TESSERA_LAUNCH_CHECK() TESSERA_CUDA_CHECK(cudaGetLastError())
