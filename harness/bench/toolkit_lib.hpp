// Toolkit libraries the harness needs and the operators do not: cuBLAS (the GEMM peak) and CUPTI
// (the kernel profiler). They are opened when first used instead of linked, so that the library
// and the wheel load on a machine with an NVIDIA driver and no CUDA toolkit; only the peak and
// the profiler then report what is missing.
//
// Where they are looked for, first found wins:
//   1. the dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache), which also finds a
//      copy already loaded by the process (torch's, say);
//   2. the NVIDIA runtime wheels next to the installed package (site-packages/nvidia/...);
//   3. a CUDA toolkit: $CUDA_HOME, $CUDA_PATH, $CUDAToolkit_ROOT, /usr/local/cuda.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace tessera::bench {

class ToolkitLib {
 public:
  // what: the name users know ("cuBLAS"); soname: the file of this toolkit's major version;
  // wheel_dirs: folders under site-packages/nvidia/ that hold it.
  ToolkitLib(std::string what, std::string soname, std::vector<std::string> wheel_dirs);
  ToolkitLib(const ToolkitLib&) = delete;
  ToolkitLib& operator=(const ToolkitLib&) = delete;

  // Opens the library on the first call (thread-safe, once); false when it was not found.
  bool available() const;
  // Why it is not available: the file and the places searched. Empty when it is.
  std::string why_not() const;
  // The address of `name`; throws tessera::Error (runtime) naming the library and the function
  // when the library or the function is missing.
  void* symbol(const char* name) const;

 private:
  void open() const;
  void search() const;
  std::string what_, soname_;
  std::vector<std::string> wheel_dirs_;
  mutable std::once_flag opened_;
  mutable void* handle_ = nullptr;
  mutable std::string error_;
};

const ToolkitLib& cublas_library();
const ToolkitLib& cupti_library();

}  // namespace tessera::bench

#define TESSERA_TOOLKIT_STR_(x) #x
#define TESSERA_TOOLKIT_STR(x) TESSERA_TOOLKIT_STR_(x)
// A toolkit function through `lib`, typed from its header's declaration. The name is expanded
// first: cublas_v2.h maps cublasCreate to the exported cublasCreate_v2.
#define TESSERA_TOOLKIT_FN(lib, fn) \
  reinterpret_cast<decltype(&fn)>((lib).symbol(TESSERA_TOOLKIT_STR(fn)))
// The same for an overloaded function (cublas_api.h overloads cublasGemmEx in C++): `type` picks
// the overload, checked against the header at compile time.
#define TESSERA_TOOLKIT_FN_AS(lib, fn, type) \
  (static_cast<void>(static_cast<type>(&fn)), reinterpret_cast<type>((lib).symbol(TESSERA_TOOLKIT_STR(fn))))
