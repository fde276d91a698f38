// Packed row fragments: the register form of a row-wise kernel's data.
//
// A Frag<T, V> is V elements of T (V = 16 / sizeof(T), one 16-byte access, or V = 1) held as the
// 32-bit words that contain them. Fragments stay packed from load to store: as separate 16-bit
// values the compiler gives every element a register of its own, and a row of 8 vectors per
// thread no longer fits in 64 registers. Elements become float where they are used (f[e]: one
// shift or mask for bf16, one cvt for fp16, nothing for fp32), and results are packed back two
// at a time (one cvt per pair).
//
// Loads and stores come in two forms: whole vectors (the row is known to cover them), and
// windowed ones over an aligned "frame" in which only columns [lo, hi) are valid (a row that does
// not start on a 16-byte boundary, or the ragged end of a row), which split into element
// accesses at the two ends of the window only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tile/convert.cuh"
#include "tile/vec.cuh"

namespace tessera::tile {

template <class T, int V>
struct Frag {
  static_assert(V == 1 || V * sizeof(T) == 16, "a fragment is one element or one 16-byte vector");
  static constexpr int kWords = (V * static_cast<int>(sizeof(T)) + 3) / 4;
  uint32_t w[kWords];

  // Element e as float.
  __device__ __forceinline__ float operator[](int e) const {
    if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(w[e]);
    } else {
      const uint32_t h = w[e >> 1];
      const bool high = V > 1 && (e & 1);
      if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(high ? h & 0xffff0000u : h << 16);
      else return __half2float(__ushort_as_half(static_cast<unsigned short>(high ? h >> 16 : h)));
    }
  }
};

// The bits of one element, in the low bits of a word, and back.
template <class T> __device__ __forceinline__ uint32_t to_bits(T x);
template <> __device__ __forceinline__ uint32_t to_bits(float x) { return __float_as_uint(x); }
template <> __device__ __forceinline__ uint32_t to_bits(__half x) { return __half_as_ushort(x); }
template <> __device__ __forceinline__ uint32_t to_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

template <class T> __device__ __forceinline__ T from_bits(uint32_t b);
template <> __device__ __forceinline__ float from_bits(uint32_t b) { return __uint_as_float(b); }
template <> __device__ __forceinline__ __half from_bits(uint32_t b) {
  return __ushort_as_half(static_cast<unsigned short>(b));
}
template <> __device__ __forceinline__ __nv_bfloat16 from_bits(uint32_t b) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(b));
}

// -inf as T's bits: what a softmax pads a row with.
template <class T> __device__ __forceinline__ uint32_t neg_inf_bits() {
  if constexpr (std::is_same_v<T, float>) return 0xff800000u;
  else if constexpr (std::is_same_v<T, __half>) return 0xfc00u;
  else return 0xff80u;
}

// Element e's bits (the low bits of the word).
template <class T, int V>
__device__ __forceinline__ uint32_t element_bits(const Frag<T, V>& f, int e) {
  if constexpr (sizeof(T) == 4) return f.w[e];
  else return f.w[e / 2] >> (16 * (e & 1));
}

// The V elements as floats: the inverse of pack.
template <class T, int V>
__device__ __forceinline__ void unpack(const Frag<T, V>& f, float (&v)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = f[e];
}

// V floats rounded to T, 16-bit types two at a time (one cvt for the pair).
template <class T, int V>
__device__ __forceinline__ Frag<T, V> pack(const float (&v)[V]) {
  Frag<T, V> f;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int e = 0; e < V; ++e) f.w[e] = __float_as_uint(v[e]);
  } else if constexpr (V == 1) {
    f.w[0] = to_bits(from_float<T>(v[0]));
  } else {
#pragma unroll
    for (int e = 0; e < V; e += 2) {
      if constexpr (std::is_same_v<T, __half>) {
        const __half2 h = __floats2half2_rn(v[e], v[e + 1]);
        memcpy(&f.w[e / 2], &h, 4);
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[e], v[e + 1]);
        memcpy(&f.w[e / 2], &h, 4);
      }
    }
  }
  return f;
}

