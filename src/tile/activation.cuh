// Activation functions and their derivatives, on float32 (the arithmetic type of every kernel):
// GELU (erf and tanh forms), SiLU, ReLU, as torch defines them. Shared by the elementwise ops and
// the fused epilogues of the matrix ops. Fast selects the MUFU forms, accurate to well under a
// half-type ulp, for kernels whose outputs are float16/bfloat16.
#pragma once

#include "tile/constants.cuh"

namespace tessera::tile {

// exp and division: the MUFU approximations (ex2.approx, rcp.approx; a few ulp of float32, far
// below a half-type ulp) for half types, the accurate library forms for float32.
template <bool Fast>
__device__ __forceinline__ float exp_(float x) { return Fast ? __expf(x) : expf(x); }
template <bool Fast>
__device__ __forceinline__ float div_(float a, float b) { return Fast ? __fdividef(a, b) : a / b; }

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
// float32: normcdff (CUDA's, through erfcf), which keeps full relative accuracy in the negative
// tail where torch's 1 + erf(z) cancels. Half types: erfc from a 10-term Chebyshev
// fit (Numerical Recipes' erfcc, fractional error < 1.2e-7 everywhere), one reciprocal and one
// exp2 on the MUFU pipe and ten FMAs, against erff's ~25 instructions: the erf-form kernels are
// instruction-bound at 8 bf16 elements per 16-byte load. Computing erfc(|z|) directly also keeps
// full relative accuracy in the negative tail, where 1 + erf(z) cancels.
template <bool Fast>
__device__ __forceinline__ float normal_cdf(float x, float* gauss = nullptr) {
  if constexpr (!Fast) {
    if (gauss) *gauss = expf(-0.5f * x * x);
    return normcdff(x);
  } else {
    constexpr double L = kLog2eDouble;  // the exponent goes to ex2 directly
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

struct Relu {
  __device__ __forceinline__ float operator()(float x) const { return x > 0.0f ? x : (x == x ? 0.0f : x); }
};

}  // namespace tessera::tile
