// GELU forward and backward, erf and tanh forms, as torch defines them.
//
// Bytes: 2n * sizeof(T) forward, 3n * sizeof(T) backward. At 8 bf16 elements per 16-byte load
// the arithmetic budget at copy bandwidth is ~30 instructions per element, so the math is kept
// short: half types use the MUFU exp/reciprocal, float32 the accurate library functions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <type_traits>

#include "ops/elementwise/map.cuh"
#include "runtime/nvtx.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera {
namespace {

using elementwise::div_;
using elementwise::exp_;

constexpr float kSqrt1_2 = 0.70710678118654752f;    // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2*pi)
constexpr float kBeta = 0.79788456080286536f;        // sqrt(2/pi)
constexpr float kKappa = 0.044715f;

// 2^x on the MUFU with denormal results flushed (exp2f adds range fix-ups around the same op).
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Standard normal CDF Phi(x) and, on request, exp(-x^2/2).
// float32: erff (CUDA's, ~2 ulp), as torch computes it. Half types: erfc from a 10-term Chebyshev
// fit (Numerical Recipes' erfcc, fractional error < 1.2e-7 everywhere), one reciprocal and one
// exp2 on the MUFU pipe and ten FMAs, against erff's ~25 instructions: the erf-form kernels are
// instruction-bound at 8 bf16 elements per 16-byte load. Computing erfc(|z|) directly also keeps
// full relative accuracy in the negative tail, where 1 + erf(z) cancels.
template <bool Fast>
__device__ __forceinline__ float normal_cdf(float x, float* gauss = nullptr) {
  if constexpr (!Fast) {
    if (gauss) *gauss = expf(-0.5f * x * x);
    return 0.5f * (1.0f + erff(x * kSqrt1_2));
  } else {
    constexpr double L = 1.4426950408889634;  // log2(e): the exponent goes to ex2 directly
    const float z = fabsf(x) * kSqrt1_2;
    const float t = __fdividef(1.0f, 1.0f + 0.5f * z);
    float p = float(0.17087277 * L);
    p = fmaf(p, t, float(-0.82215223 * L));
    p = fmaf(p, t, float(1.48851587 * L));
    p = fmaf(p, t, float(-1.13520398 * L));
    p = fmaf(p, t, float(0.27886807 * L));
    p = fmaf(p, t, float(-0.18628806 * L));
    p = fmaf(p, t, float(0.09678418 * L));
    p = fmaf(p, t, float(0.37409196 * L));
    p = fmaf(p, t, float(1.00002368 * L));
    p = fmaf(p, t, float(-1.26551223 * L));
    const float zz = z * z;
    if (gauss) *gauss = ex2_approx(-zz * float(L));  // exp(-x^2 / 2)
    const float half_erfc = 0.5f * t * ex2_approx(fmaf(-zz, float(L), p));  // 0.5 * erfc(|z|)
    return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
  }
}

template <bool Fast>
struct GeluErf {
  __device__ __forceinline__ float operator()(float x) const { return x * normal_cdf<Fast>(x); }
};

// tanh form. 0.5 * (1 + tanh(u)) is written as sigmoid(2u) = 1 / (1 + exp(-2u)): the sum 1 + t
// cancels for negative x (t -> -1), so any error in t becomes a large relative error in the
// small outputs there; the sigmoid form has no cancellation and costs one exp and one division.
template <bool Fast>
struct GeluTanh {
  __device__ __forceinline__ float operator()(float x) const {
    const float u = kBeta * (x + kKappa * x * x * x);
    return div_<Fast>(x, 1.0f + exp_<Fast>(-2.0f * u));
  }
};

// d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
template <bool Fast>
struct GeluErfBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    float gauss;
    const float cdf = normal_cdf<Fast>(x, &gauss);
    return dy * fmaf(x * kInvSqrt2Pi, gauss, cdf);
  }
};

// With s = sigmoid(2u) = (1 + t) / 2: d/dx = s + 2 x s (1 - s) u', and 1 - s = s * exp(-2u),
// again free of cancellation.
template <bool Fast>
struct GeluTanhBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    const float x2 = x * x;
    // Capped so that e stays finite: for x below about -10, exp(-2u) overflows and s * e would
    // be 0 * inf. At the cap s ~ 2e-35, so the result is already 0 to float precision.
    const float e = exp_<Fast>(fminf(-2.0f * kBeta * (x + kKappa * x2 * x), 80.0f));
    const float s = div_<Fast>(1.0f, 1.0f + e);
    const float du = kBeta * (1.0f + 3.0f * kKappa * x2);
    return dy * (s + 2.0f * x * s * (s * e) * du);
  }
};

}  // namespace

void gelu(const TensorView& x, const TensorView& out, GeluApproximate approximate,
          cudaStream_t stream) {
  runtime::NvtxRange range("tessera::gelu");
  if (!elementwise::check_map("gelu", x, out)) return;
  if (approximate == GeluApproximate::tanh)
    elementwise::map_floats<GeluTanh, 1>("gelu", out, {&x}, stream);
  else
    elementwise::map_floats<GeluErf, 1>("gelu", out, {&x}, stream);
}

void gelu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   GeluApproximate approximate, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::gelu_backward");
  if (!elementwise::check_map_backward("gelu_backward", grad_out, x, grad_in)) return;
  if (approximate == GeluApproximate::tanh)
    elementwise::map_floats<GeluTanhBackward, 2>("gelu_backward", grad_in, {&grad_out, &x}, stream);
  else
    elementwise::map_floats<GeluErfBackward, 2>("gelu_backward", grad_in, {&grad_out, &x}, stream);
}

}  // namespace tessera
