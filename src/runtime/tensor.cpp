#include <algorithm>

#include "runtime/check.hpp"
#include "tessera/tensor.hpp"

namespace tessera {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float64: return "float64";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
    case DType::bool_: return "bool";
    case DType::float8_e4m3fn: return "float8_e4m3fn";
    case DType::float8_e5m2: return "float8_e5m2";
  }
  return "unknown";
}

std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::float64: case DType::int64: return 8;
    case DType::float32: case DType::int32: return 4;
    case DType::float16: case DType::bfloat16: case DType::int16: return 2;
    case DType::int8: case DType::uint8: case DType::bool_: return 1;
    case DType::float8_e4m3fn: case DType::float8_e5m2: return 1;
  }
  return 0;
}

bool is_floating(DType d) {
  return d == DType::float32 || d == DType::float16 || d == DType::bfloat16 || d == DType::float64 ||
         d == DType::float8_e4m3fn || d == DType::float8_e5m2;
}

std::string to_string(Device d) {
  return d.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::shape_str() const { return detail::shape_str(shape, ndim); }

TensorView TensorView::make(void* data, DType dtype, const int64_t* shape, const int64_t* strides,
                            int ndim, Device device) {
  if (ndim < 0 || ndim > kMaxDims)
    detail::throw_arg(ErrorKind::value, "TensorView", "ndim",
                      "0 to " + std::to_string(kMaxDims) + " dimensions", std::to_string(ndim));
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = ndim;
  v.device = device;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides ? strides[i] : stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return v;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make(data, dtype, shape.begin(), nullptr, static_cast<int>(shape.size()), device);
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  if (shape.size() != strides.size())
    detail::throw_arg(ErrorKind::value, "TensorView", "strides",
                      std::to_string(shape.size()) + " strides (one per dimension)",
                      std::to_string(strides.size()));
  return make(data, dtype, shape.begin(), strides.begin(), static_cast<int>(shape.size()), device);
}

}  // namespace tessera
