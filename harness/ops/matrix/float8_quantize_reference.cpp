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

float float8_multiplier(float amax, bool finite) {
  if (!finite) {
    float nan;
    const uint32_t bits = 0x7fc00000u;
    std::memcpy(&nan, &bits, 4);
    return nan;
  }
  return float(448.0 * (1.0 / std::max(double(amax), 1e-12)));
}

float float8_scale(float amax, bool finite) { return 1.0f / float8_multiplier(amax, finite); }

namespace {
// Each element's group, by the scale's index: of q's scales (rows) or of q_t's (columns).
int64_t group_of(Float8Granularity g, bool columns, int64_t i, int64_t j, int64_t cols) {
  const int64_t b = 128, kb = (cols + b - 1) / b;
  switch (g) {
    case Float8Granularity::tensor: return 0;
    case Float8Granularity::row: return columns ? j : i;
    case Float8Granularity::block: return columns ? i / b * cols + j : i * kb + j / b;
    default: return i / b * kb + j / b;  // block2d: one 128 x 128 block either way
  }
}

// The scales of every group (amax of its finite values, whether all are finite) and the bytes.
void quantize_groups(const std::vector<float>& x, int64_t rows, int64_t cols, Float8Granularity g, bool columns,
                     std::vector<float>& scale, std::vector<uint8_t>& q) {
  int64_t groups = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) groups = std::max(groups, group_of(g, columns, i, j, cols) + 1);
  std::vector<float> amax(size_t(groups), 0.0f);
  std::vector<char> finite(size_t(groups), 1);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = size_t(group_of(g, columns, i, j, cols));
      const float v = x[size_t(i * cols + j)];
      if (std::isfinite(v)) amax[k] = std::max(amax[k], std::fabs(v));
      else finite[k] = 0;
    }
  std::vector<float> mult(static_cast<size_t>(groups));
  scale.resize(size_t(groups));
  for (size_t k = 0; k < scale.size(); ++k) {
    mult[k] = float8_multiplier(amax[k], finite[k] != 0);
    scale[k] = 1.0f / mult[k];  // float8_scale's
  }
  // The product in float32, rounded once, as the torch reference multiplies; q_t transposed.
  q.resize(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      q[size_t(columns ? j * rows + i : i * cols + j)] =
          e4m3_byte(x[size_t(i * cols + j)] * mult[size_t(group_of(g, columns, i, j, cols))]);
}
}  // namespace

Float8Quantized float8_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, Float8Granularity g,
                                bool columns) {
  Float8Quantized r;
  quantize_groups(x, rows, cols, g, false, r.scale, r.q);
  if (columns) quantize_groups(x, rows, cols, g, true, r.scale_t, r.q_t);
  return r;
}

}  // namespace tessera::reference
