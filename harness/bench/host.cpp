#include "bench/host.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "runtime/check.hpp"

namespace tessera::host {

int64_t element_offset(const TensorView& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    off += (i % t.shape[d]) * t.strides[d];
    i /= t.shape[d];
  }
  return off;
}

double load_double(const TensorView& t, int64_t i) {
  const int64_t off = element_offset(t, i);
  switch (t.dtype) {
    case DType::float32: return static_cast<const float*>(t.data)[off];
    case DType::float64: return static_cast<const double*>(t.data)[off];
    case DType::float16: return __half2float(static_cast<const __half*>(t.data)[off]);
    case DType::bfloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[off]);
    // Integers: exact up to 2^53 in magnitude.
    case DType::int8: return static_cast<const int8_t*>(t.data)[off];
    case DType::int16: return static_cast<const int16_t*>(t.data)[off];
    case DType::int32: return static_cast<const int32_t*>(t.data)[off];
    case DType::int64: return static_cast<double>(static_cast<const int64_t*>(t.data)[off]);
    case DType::uint8: return static_cast<const uint8_t*>(t.data)[off];
    case DType::bool_: return static_cast<const bool*>(t.data)[off] ? 1.0 : 0.0;
    case DType::float8_e4m3fn:
      return float(static_cast<const __nv_fp8_e4m3*>(t.data)[off]);
    case DType::float8_e5m2:
      return float(static_cast<const __nv_fp8_e5m2*>(t.data)[off]);
  }
  detail::throw_arg(ErrorKind::type, "load_double", "t", "a known dtype", dtype_name(t.dtype));
}

void store_double(const TensorView& t, int64_t i, double v) {
  const int64_t off = element_offset(t, i);
  switch (t.dtype) {
    case DType::float32: static_cast<float*>(t.data)[off] = static_cast<float>(v); return;
    case DType::float64: static_cast<double*>(t.data)[off] = v; return;
    case DType::float16: static_cast<__half*>(t.data)[off] = __double2half(v); return;
    case DType::bfloat16: static_cast<__nv_bfloat16*>(t.data)[off] = __double2bfloat16(v); return;
    case DType::float8_e4m3fn: static_cast<__nv_fp8_e4m3*>(t.data)[off] = __nv_fp8_e4m3(v); return;
    case DType::float8_e5m2: static_cast<__nv_fp8_e5m2*>(t.data)[off] = __nv_fp8_e5m2(v); return;
    default: break;
  }
  detail::throw_arg(ErrorKind::type, "store_double", "t", "a floating dtype", dtype_name(t.dtype));
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t chunks = std::min<int64_t>(threads, std::max<int64_t>(1, n / 65536));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + chunks - 1) / chunks;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  for (auto& th : pool) th.join();
}

}  // namespace tessera::host
