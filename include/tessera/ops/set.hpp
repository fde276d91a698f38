// Set operators: isin. Checks arguments before any launch (tessera::Error names the argument),
// returns at once when there is nothing to do, and enqueues its kernels on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "tessera/tensor.hpp"

namespace tessera {

// How isin finds elements in test_elements.
enum class IsinPath {
  automatic,    // chosen from the sizes and dtype (see IsinOptions)
  brute_force,  // one fused kernel compares every element with every test element (small inputs)
  sort,         // radix-sort test_elements once, then a binary search per element
  hash,         // an open-addressing hash set of test_elements, then one probe per element
  bitmap,       // 8- and 16-bit dtypes only: a presence bit per possible value
};
const char* isin_path_name(IsinPath path);  // "automatic", "brute_force", ...
// The path of that name; throws tessera::Error naming `op` for any other.
void parse(const char* op, std::string_view name, IsinPath& out);

// The automatic dispatch, tunable. The defaults are the crossovers measured on an H200
// (docs/PERF.md, isin): brute force only while it is a single cheap launch (2^10 x 2^10, or
// 2^20 elements against up to 2^6 test elements); beyond that the hash set beat sort + search at
// every size measured (2^20 and 2^24 elements against 2^8 .. 2^22 test elements), so sort is
// taken only when asked for or when hash_min_test is raised.
struct IsinOptions {
  IsinPath path = IsinPath::automatic;
  // brute force while test_elements has at most this many elements...
  int64_t brute_force_max_test = 1024;
  // ...and numel(elements) * numel(test_elements) stays under this many comparisons.
  int64_t brute_force_max_work = int64_t(1) << 26;
  // 32- and 64-bit dtypes: the hash set from this many test elements on, sort + search below.
  int64_t hash_min_test = 1;
};

// out[i] = (elements[i] is in test_elements), or its negation with `invert`, as torch.isin:
// out is a bool tensor of elements' shape (any strides; it must not overlap the inputs);
// elements and test_elements have one dtype (any integer dtype, uint8, float16, bfloat16,
// float32, float64) and any shapes and strides. NaN is never found; -0.0 equals 0.0.
// assume_unique keeps torch's meaning (both inputs are known to be free of duplicates); no path
// here needs it, so it changes nothing but is accepted for compatibility.
void isin(const TensorView& elements, const TensorView& test_elements, const TensorView& out,
          bool assume_unique, bool invert, cudaStream_t stream,
          const IsinOptions& options = IsinOptions{});

// The path `isin` takes for these sizes and dtype under `options` (what `automatic` resolves to).
IsinPath isin_choose_path(DType dtype, int64_t num_elements, int64_t num_test,
                          const IsinOptions& options = IsinOptions{});

}  // namespace tessera
