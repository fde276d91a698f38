// Warp and block reductions. Ops are functors so that sum, max and the online-softmax merge
// (which later row-wise kernels need) share one shuffle tree.
#pragma once

#include <cstring>

namespace tessera::tile {

struct Sum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// __shfl_xor_sync for any trivially copyable value of whole 32-bit words (a float, or a small
// struct such as the online-softmax state), one shuffle per word.
template <class T>
__device__ __forceinline__ T shuffle_xor(T v, int offset) {
  static_assert(sizeof(T) % 4 == 0, "shuffle_xor moves whole 32-bit words");
  constexpr int kWords = sizeof(T) / 4;
  unsigned w[kWords];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_xor_sync(0xffffffffu, w[i], offset);
  memcpy(&v, w, sizeof(T));
  return v;
}

// Butterfly reduction: every lane ends with the result. The order of the combines is fixed, so
// the result is the same on every run.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, shuffle_xor(v, offset));
  return v;
}

template <class T> __device__ __forceinline__ T warp_sum(T v) { return warp_reduce(v, Sum{}); }
template <class T> __device__ __forceinline__ T warp_max(T v) { return warp_reduce(v, Max{}); }

// Block reduction for blockDim.x a multiple of 32 (up to 1024). Every thread gets the result.
// `scratch` is 32 elements of shared memory; the call may be repeated with the same scratch.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // the previous use of scratch is finished
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) { return block_reduce(v, Sum{}, T(0), scratch); }

}  // namespace tessera::tile
