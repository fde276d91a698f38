// CPU reference for copy: the source's values, row-major over its shape.
#pragma once

#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

std::vector<double> copy(const TensorView& src);

}  // namespace tessera::reference
