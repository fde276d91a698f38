// Host-side element access for CPU references: read and write any float dtype as double through
// a view's strides, and split a loop across the machine's cores.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::host {

// Offset (elements) of row-major logical index i in view t.
int64_t element_offset(const TensorView& t, int64_t i);

// t must describe host memory. load_double reads any dtype (integers exact up to 2^53);
// store_double writes float dtypes only.
double load_double(const TensorView& t, int64_t logical_index);
void store_double(const TensorView& t, int64_t logical_index, double value);

// Calls fn(begin, end) over [0, n) in contiguous chunks on all hardware threads.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

// The vector of f(i) for i in [0, n), computed across the machine's cores.
template <class F>
std::vector<double> tabulate(int64_t n, F f) {
  std::vector<double> out(static_cast<std::size_t>(n));
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[static_cast<std::size_t>(i)] = f(i);
  });
  return out;
}

}  // namespace tessera::host
