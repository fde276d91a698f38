#include "ops/elementwise/add_reference.hpp"

#include "runtime/host.hpp"

namespace tessera::reference {

std::vector<double> add(const TensorView& a, const TensorView& b, double alpha) {
  return runtime::tabulate(a.numel(), [&](int64_t i) {
    return runtime::load_double(a, i) + alpha * runtime::load_double(b, i);
  });
}

std::vector<double> add(const TensorView& a, double b, double alpha) {
  return runtime::tabulate(a.numel(), [&](int64_t i) { return runtime::load_double(a, i) + alpha * b; });
}

}  // namespace tessera::reference
