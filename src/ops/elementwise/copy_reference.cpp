#include "ops/elementwise/copy_reference.hpp"

#include "runtime/host.hpp"

namespace tessera::reference {

std::vector<double> copy(const TensorView& src) {
  return runtime::tabulate(src.numel(), [&](int64_t i) { return runtime::load_double(src, i); });
}

}  // namespace tessera::reference
