// CPU reference for grouped_mm, in double precision, from the inputs' values as stored. Inputs are
// host views with any strides, shaped as tessera::grouped_mm takes them (the form follows from
// their dimensions and from offs, as the op reads it); the result is row-major over out's shape.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

// The groups' ends as the op clamps them: end[g] = min(max(offs[g], end[g - 1]), extent), end[-1]
// = 0 (an end below the one before it makes its group empty; none passes the extent).
std::vector<int64_t> grouped_ends(const TensorView& offs, int64_t extent);

// The products of the four forms (tessera/ops/matrix.hpp): rows (input [M, K], other [G, K, N],
// offs over M), columns (input [G, M, K], other [K, N], offs over N), depth (input [M, K], other
// [K, N], offs over K, out [G, M, N]) and batched (both 3-d, offs nullptr). out gives the shape
// only. Where `zeroed` is given it is set, element for element, to 1 where the rules make the
// output zero: rows (columns) past the last end, and the whole of out[g] for an empty K range.
std::vector<double> grouped_mm(const TensorView& input, const TensorView& other, const TensorView* offs,
                               const TensorView& out, std::vector<char>* zeroed = nullptr);

}  // namespace tessera::reference