// The same, one cvt per element. The paired cvt needs both floats at once; converting each as
// soon as it is computed keeps fewer floats live, which decides whether the kernels that hold
// two rows at once (the norm backward tiers) fit their registers.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> pack_each(const float (&v)[V]) {
  if constexpr (sizeof(T) == 4 || V == 1) {
    return pack<T, V>(v);
  } else {
    Frag<T, V> f;
#pragma unroll
    for (int e = 0; e < V; e += 2)
      f.w[e / 2] = to_bits(from_float<T>(v[e])) | (to_bits(from_float<T>(v[e + 1])) << 16);
    return f;
  }
}

// Every element v.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> splat(float v) {
  float f[V];
#pragma unroll
  for (int e = 0; e < V; ++e) f[e] = v;
  return pack_each<T, V>(f);
}

// Every element the element with bits `b` (to_bits).
template <class T, int V>
__device__ __forceinline__ Frag<T, V> splat_bits(uint32_t b) {
  Frag<T, V> f;
  const uint32_t w = sizeof(T) == 4 || V == 1 ? b : b | (b << 16);
#pragma unroll
  for (int i = 0; i < Frag<T, V>::kWords; ++i) f.w[i] = w;
  return f;
}

// Whole-fragment load and store at p (16-byte aligned for V > 1).
template <class T, int V>
__device__ __forceinline__ Frag<T, V> load_frag(const T* p) {
  Frag<T, V> f;
  if constexpr (V > 1) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    f.w[0] = v.x, f.w[1] = v.y, f.w[2] = v.z, f.w[3] = v.w;
  } else {
    f.w[0] = to_bits(*p);
  }
  return f;
}

template <class T, int V>
__device__ __forceinline__ void store_frag(T* p, const Frag<T, V>& f) {
  if constexpr (V > 1) *reinterpret_cast<uint4*>(p) = make_uint4(f.w[0], f.w[1], f.w[2], f.w[3]);
  else *p = from_bits<T>(f.w[0]);
}

// load_frag with an L2 policy (tile::l2_policy) where the fragment is 16 bytes.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> load_frag_hint(const T* p, uint64_t policy) {
  if constexpr (V > 1) {
    const uint4 v = load_16B_hint(p, policy);
    Frag<T, V> f;
    f.w[0] = v.x, f.w[1] = v.y, f.w[2] = v.z, f.w[3] = v.w;
    return f;
  } else {
    return load_frag<T, V>(p);
  }
}

// The same store as one STG.128 the compiler cannot split (tile::store_16B): for kernels that
// pick between this and a masked store of the same addresses, which the optimizer may otherwise
// merge into the element-wise form.
template <class T, int V>
__device__ __forceinline__ void store_frag_16B(T* p, const Frag<T, V>& f) {
  static_assert(V > 1, "a 16-byte store needs a 16-byte fragment");
  store_16B(p, f.w[0], f.w[1], f.w[2], f.w[3]);
}

// store_frag for data the kernel does not read again: a 16-byte fragment goes out as a streaming
// store (st.global.cs), which L2 evicts first, so it does not push out lines still to be read.
template <class T, int V>
__device__ __forceinline__ void store_frag_stream(T* p, const Frag<T, V>& f) {
  if constexpr (V > 1) __stcs(reinterpret_cast<uint4*>(p), make_uint4(f.w[0], f.w[1], f.w[2], f.w[3]));
  else *p = from_bits<T>(f.w[0]);
}

// Elements [c, c + V) of an aligned frame of which columns [lo, hi) are valid; the others read as
// the element with bits `fill`.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> load_frag_window(const T* frame, int c, int lo, int hi, uint32_t fill) {
  Frag<T, V> f;
  if constexpr (V == 1) {
    f.w[0] = c >= lo && c < hi ? to_bits(frame[c]) : fill;
  } else if (c >= lo && c + V <= hi) {
    f = load_frag<T, V>(frame + c);
  } else {
    constexpr int kPer = 4 / sizeof(T);  // elements per word
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int col = c + i * kPer + j;
        w |= (col >= lo && col < hi ? to_bits(frame[col]) : fill) << (16 * j);
      }
      f.w[i] = w;
    }
  }
  return f;
}

