// CPU reference for seeded dropout, forward and backward: the Philox stream the kernels draw and
// the keep decision, in double precision. Inputs are host views (any strides); results are
// row-major.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

// Philox4x32-10 (Salmon et al., SC'11): four words from a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32_10(const std::array<uint32_t, 4>& counter,
                                      const std::array<uint32_t, 2>& key);
// Whether dropout(p, seed, offset) keeps element i (row-major logical index): word i % 4 of
// Philox(counter = offset + i / 4, key = seed), as (word >> 8) * 2^-24, is >= float(p).
bool dropout_keep(uint64_t seed, uint64_t offset, int64_t i, double p);
// The factor kept elements are multiplied by: 1 / (1 - p) rounded to float (0 when nothing is kept).
float dropout_scale(double p);
// x * scale where kept, 0 where dropped (the products are exact in double).
std::vector<double> dropout(const TensorView& x, double p, uint64_t seed, uint64_t offset);
// grad_out * scale where the forward with the same (p, seed, offset) kept, 0 elsewhere.
std::vector<double> dropout_backward(const TensorView& grad_out, double p, uint64_t seed,
                                     uint64_t offset);

}  // namespace tessera::reference
