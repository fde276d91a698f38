#include "runtime/check.hpp"

#include <sstream>

#include "runtime/device.hpp"

namespace tessera::detail {

void throw_arg(ErrorKind kind, const char* op, const char* arg, const std::string& expected,
               const std::string& got) {
  std::ostringstream m;
  m << "tessera." << op << ": argument '" << arg << "': expected " << expected << ", got " << got;
  throw Error(kind, m.str());
}

namespace {

// The codes CUDA returns for any call when the machine has no usable GPU at all.
bool means_no_gpu(cudaError_t err) {
  return err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice ||
         err == cudaErrorSystemDriverMismatch || err == cudaErrorCompatNotSupportedOnDevice;
}

}  // namespace

void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  std::ostringstream m;
  // Without a GPU the user needs the reason (no driver, an old one), not the runtime's wording.
  if (means_no_gpu(err) && runtime::device_count() == 0)
    m << "tessera: no usable GPU: " << runtime::no_gpu_reason() << "; from " << what << " at "
      << file << ":" << line;
  else
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
