#include "ops/set/isin_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bench/host.hpp"

namespace tessera::reference {
namespace {

int64_t load_int(const TensorView& t, int64_t i) {
  const int64_t off = host::element_offset(t, i);
  switch (t.dtype) {
    case DType::int8: return static_cast<const int8_t*>(t.data)[off];
    case DType::int16: return static_cast<const int16_t*>(t.data)[off];
    case DType::int32: return static_cast<const int32_t*>(t.data)[off];
    case DType::int64: return static_cast<const int64_t*>(t.data)[off];
    case DType::bool_: return static_cast<const bool*>(t.data)[off];
    default: return static_cast<const uint8_t*>(t.data)[off];
  }
}

// Sorted test values, then one binary search per element.
template <class V, class Load>
std::vector<double> search(const TensorView& e, const TensorView& t, bool invert, Load load) {
  std::vector<V> table;
  table.reserve(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const V v = load(t, i);
    if (v == v) table.push_back(v);  // NaN is never found
  }
  std::sort(table.begin(), table.end());
  std::vector<double> out(static_cast<size_t>(e.numel()));
  host::parallel_for(e.numel(), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const V v = load(e, i);
      const bool found = v == v && std::binary_search(table.begin(), table.end(), v);
      out[i] = found != invert ? 1.0 : 0.0;
    }
  });
  return out;
}

}  // namespace

std::vector<double> isin(const TensorView& elements, const TensorView& test_elements, bool invert) {
  if (is_floating(elements.dtype))
    return search<double>(elements, test_elements, invert,
                          [](const TensorView& t, int64_t i) { return host::load_double(t, i); });
  return search<int64_t>(elements, test_elements, invert, load_int);
}

}  // namespace tessera::reference
