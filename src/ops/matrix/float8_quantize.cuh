// What float8_quantize's kernels share (float8_quantize.cu: the row kernel and the two-pass tile
// kernels, and the host side; float8_quantize_blocks.cu: the one-pass kernel of the block
// granularities): the numerics of a scale and a product, the 128 x 64 tile a thread's registers
// hold, the maxima's shuffles, and the tile's quantized stores.
//
// The amax as bits: for |v| (the sign bit cleared) the order of the unsigned bits is the order
// of the magnitudes, with inf (0x7f800000) above every finite value and every NaN above inf, so
// an integer max (atomicMax on global words, max in registers) is the amax and also says whether
// the group held inf or NaN: bits >= 0x7f800000. Integer maxima are exact and associative, so
// every run gives the same scales.
//
// Numerics (tessera.float8.quantize's, bit for bit; torchao's amax_to_scale and cast, so that a
// tensorwise cast is torchao's bytes too): a group's multiplier m = 448 * (1 / max(amax, 1e-12))
// in float64, rounded to float32; q = x * m rounded to float32, then to nearest even e4m3 and
// saturated at +-448 by the conversion itself (a clamp by fminf would turn NaN into 448); the
// scale, the dequantization factor (x ~ q * scale), 1 / m in float32. One multiplication an
// element. A group holding inf or NaN takes m and scale NaN, its bytes NaN (torchao's multiplier
// would be 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/ops/matrix.hpp"
#include "tile/activation.cuh"
#include "tile/frag.cuh"

