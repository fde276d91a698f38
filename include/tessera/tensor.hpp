// Public tensor view: a non-owning description of memory (pointer, dtype, shape, strides, device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tessera {

// float8_e4m3fn and float8_e5m2 (1 byte each, torch's spelling) are taken by scaled_mm only.
enum class DType : uint8_t {
  float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, bool_,
  float8_e4m3fn, float8_e5m2
};
constexpr int kDTypeCount = static_cast<int>(DType::float8_e5m2) + 1;

const char* dtype_name(DType dtype);     // "float32", "bfloat16", ... (torch's spelling)
std::size_t dtype_size(DType dtype);     // bytes per element
bool is_floating(DType dtype);

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cuda;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
std::string to_string(Device device);  // "cuda:0", "cpu"

inline constexpr int kMaxDims = 8;

// Strides are in elements, as in torch. A stride of 0 broadcasts a dimension.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Device device{};

  int64_t numel() const;
  bool is_contiguous() const;       // row-major, no gaps (size-1 dims may have any stride)
  std::string shape_str() const;    // "[4, 5]"
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }

  // Row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  // Explicit strides (elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = {});
  // Runtime-sized form; strides may be null for row-major. Throws tessera::Error if ndim > kMaxDims.
  static TensorView make(void* data, DType dtype, const int64_t* shape, const int64_t* strides,
                         int ndim, Device device = {});
};

}  // namespace tessera
