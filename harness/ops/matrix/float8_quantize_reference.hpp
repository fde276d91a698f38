// CPU reference for float8_quantize (tessera/ops/matrix.hpp), bit for bit: the float32 rules of
// tessera.float8.quantize, with its own float8_e4m3fn encoder (double arithmetic on the float32
// products, rounding to nearest even, saturated at +-448).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/ops/matrix.hpp"

namespace tessera::reference {

// The e4m3fn byte of a float32 value: rounded to nearest even, magnitudes above 448 saturated to
// 448 (clamped first, as the torch reference clamps), NaN 0x7f (the GPU's canonical NaN is
// positive, and every NaN product of the kernels is one).
uint8_t e4m3_byte(float v);

// A group's multiplier from its values' amax and whether all are finite: 448 * (1 / max(amax,
// 1e-12)) in double, rounded to float32 (torchao's amax_to_scale); NaN (torch's float('nan'),
// bits 0x7fc00000) for a group holding inf or NaN. Its elements quantize as x * m in float32.
float float8_multiplier(float amax, bool finite);

// A group's scale (the dequantization factor): 1 / float8_multiplier in float32.
float float8_scale(float amax, bool finite);

// The scales row-major in float8_quantize's shapes (tessera/ops/matrix.hpp).
struct Float8Quantized {
  std::vector<uint8_t> q;      // [rows, cols]
  std::vector<float> scale;    // [rows] (row), [1] (tensor), [rows, ceil(cols / 128)] (block), [rows / 128, cols / 128] (block2d)
  std::vector<uint8_t> q_t;    // [cols, rows], where columns were asked for
  std::vector<float> scale_t;  // [cols] (row), [1] (tensor), [ceil(rows / 128), cols] (block), as scale (block2d)
};

// x: rows x cols row-major, the input's values as float32 (every input dtype converts exactly).
// columns: also x's columns quantized along the rows, transposed.
Float8Quantized float8_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, Float8Granularity g,
                                bool columns);

}  // namespace tessera::reference
