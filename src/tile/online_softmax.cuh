// The online-softmax state of a set of values: its maximum m and the sum s of exp(x - m) over it,
// and how states merge. Two sets' states merge by taking the larger maximum M and rescaling each
// sum by exp(m - M) (rescale, merge_weight), so that partial results from lanes, warps, CTAs, row
// chunks or splits of a key sequence combine into the whole set's (max, sum) in one pass instead
// of two (max first, then sum). The kernels that merge such states (softmax, cross_entropy,
// attention's decode tier, whose partial outputs are rescaled by the same weight as their sums)
// and those that rescale a running sum to a new maximum take the factor from here.
#pragma once

#include "tile/activation.cuh"
#include "tile/constants.cuh"

namespace tessera::tile {

struct SoftmaxState {
  float m;
  float s;
};

// exp(x) on the MUFU (ex2.approx, ~2 ulp): every softmax kernel's one transcendental.
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * kLog2e); }

// The units of a state: natural (s sums exp(x - m)) or log2 (the values already scaled by log2(e),
// s sums 2^(x - m), one ex2.approx per term, as attention keeps its scores).
enum class Base { e, two };

// exp(m - M): the factor that takes a sum against maximum m to one against maximum M >= m.
template <Base B = Base::e>
__device__ __forceinline__ float rescale(float m, float M) {
  if constexpr (B == Base::e) return fast_exp(m - M);
  else return ex2_approx(m - M);
}

// A state's weight in a merge whose maximum is M: rescale, and 0 where M is -inf (every merged
// state then holds nothing but -inf, whose sums are 0, or NaN, which a sum of NaN keeps).
template <Base B = Base::e>
__device__ __forceinline__ float merge_weight(float m, float M) {
  return M == -INFINITY ? 0.0f : rescale<B>(m, M);
}

// The merge of two states, as a reduction op (tile/reduce.cuh). Exact in any grouping up to the
// rounding of the rescaled sums.
struct SoftmaxMerge {
  __device__ __forceinline__ SoftmaxState operator()(SoftmaxState a, SoftmaxState b) const {
    const float m = fmaxf(a.m, b.m);
    // Both maxima -inf: no finite term, but a NaN among -inf values must survive (s is 0 or NaN).
    if (m == -INFINITY) return {m, a.s + b.s};
    // Products rounded separately (no fma contraction): merge(a, b) and merge(b, a) give the same
    // bits, so every lane of a butterfly ends with the same sum.
    return {m, __fadd_rn(__fmul_rn(a.s, rescale(a.m, m)), __fmul_rn(b.s, rescale(b.m, m)))};
  }
};

}  // namespace tessera::tile