namespace tessera::float8 {

constexpr float kE4m3Max = 448.f;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kNanBits = 0x7fc00000u;  // torch's float('nan')
constexpr double kAmaxFloor = 1e-12;         // torchao's EPS
constexpr int kTileRows = 128, kTileCols = 64;  // the tile kernels' tile
constexpr int kTileThreads = 256;
constexpr int kBlock = 128;  // the block granularities' blocks: 1 x 128 and 128 x 128

struct QuantArgs {
  const void* x;           // the input; gated (float8_quantize_gated): the gate
  const void* up;          // gated: the up projection, of the gate's layout
  void* product;           // gated, pass 1: where the product goes ([rows, cols], contiguous)
  const void* dy;          // gated backward: the product's gradient, of the gate's layout
  void* product2;          // gated backward, pass 1: grad_up (product: grad_gate)
  uint32_t* amax2;         // gated backward: grad_up's maxima (amax: grad_gate's)
  int64_t xs;              // x's (and up's) row stride, elements
  uint8_t* q;              // [rows, cols]; null: the columns alone (scale null too)
  uint8_t* qt;             // [cols, rows]; null: no transposed copy
  float* scale;            // row: [rows]; tensor: [1]; block: [rows, ceil(cols / 128)];
                           // block2d: [rows / 128, cols / 128]
  float* scale_t;          // row: [cols]; tensor: [1]; block: [ceil(rows / 128), cols]; block2d:
                           // as scale; null with qt
  uint32_t* amax;          // tile kernels: rows' maxima then columns' (row), or one word (tensor)
  int64_t rows, cols;
  Float8Granularity granularity;
  __host__ __device__ bool tensor() const { return granularity == Float8Granularity::tensor; }
};

__device__ __forceinline__ uint32_t mag_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// amax as float32 bits to the multiplier m (see the top).
__device__ __forceinline__ float multiplier_of(uint32_t amax) {
  if (amax >= kInfBits) return __uint_as_float(kNanBits);
  const double r = __drcp_rn(fmax(double(__uint_as_float(amax)), kAmaxFloor));
  return __double2float_rn(__dmul_rn(r, double(kE4m3Max)));
}

// The scale of a group of multiplier m (a NaN m: torch's NaN, where the reciprocal would give the
// GPU's canonical one).
__device__ __forceinline__ float scale_of(float m) { return m != m ? __uint_as_float(kNanBits) : __frcp_rn(m); }

__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// x0..x3 * m as the e4m3 bytes of a word, x0's the low byte.
__device__ __forceinline__ uint32_t e4m3x4(float x0, float x1, float x2, float x3, float m) {
  return e4m3x2(__fmul_rn(x0, m), __fmul_rn(x1, m)) | e4m3x2(__fmul_rn(x2, m), __fmul_rn(x3, m)) << 16;
}

// ---- the tile and strip kernels ----------------------------------------------------------------
// A thread's 4 consecutive rows x 8 columns of x, fragment f (8 / VW of them) at column
// frag_col(f) = col + f * FStride: what the tile and strip kernels load, fold and quantize.
template <class T, int VW, int FStride>
struct Block4x8 {
  using Type = T;
  static constexpr int kVW = VW;
  static constexpr int kF = 8 / VW;  // fragments per row of a thread
  using Frags = tile::Frag<T, VW>[4][kF];
  int64_t r0, c0;  // the block's origin in x
  int row, col;    // the thread's first row and fragment 0's column, from the origin
  __device__ int frag_col(int f) const { return col + f * FStride; }
  // The column of the thread's element e (0..7 along its row), from the origin.
  __device__ int col_of(int e) const { return frag_col(e / VW) + e % VW; }
  // The fragments inside x; the others zeros (K % VW == 0: a fragment is wholly in or out). Every
  // load is made, those outside from the nearest row and column inside, and zeroed afterwards:
  // loads under conditions are placed in blocks of their own, between which the compiler moves
  // the uses of earlier ones, leaving one or two loads in flight instead of all of them.
  // kFull: the block lies wholly inside x (no clamps, nothing to mask).
  template <bool kFull = false>
  __device__ void load(const QuantArgs& a, Frags& v) const {
    issue<kFull>(a, a.x, v);
    if constexpr (!kFull) mask(a, v);
  }
  // load() in two halves, from `src` (x's layout): issue() leaves the loads in flight, mask()
  // zeroes the fragments outside x.
  template <bool kFull = false>
  __device__ void issue(const QuantArgs& a, const void* src, Frags& v) const {
    const T* x = static_cast<const T*>(src);
    if constexpr (kFull) {
      const T* p = x + (r0 + row) * a.xs + c0 + col;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int f = 0; f < kF; ++f) v[j][f] = tile::load_frag<T, VW>(p + j * a.xs + f * FStride);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int f = 0; f < kF; ++f) {
          const int64_t r = r0 + row + j, c = c0 + frag_col(f);
          v[j][f] = tile::load_frag<T, VW>(x + std::min(r, a.rows - 1) * a.xs + std::min(c, a.cols - VW));
        }
    }
  }
  __device__ void mask(const QuantArgs& a, Frags& v) const {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int f = 0; f < kF; ++f)
        if (r0 + row + j >= a.rows || c0 + frag_col(f) >= a.cols) v[j][f] = tile::Frag<T, VW>{};
  }
};

// A tile is 128 rows x 64 columns; thread t holds 4 consecutive rows x 8 columns of it, every load
// issued before any value is used: 64 bytes of bf16/fp16 (4 loads of 16 B) or 128 of fp32 (8) a
// thread, 16 or 32 KB a CTA, 64 KB and more an SM with 4 CTAs resident (an SM's share of HBM,
// ~32 B/ns at ~1 us of latency, wants 32-64 KB outstanding). Lane l of warp w takes column group
// cg = l % 4 and row group rg = l / 4 of the warp's 32 x 32 block, the block at column half w % 2
// and row quarter w / 2. A row's 8 elements are 8 / VW fragments, fragment f at block column
// f * 4 * VW + cg * VW: one load instruction reads 4 * VW adjacent elements of each of 8 rows, for
// 16-byte fragments 64 bytes a row, whole 32-byte sectors.
template <class T, int VW>
struct Tile : Block4x8<T, VW, 4 * VW> {
  __device__ Tile(int64_t r0_, int64_t c0_) {
    const int lane = int(threadIdx.x) % 32, w = int(threadIdx.x) / 32;
    this->r0 = r0_, this->c0 = c0_;
    this->row = w / 2 * 32 + lane / 4 * 4, this->col = w % 2 * 32 + lane % 4 * VW;
  }
  // Tile `tile` of x's 128 x 64 tiles, `col_tiles` to a row of them.
  __device__ static Tile nth(int64_t tile, int64_t col_tiles) {
    return Tile(tile / col_tiles * kTileRows, tile % col_tiles * kTileCols);
  }
};

