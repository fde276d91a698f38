// Vector loads and stores. A Vec<T, N> is N elements moved as one aligned access; with
// N = 16 / sizeof(T) that is one 16-byte LDG.128/STG.128 per thread, the width that saturates
// HBM with the fewest instructions. The masked forms serve the ragged end of a tensor.
#pragma once

#include <cstdint>

namespace tessera::tile {

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};

// Elements per 16-byte access.
template <class T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// True when p can be read as Vec<T, N> (aligned to the vector's size).
template <class T, int N>
__host__ __device__ __forceinline__ bool is_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * N) == 0;
}

// Whole-vector load; p must be aligned and all N elements in bounds.
template <int N, class T>
__device__ __forceinline__ Vec<T, N> load(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

// Loads the first `valid` elements (0 <= valid <= N) one by one; the rest get `fill`.
template <int N, class T>
__device__ __forceinline__ Vec<T, N> load_masked(const T* p, int valid, T fill) {
  Vec<T, N> r;
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = i < valid ? p[i] : fill;
  return r;
}

template <int N, class T>
__device__ __forceinline__ void store(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// One 16-byte store that the compiler cannot split. Where a kernel picks between a whole-vector
// store and a masked element-wise one for the same addresses, the optimizer may merge the two
// branches into the element-wise form (seen in softmax: every store became four STG.E); the
// inline PTX keeps the fast branch a single STG.128. p must be 16-byte aligned.
__device__ __forceinline__ void store_16B(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// Stores the first `valid` elements only.
template <int N, class T>
__device__ __forceinline__ void store_masked(T* p, const Vec<T, N>& v, int valid) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < valid) p[i] = v[i];
}

// Load or masked load of elements [i, i + N) of a length-n array: the one call kernels use.
// Elements past the end read as `fill` (softmax pads with -inf, sums with 0).
template <int N, class T>
__device__ __forceinline__ Vec<T, N> load_tile(const T* base, int64_t i, int64_t n, T fill = T{}) {
  if (i + N <= n) return load<N>(base + i);
  return load_masked<N>(base + i, static_cast<int>(n > i ? n - i : 0), fill);
}

template <int N, class T>
__device__ __forceinline__ void store_tile(T* base, int64_t i, int64_t n, const Vec<T, N>& v) {
  if (i + N <= n)
    store<N>(base + i, v);
  else if (i < n)
    store_masked<N>(base + i, v, static_cast<int>(n - i));
}

// L2 eviction priority for loads (sm_80+), for kernels that read a range twice: the first read
// marks its lines evict_last so that they are still in L2 for the second, which marks them
// evict_first so that they leave before lines other CTAs still need.
enum class L2Hint { kEvictLast, kEvictFirst };

template <L2Hint H>
__device__ __forceinline__ uint64_t l2_policy() {
  uint64_t policy;
  if constexpr (H == L2Hint::kEvictLast)
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// One 16-byte load (16-byte aligned address) with an L2 policy from l2_policy. For data the
// kernel does not write: the load is not ordered against the kernel's own stores.
__device__ __forceinline__ uint4 load_16B_hint(const void* p, uint64_t policy) {
  uint4 r;
  asm("ld.global.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(policy));
  return r;
}

// One 16-byte load (16-byte aligned address) of data read once: kept out of L1, and the rest of
// its 256-byte L2 line fetched along with it, for streams such as a weight matrix read a few
// rows per warp. Through the read-only path: the kernel must not write what it reads so.
__device__ __forceinline__ uint4 load_16B_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace tessera::tile
