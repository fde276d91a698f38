#include "ops/elementwise/add_reference.hpp"

#include "bench/host.hpp"

namespace tessera::reference {

std::vector<double> add(const TensorView& a, const TensorView& b, double alpha) {
  return host::tabulate(a.numel(), [&](int64_t i) {
    return host::load_double(a, i) + alpha * host::load_double(b, i);
  });
}

std::vector<double> add(const TensorView& a, double b, double alpha) {
  return host::tabulate(a.numel(), [&](int64_t i) { return host::load_double(a, i) + alpha * b; });
}

}  // namespace tessera::reference
