#include "ops/elementwise/copy_reference.hpp"

#include "bench/host.hpp"

namespace tessera::reference {

std::vector<double> copy(const TensorView& src) {
  return host::tabulate(src.numel(), [&](int64_t i) { return host::load_double(src, i); });
}

}  // namespace tessera::reference