template <class T, int V>
__device__ __forceinline__ void store_frag_window(T* frame, int c, int lo, int hi, const Frag<T, V>& f) {
  if constexpr (V == 1) {
    if (c >= lo && c < hi) frame[c] = from_bits<T>(f.w[0]);
  } else if (c >= lo && c + V <= hi) {
    store_frag_16B(frame + c, f);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (c + e >= lo && c + e < hi) frame[c + e] = from_bits<T>(element_bits(f, e));
  }
}

// A row's misalignment in elements. A row that does not start on a 16-byte boundary (row r of an
// odd-length row-major tensor starts r * n elements in) is read through the aligned frame that
// contains it, frame = row - lead, as frame columns [lead, lead + n).
template <int V, class T>
__device__ __forceinline__ int row_lead(const T* row) {
  if constexpr (V == 1) return 0;
  else return static_cast<int>((reinterpret_cast<uintptr_t>(row) / sizeof(T)) % V);
}

// Max over U fragments and m, taken in the storage type (max is exact there: no conversions, one
// max.bf16x2 or max.f16x2 per word). Like fmaxf it skips NaN.
template <class T, int V, int U>
__device__ __forceinline__ float frag_max(const Frag<T, V> (&f)[U], float m) {
  constexpr int W = Frag<T, V>::kWords;
  if constexpr (sizeof(T) == 4) {
    float mw[W];
#pragma unroll
    for (int i = 0; i < W; ++i) mw[i] = m;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < W; ++i) mw[i] = fmaxf(mw[i], __uint_as_float(f[u].w[i]));
#pragma unroll
    for (int i = 1; i < W; ++i) m = fmaxf(m, mw[i]);
    return fmaxf(m, mw[0]);
  } else if constexpr (V == 1) {
    T acc = from_bits<T>(f[0].w[0]);
#pragma unroll
    for (int u = 1; u < U; ++u) acc = __hmax(acc, from_bits<T>(f[u].w[0]));
    return fmaxf(m, to_float(acc));
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2 acc[W];
#pragma unroll
    for (int i = 0; i < W; ++i) memcpy(&acc[i], &f[0].w[i], 4);
#pragma unroll
    for (int u = 1; u < U; ++u)
#pragma unroll
      for (int i = 0; i < W; ++i) {
        T2 x;
        memcpy(&x, &f[u].w[i], 4);
        acc[i] = __hmax2(acc[i], x);
      }
#pragma unroll
    for (int i = 1; i < W; ++i) acc[0] = __hmax2(acc[0], acc[i]);
    return fmaxf(m, fmaxf(to_float(acc[0].x), to_float(acc[0].y)));
  }
}

// ---- keeping the compiler from holding float copies of a row ------------------------------------
// A kernel that converts a packed row to float before a reduction and again after it would, left
// alone, have the compiler keep the first conversions alive through the reduction: twice the
// registers of the packed 16-bit row, and spills. `zero` is a kernel argument that is always 0,
// unknown to the compiler; mixing it (or a reduction's result masked by it) into the words makes
// the second conversion differ from the first. One LOP per word, 16-bit types only.
template <class T, int V>
__device__ __forceinline__ void make_opaque(Frag<T, V>& f, uint32_t z) {
  if constexpr (sizeof(T) < 4) {
#pragma unroll
    for (int i = 0; i < Frag<T, V>::kWords; ++i) f.w[i] ^= z;
  }
}

// Fragments as new values after a reduction with result r (z = r & zero: 0, but not before r).
template <class T, int V, int VPT>
__device__ __forceinline__ void refresh(Frag<T, V> (&x)[VPT], float r, uint32_t zero) {
  const uint32_t z = __float_as_uint(r) & zero;
#pragma unroll
  for (int k = 0; k < VPT; ++k) make_opaque(x[k], z);
}

// 0, in a way the compiler can neither see nor compute before r is known: an offset that keeps
// loads from being hoisted above the reduction that produced r.
__device__ __forceinline__ int zero_after(float r, uint32_t zero) {
  return static_cast<int>(__float_as_uint(r) & zero);
}

}  // namespace tessera::tile