// The strip pass's block: 4 rows from r0 x the strip's kStripCols columns from c0, lane l taking
// its 8 adjacent columns l * 8.. (a load instruction reads 32 * 8 adjacent elements of one row:
// 512 contiguous bytes of a 16-bit row, where a tile's reads 64 of each of 8 rows).
constexpr int kStripCols = 256;
template <class T, int VW>
struct Strip : Block4x8<T, VW, VW> {
  __device__ Strip(int64_t r0_, int64_t c0_) {
    this->r0 = r0_, this->c0 = c0_;
    this->row = 0, this->col = int(threadIdx.x) % 32 * 8;
  }
};

// Where a tile's values come from (the Src of the kernels that read x first): x itself (Plain),
// or a gated product act(gate) * up (Gated: x the gate, QuantArgs::up the up) computed as
// silu_mul and geglu compute theirs (tessera::elementwise::map_floats: float32, the fast forms
// for 16-bit T) and rounded to T, so that its quantization is float8_quantize's of their output.
struct Plain {
  static constexpr int kOutputs = 1;
  template <bool kFull = false, class L>
  __device__ static void load(const QuantArgs& a, const L& t, typename L::Frags& v) {
    t.template load<kFull>(a, v);
  }
};

// A block of values into `out` ([rows, cols], contiguous): the gated sources' products.
template <class L>
__device__ __forceinline__ void store_block(const QuantArgs& a, const L& t, const typename L::Frags& v, void* out) {
  auto* p = static_cast<typename L::Type*>(out);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int f = 0; f < L::kF; ++f) {
      const int64_t r = t.r0 + t.row + j, c = t.c0 + t.frag_col(f);
      if (r < a.rows && c < a.cols) tile::store_frag<typename L::Type, L::kVW>(p + r * a.cols + c, v[j][f]);
    }
}

template <template <bool> class Act>
struct Gated {
  static constexpr int kOutputs = 1;
  template <bool kFull = false, class L>
  __device__ static void load(const QuantArgs& a, const L& t, typename L::Frags& v) {
    using T = typename L::Type;
    typename L::Frags u;
    t.template issue<kFull>(a, a.x, v);
    t.template issue<kFull>(a, a.up, u);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int f = 0; f < L::kF; ++f) {
        float p[L::kVW];
#pragma unroll
        for (int e = 0; e < L::kVW; ++e) p[e] = Act<!std::is_same_v<T, float>>{}(v[j][f][e]) * u[j][f][e];
        v[j][f] = tile::pack<T, L::kVW>(p);
      }
    if constexpr (!kFull) t.mask(a, v);
  }
  // The block's product into a.product ([rows, cols], contiguous), where pass 2 reads it.
  template <class L>
  __device__ static void store(const QuantArgs& a, const L& t, const typename L::Frags& v) {
    store_block(a, t, v, a.product);
  }
};

// The gated product's backward (float8_quantize_gated_backward): grad_gate = dy * up * act'(gate)
// and grad_up = dy * act(gate) from dy (a.dy), the gate (a.x) and up (a.up), computed as the
// gated backward ops compute theirs (map_floats: float32, the fast forms for 16-bit T, ActGrad(dy
// * up, gate)) and rounded to T, so that they are those ops' bits; two outputs (kOutputs), stored
// to a.product and a.product2 on the way, each with its own maxima.
template <template <bool> class Act, template <bool> class ActGrad>
struct GatedGrads {
  static constexpr int kOutputs = 2;
  template <bool kFull = false, class L>
  __device__ static void load2(const QuantArgs& a, const L& t, typename L::Frags& dg, typename L::Frags& du) {
    using T = typename L::Type;
    constexpr bool kFast = !std::is_same_v<T, float>;
    typename L::Frags g, u;
    t.template issue<kFull>(a, a.dy, dg);
    t.template issue<kFull>(a, a.x, g);
    t.template issue<kFull>(a, a.up, u);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int f = 0; f < L::kF; ++f) {
        float pg[L::kVW], pu[L::kVW];
#pragma unroll
        for (int e = 0; e < L::kVW; ++e) {
          const float dy = dg[j][f][e], x = g[j][f][e], up = u[j][f][e];
          pg[e] = ActGrad<kFast>{}(dy * up, x);
          pu[e] = dy * Act<kFast>{}(x);
        }
        dg[j][f] = tile::pack<T, L::kVW>(pg);
        du[j][f] = tile::pack<T, L::kVW>(pu);
      }
    if constexpr (!kFull) {
      t.mask(a, dg);
      t.mask(a, du);
    }
  }
  template <class L>
  __device__ static void store2(const QuantArgs& a, const L& t, const typename L::Frags& dg,
                                const typename L::Frags& du) {
    store_block(a, t, dg, a.product);
    store_block(a, t, du, a.product2);
  }
};

