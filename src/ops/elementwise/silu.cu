// SiLU (swish) forward and backward, as torch.nn.functional.silu: x * sigmoid(x).
//
// Bytes: 2n * sizeof(T) forward, 3n * sizeof(T) backward; one exp and one division per element,
// far under the memory time.
#include "ops/elementwise/map.cuh"
#include "runtime/nvtx.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera {
namespace {

using elementwise::div_;
using elementwise::exp_;

// x / (1 + exp(-x)): for large negative x, exp(-x) overflows to inf and the quotient is -0, the
// limit; no 1 - sigmoid cancellation anywhere.
template <bool Fast>
struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return div_<Fast>(x, 1.0f + exp_<Fast>(-x)); }
};

// d/dx x s(x) = s (1 + x (1 - s)), with 1 - s = s * exp(-x); exp(-x) capped so that s * e stays
// finite (at the cap s is already 0 to float precision).
template <bool Fast>
struct SiluBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float e = exp_<Fast>(fminf(-x, 80.0f));
    const float s = div_<Fast>(1.0f, 1.0f + e);
    return dy * s * fmaf(x, s * e, 1.0f);
  }
};

}  // namespace

void silu(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu");
  if (!elementwise::check_map("silu", x, out)) return;
  elementwise::map_floats<Silu, 1>("silu", out, {&x}, stream);
}

void silu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_backward");
  if (!elementwise::check_map_backward("silu_backward", grad_out, x, grad_in)) return;
  elementwise::map_floats<SiluBackward, 2>("silu_backward", grad_in, {&grad_out, &x}, stream);
}

}  // namespace tessera
