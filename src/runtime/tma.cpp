#include "runtime/tma.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "runtime/check.hpp"

namespace tessera::runtime {
namespace {

CUtensorMapDataType tma_dtype(DType d) {
  switch (d) {
    case DType::float32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::float16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::bfloat16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    default: return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // fp8 and bytes: moved as bytes
  }
}

CUtensorMapSwizzle tma_swizzle(TmaSwizzle s) {
  switch (s) {
    case TmaSwizzle::b32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case TmaSwizzle::b64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case TmaSwizzle::b128: return CU_TENSOR_MAP_SWIZZLE_128B;
    default: return CU_TENSOR_MAP_SWIZZLE_NONE;
  }
}

uint32_t swizzle_span(TmaSwizzle s) {
  return s == TmaSwizzle::b32 ? 32 : s == TmaSwizzle::b64 ? 64 : s == TmaSwizzle::b128 ? 128 : 0;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    (void)cudaGetLastError();
  });
  return fn;
}

}  // namespace

bool tma_can_map(DType dtype, const void* base, const TmaShape& s, TmaSwizzle swizzle) {
  const uint64_t elem = dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || s.rank < 2 || s.rank > 5 || s.strides[0] != 1)
    return false;
  for (int i = 0; i < s.rank; ++i) {
    if (s.dims[i] == 0 || s.dims[i] > (uint64_t{1} << 32) || s.box[i] == 0 || s.box[i] > 256)
      return false;
    if (i > 0 && (s.strides[i] == 0 || (s.strides[i] * elem) % 16 != 0 || s.strides[i] * elem >= (uint64_t{1} << 40)))
      return false;
  }
  if ((s.box[0] * elem) % 16 != 0) return false;
  const uint32_t span = swizzle_span(swizzle);
  return span == 0 || s.box[0] * elem <= span;
}

CUtensorMap tma_map(const char* op, DType dtype, const void* base, const TmaShape& s,
                    TmaSwizzle swizzle) {
  const auto encode = encode_fn();
  if (!encode)
    detail::throw_arg(ErrorKind::runtime, op, "tensor map",
                      "the driver's cuTensorMapEncodeTiled", "none in this driver");
  const uint64_t elem = dtype_size(dtype);
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], elem_strides[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < s.rank; ++i) {
    dims[i] = s.dims[i];
    box[i] = s.box[i];
    if (i > 0) strides[i - 1] = s.strides[i] * elem;
  }
  CUtensorMap map{};
  const auto encode_map = [&] {
    return encode(&map, tma_dtype(dtype), static_cast<cuuint32_t>(s.rank), const_cast<void*>(base), dims,
                  strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, tma_swizzle(swizzle),
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = encode_map();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // The driver call needs a current context, which the runtime calls before it did not need:
    // the thread's context can be unset or stale while the runtime's device is right (a host
    // thread that launched nothing yet, another library that switched contexts). Binding the
    // pointer's device's primary context (cudaSetDevice does) and trying again fixes both.
    cudaPointerAttributes at{};
    if (cudaPointerGetAttributes(&at, base) == cudaSuccess && at.device >= 0 && cudaSetDevice(at.device) == cudaSuccess)
      r = encode_map();
    (void)cudaGetLastError();
  }
  if (r != CUDA_SUCCESS)
    detail::throw_arg(ErrorKind::runtime, op, "tensor map", "a map the driver accepts",
                      "CUresult " + std::to_string(static_cast<int>(r)));
  return map;
}

}  // namespace tessera::runtime