// Element e's magnitude as T's own bits (sign cleared), whose unsigned order is the order of the
// magnitudes, inf above the finite ones, NaN above inf; and such bits as float32's (exact, and
// order-preserving), converted once per maximum rather than once per element.
template <class T, int VW>
__device__ __forceinline__ uint32_t mag_t(const tile::Frag<T, VW>& f, int e) {
  return tile::element_bits(f, e) & (sizeof(T) == 4 ? 0x7fffffffu : 0x7fffu);
}
template <class T>
__device__ __forceinline__ uint32_t mag_f32(uint32_t m) {
  if constexpr (std::is_same_v<T, float>) return m;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return m << 16;
  else return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
}

// Folds the thread's fragments into its 4 row maxima (over its 8 columns) and 8 column maxima
// (over its 4 rows), as T's magnitude bits. 16-bit elements go two a word: masked and maxed as
// packed halves (VIMNMX.U16x2, three inputs where they fit), a column pair a word.
template <class T, int VW>
__device__ __forceinline__ void fold_maxima(const typename Tile<T, VW>::Frags& v, uint32_t (&rm)[4],
                                            uint32_t (&cm)[8]) {
  if constexpr (sizeof(T) == 2 && VW == 8) {
    const auto m = [&](int j, int k) { return v[j][0].w[k] & 0x7fff7fffu; };
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t r = __vimax3_u16x2(m(j, 0), m(j, 1), __vmaxu2(m(j, 2), m(j, 3)));
      rm[j] = max(rm[j], max(r & 0xffffu, r >> 16));
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // elements 2k (low halves) and 2k + 1
      const uint32_t c = __vimax3_u16x2(m(0, k), m(1, k), __vmaxu2(m(2, k), m(3, k)));
      cm[2 * k] = max(cm[2 * k], c & 0xffffu), cm[2 * k + 1] = max(cm[2 * k + 1], c >> 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t b = mag_t(v[j][e / VW], e % VW);
        rm[j] = max(rm[j], b), cm[e] = max(cm[e], b);
      }
  }
}

// Max over the lanes that differ in lane bits Off, Off / 2, ... (log2 N of them), of N values a
// lane, scattered: the lane ends with the maximum of value sum_i (lane & Off_i ? N / 2^(i+1) : 0)
// only. Each step keeps the half its partner does not and takes the partner's, so the N values
// cost N - 1 shuffles, where reducing each in full would cost N log2 N.
template <int N, int Off>
__device__ __forceinline__ uint32_t max_scatter(uint32_t (&v)[N]) {
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int h = N / 2, off = Off; h >= 1; h /= 2, off /= 2) {
    const bool upper = lane & off;
#pragma unroll
    for (int k = 0; k < h; ++k) {
      const uint32_t give = upper ? v[k] : v[k + h], keep = upper ? v[k + h] : v[k];
      v[k] = max(keep, __shfl_xor_sync(0xffffffffu, give, off));
    }
  }
  return v[0];
}

// The tile's products by its rows' multipliers (`rows`, by tile row) into q where q is asked for
// (not by float8_quantize_transposed), and where q_t is asked for, by its columns' (`cols`, by
// tile column) into `staged` for store_staged; each 4 products a word. q goes by rows, a
// fragment's bytes stored at once (8 bytes for 16-bit inputs: 32 bytes a row from 4 lanes, whole
// sectors); q_t's tile is staged as [column][row / 4], a thread's 4 rows of one column packed
// into one word. Staged rows are kPitch = 32 + 8 / VW words apart: a store instruction's 32 lanes
// write column cg * VW + c of row word rg + c', bank (cg * VW * kPitch + rg + c'') % 32 =
// (8 cg + rg + c'') % 32 since VW * kPitch = 8 (mod 32): 32 distinct banks.
template <int VW>
constexpr int kPitch = 32 + 8 / VW;

