// CPU reference for float8_quantize: float8_quantize_reference.hpp.
#include "ops/matrix/float8_quantize_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace tessera::reference {

uint8_t e4m3_byte(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::min(std::fabs(double(v)), 448.0);
  if (a == 0) return sign;
  // a in [2^e, 2^(e + 1)); below the normal range (2^-6) the subnormals keep 2^-6's step.
  int e = std::ilogb(a);
  e = std::max(e, -6);
  double m = std::nearbyint(std::ldexp(a, 3 - e));  // 8 <= m <= 16 (normal), 0 <= m <= 8 (subnormal); ties to even
  if (m == 16) ++e, m = 8;
  if (m < 8) return uint8_t(sign | uint8_t(m));  // subnormal (e == -6): exponent field 0
  return uint8_t(sign | uint8_t(((e + 7) << 3) | (int(m) - 8)));
}

float float8_scale(float amax, bool finite) {
  if (!finite) {
    float nan;
    const uint32_t bits = 0x7fc00000u;
    std::memcpy(&nan, &bits, 4);
    return nan;
  }
  return amax > 0 ? amax / 448.0f : 1.0f;
}

namespace {
// Over `n` values at x[first + i * stride]: (amax, all finite).
std::pair<float, bool> amax_of(const std::vector<float>& x, int64_t first, int64_t n, int64_t stride) {
  float m = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[size_t(first + i * stride)];
    finite = finite && std::isfinite(v);
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  }
  return {m, finite};
}
}  // namespace

Float8Quantized float8_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, bool tensor, bool columns) {
  Float8Quantized r;
  r.q.resize(size_t(rows * cols));
  if (tensor) {
    const auto [m, finite] = amax_of(x, 0, rows * cols, 1);
    r.scale = {float8_scale(m, finite)};
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      const auto [m, finite] = amax_of(x, i * cols, cols, 1);
      r.scale.push_back(float8_scale(m, finite));
    }
  }
  // The quotient in float32, as the torch reference divides: x / scale, rounded once.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      r.q[size_t(i * cols + j)] = e4m3_byte(x[size_t(i * cols + j)] / r.scale[tensor ? 0 : size_t(i)]);
  if (!columns) return r;
  if (tensor) {
    r.scale_t = r.scale;
  } else {
    for (int64_t j = 0; j < cols; ++j) {
      const auto [m, finite] = amax_of(x, j, rows, cols);
      r.scale_t.push_back(float8_scale(m, finite));
    }
  }
  r.q_t.resize(size_t(rows * cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i)
      r.q_t[size_t(j * rows + i)] = e4m3_byte(x[size_t(i * cols + j)] / r.scale_t[tensor ? 0 : size_t(j)]);
  return r;
}

}  // namespace tessera::reference
