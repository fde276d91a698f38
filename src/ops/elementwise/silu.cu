// SiLU (swish) forward and backward, as torch.nn.functional.silu: x * sigmoid(x).
//
// Bytes: 2n * sizeof(T) forward, 3n * sizeof(T) backward; one exp and one division per element,
// far under the memory time.
#include "ops/elementwise/map.cuh"
#include "runtime/nvtx.hpp"
#include "runtime/validate.hpp"
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
  detail::check_cuda_tensor("silu", "x", x);
  detail::check_dtype_in("silu", "x", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like("silu", "out", out, "x", x);
  detail::check_no_internal_overlap("silu", "out", out);
  detail::check_no_overlap("silu", "out", out, "x", x, /*allow_identical=*/true);
  if (out.numel() == 0) return;
  elementwise::map_floats<Silu, 1>("silu", out, {&x}, stream);
}

void silu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_backward");
  detail::check_cuda_tensor("silu_backward", "x", x);
  detail::check_dtype_in("silu_backward", "x", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like("silu_backward", "grad_out", grad_out, "x", x);
  detail::check_like("silu_backward", "grad_in", grad_in, "x", x);
  detail::check_no_internal_overlap("silu_backward", "grad_in", grad_in);
  detail::check_no_overlap("silu_backward", "grad_in", grad_in, "x", x, true);
  detail::check_no_overlap("silu_backward", "grad_in", grad_in, "grad_out", grad_out, true);
  if (grad_in.numel() == 0) return;
  elementwise::map_floats<SiluBackward, 2>("silu_backward", grad_in, {&grad_out, &x}, stream);
}

}  // namespace tessera