// kFull: the tile lies wholly inside x (no bounds to check; addresses from one base).
template <class T, int VW, bool kFull = false>
__device__ __forceinline__ void quantize_tile(const QuantArgs& a, const Tile<T, VW>& t,
                                              const typename Tile<T, VW>::Frags& v, const float* rows,
                                              const float* cols, uint32_t* staged) {
  const auto x = [&](int j, int e) { return v[j][e / VW][e % VW]; };
  if (a.q) {
    uint8_t* q0 = a.q + (t.r0 + t.row) * a.cols + t.c0 + t.col;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = t.r0 + t.row + j;
      if (!kFull && r >= a.rows) break;
      const float m = rows[t.row + j];
      const uint32_t w[2] = {e4m3x4(x(j, 0), x(j, 1), x(j, 2), x(j, 3), m),  // elements 0..3, 4..7
                             e4m3x4(x(j, 4), x(j, 5), x(j, 6), x(j, 7), m)};
#pragma unroll
      for (int f = 0; f < Tile<T, VW>::kF; ++f) {  // fragment f: elements f * VW.., at column f * 4 * VW
        if (!kFull && t.c0 + t.col + f * 4 * VW >= a.cols) continue;
        uint8_t* p = q0 + j * a.cols + f * 4 * VW;
        if constexpr (VW == 8) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
        else if constexpr (VW == 4) *reinterpret_cast<uint32_t*>(p) = w[f];
        else *p = uint8_t(w[f / 4] >> 8 * (f % 4));
      }
    }
  }
  if (a.qt) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int c = t.col_of(e);
      staged[c * kPitch<VW> + t.row / 4] = e4m3x4(x(0, e), x(1, e), x(2, e), x(3, e), cols[c]);
    }
  }
}

// q_t's tile from `staged` (after a barrier): a warp per staged row, lane l its word l (128
// contiguous bytes of q_t, one store instruction, whole sectors; M % 16 == 0 keeps a word's 4 rows
// wholly in or out).
template <class T, int VW, bool kFull = false>
__device__ __forceinline__ void store_staged(const QuantArgs& a, const Tile<T, VW>& t, const uint32_t* staged) {
  const int i = int(threadIdx.x);
  const int64_t r = t.r0 + i % 32 * 4;
  uint8_t* p = a.qt + t.c0 * a.rows + r;
#pragma unroll
  for (int c = i / 32; c < kTileCols; c += kTileThreads / 32)
    if (kFull || (t.c0 + c < a.cols && r < a.rows))
      *reinterpret_cast<uint32_t*>(p + c * a.rows) = staged[c * kPitch<VW> + i % 32];
}

// For producers that take their output's maxima as they write it (the float8 norms): the checks
// float8_quantize makes of x [M, K] and the outputs (`op` and `input` name them in errors; q and
// scale null: the columns alone, as float8_quantize_transposed), and its second pass over x given
// the maxima pass 1 would have left (amax: M rows' words then K columns' for 'row', one word for
// 'tensor'; float32 magnitude bits). Row and tensor granularities only.
void check_outputs(const char* op, const char* input, const TensorView& x, const TensorView* q,
                   const TensorView* scale, const TensorView* q_t, const TensorView* scale_t, Float8Granularity g);
void quantize_given_maxima(const TensorView& x, const TensorView* q, const TensorView* scale, const TensorView* q_t,
                           const TensorView* scale_t, Float8Granularity g, uint32_t* amax, cudaStream_t stream);

// The block granularities' one-pass kernel (float8_quantize_blocks.cu), for inputs of type T in
// fragments of VW read as Src says, on a GPU of `sms` SMs.
template <class T, int VW, class Src>
void launch_blocks(const QuantArgs& a, int sms, cudaStream_t stream);

}  // namespace tessera::float8
