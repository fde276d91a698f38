#include "bench/toolkit_lib.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"

namespace tessera::bench {
namespace {

// The folder of this library's file (libtessera_harness.so), for the wheel's sibling folders.
std::string own_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_dir), &info) || !info.dli_fname) return {};
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::vector<std::string> toolkit_roots() {
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"})
    if (const char* v = std::getenv(var); v && *v) roots.emplace_back(v);
  roots.emplace_back("/usr/local/cuda");
  return roots;
}

}  // namespace

ToolkitLib::ToolkitLib(std::string what, std::string soname, std::vector<std::string> wheel_dirs)
    : what_(std::move(what)), soname_(std::move(soname)), wheel_dirs_(std::move(wheel_dirs)) {}

void ToolkitLib::open() const {
  std::call_once(opened_, [this] { search(); });
}

void ToolkitLib::search() const {
  std::vector<std::string> candidates = {soname_};
  // The package sits in site-packages/tessera/ (the harness library there too); the NVIDIA
  // wheels in site-packages/nvidia/<dir>/lib.
  if (const std::string dir = own_dir(); !dir.empty())
    for (const std::string& w : wheel_dirs_) candidates.push_back(dir + "/../nvidia/" + w + "/lib/" + soname_);
  for (const std::string& root : toolkit_roots())
    for (const char* sub : {"/lib64/", "/targets/x86_64-linux/lib/", "/extras/CUPTI/lib64/"})
      candidates.push_back(root + sub + soname_);
  for (const std::string& c : candidates) {
    handle_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_) return;
  }
  error_ = what_ + " (" + soname_ + ") not found: looked in the loader's path (LD_LIBRARY_PATH), " +
           "the NVIDIA wheels next to tessera, $CUDA_HOME, $CUDA_PATH, $CUDAToolkit_ROOT and /usr/local/cuda";
}

bool ToolkitLib::available() const {
  open();
  return handle_ != nullptr;
}

std::string ToolkitLib::why_not() const {
  open();
  return handle_ ? std::string() : error_;
}

void* ToolkitLib::symbol(const char* name) const {
  if (!available()) throw Error(ErrorKind::runtime, error_);
  void* f = dlsym(handle_, name);
  if (!f)
    throw Error(ErrorKind::runtime, what_ + " (" + soname_ + ") has no function " + name +
                                        ": a version older than this build's toolkit");
  return f;
}

// The toolkit's major version names the files ("libcublas.so.13") and the wheels' folder ("cu13").
std::string major() { return std::to_string(CUDART_VERSION / 1000); }

const ToolkitLib& cublas_library() {
  static const ToolkitLib lib("cuBLAS", "libcublas.so." + major(), {"cu" + major(), "cublas"});
  return lib;
}

const ToolkitLib& cupti_library() {
  static const ToolkitLib lib("CUPTI", "libcupti.so." + major(), {"cu" + major(), "cuda_cupti"});
  return lib;
}

}  // namespace tessera::bench
