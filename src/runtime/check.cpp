#include "runtime/check.hpp"

#include <sstream>

namespace tessera::detail {

void throw_arg(ErrorKind kind, const char* op, const char* arg, const std::string& expected,
               const std::string& got) {
  std::ostringstream m;
  m << "tessera." << op << ": argument '" << arg << "': expected " << expected << ", got " << got;
  throw Error(kind, m.str());
}

void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  std::ostringstream m;
  m << "tessera: CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err)
    << ") from " << what << " at " << file << ":" << line;
  throw Error(ErrorKind::runtime, m.str());
}

std::string shape_str(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace tessera::detail
