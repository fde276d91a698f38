// libtessera_torch: tessera's operators as torch ops (torch.ops.tessera.*), loaded by
// tessera._torch through torch.ops.load_library. This file defines the namespace: every schema of
// every op description (tessera/op.hpp, registered by the ops' own .cu files), so no list of ops
// lives here. generic.cpp registers the kernels of the ops whose description has one; the
// families' files those written by hand.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "binding.hpp"
#include "runtime/scratch.hpp"
#include "tessera/op.hpp"

namespace tessera::torch_ops {

bool dtype_of(c10::ScalarType t, DType& out) {
  switch (t) {
    case c10::ScalarType::Float: out = DType::float32; return true;
    case c10::ScalarType::Half: out = DType::float16; return true;
    case c10::ScalarType::BFloat16: out = DType::bfloat16; return true;
    case c10::ScalarType::Double: out = DType::float64; return true;
    case c10::ScalarType::Char: out = DType::int8; return true;
    case c10::ScalarType::Short: out = DType::int16; return true;
    case c10::ScalarType::Int: out = DType::int32; return true;
    case c10::ScalarType::Long: out = DType::int64; return true;
    case c10::ScalarType::Byte: out = DType::uint8; return true;
    case c10::ScalarType::Bool: out = DType::bool_; return true;
    case c10::ScalarType::Float8_e4m3fn: out = DType::float8_e4m3fn; return true;
    case c10::ScalarType::Float8_e5m2: out = DType::float8_e5m2; return true;
    default: return false;
  }
}

namespace {
// torch's Python name of a dtype tessera lacks ("complex64"), as its messages spell dtypes.
std::string torch_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::UInt16: return "uint16";
    case c10::ScalarType::UInt32: return "uint32";
    case c10::ScalarType::UInt64: return "uint64";
    default: return c10::toString(t);
  }
}

// The library's scratch memory from torch's caching allocator while the torch ops are loaded:
// reused with torch's own blocks, counted by torch.cuda.max_memory_allocated (the peaks users
// compare), and without the pool's driver calls per call.
void* torch_scratch(std::size_t bytes, cudaStream_t stream) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
}
void torch_scratch_release(void* ptr, cudaStream_t) { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }
const runtime::ScratchAllocator kTorchScratch{torch_scratch, torch_scratch_release};
const bool kScratchInstalled = (runtime::set_scratch_allocator(&kTorchScratch), true);
}  // namespace

TensorView view(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined(), "tessera.", op, ": argument '", arg, "': expected a tensor, got None");
  TensorView v;
  // A dtype tessera lacks on a tensor off the GPU: the library's device check refuses it first
  // (as it would any CPU tensor), so the view stands in uint8.
  TORCH_CHECK_TYPE(dtype_of(t.scalar_type(), v.dtype) || !t.is_cuda(), "tessera.", op,
                   ": argument '", arg, "': expected a dtype tessera supports (float32, float16, "
                   "bfloat16, ...), got ", torch_name(t.scalar_type()));
  if (!t.is_cuda() && !dtype_of(t.scalar_type(), v.dtype)) v.dtype = DType::uint8;
  TORCH_CHECK_VALUE(t.dim() <= kMaxDims, "tessera.", op, ": argument '", arg, "': expected at most ",
                    kMaxDims, " dimensions, got ", t.dim());
  v.data = t.data_ptr();
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  v.device = t.is_cuda() ? Device{DeviceType::cuda, t.get_device()} : Device{DeviceType::cpu, 0};
  return v;
}

cudaStream_t stream_of(const at::Tensor& t) {
  return t.is_cuda() ? c10::cuda::getCurrentCUDAStream(t.get_device()).stream() : nullptr;
}

}  // namespace tessera::torch_ops

TORCH_LIBRARY(tessera, m) {
  m.set_python_module("tessera._torch");
  for (const tessera::OpDesc& op : tessera::op_descriptions())
    for (const std::string& schema : op.schemas) m.def(schema.c_str());
}
