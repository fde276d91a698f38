// float8_quantize: a 2-d tensor to float8_e4m3fn with its scales, for scaled_mm
// (tessera/ops/matrix.hpp), and where asked the transposed copy quantized along the other
// dimension, from the same reads of x.
//
// The op is memory-bound: its floor is one read of x and one write of q (and of q_t). A scale
// needs its group's amax before any element of the group can be written, so:
//   - rows only (granularity row, no transposed copy): a CTA per row reads the row once from HBM
//     for the amax, then again for the quotients; the second read finds the row (a few KB) in L1
//     or L2, where the CTA has just put it.
//   - otherwise (the transposed copy, or one scale for the tensor): two kernels over 64 x 64
//     tiles. Pass 1 reads each tile, takes its rows' and columns' maxima (shared-memory atomics,
//     after a reduction in registers and shuffles) and merges them into global amax words by
//     atomicMax on the bits. Pass 2 reads the tile again, writes q row by row, and writes q_t
//     through shared memory, so that both stores are whole rows of the tile. Pass 2 walks the
//     tiles in the reverse order of pass 1, so that it starts on the tiles pass 1 read last,
//     still in L2; a tensor larger than L2 is read twice from HBM for the rest. One scale for the
//     whole tensor takes the same two passes, its maxima all merged into one word: a grid-wide
//     amax needs every CTA to have finished reading before any quotient is final, and a second
//     launch is the barrier that costs nothing to get right.
//
// The amax as bits: for |v| (the sign bit cleared) the order of the unsigned bits is the order
// of the magnitudes, with inf (0x7f800000) above every finite value and every NaN above inf, so
// an integer max (atomicMax on global words, max in registers) is the amax and also says whether
// the group held inf or NaN: bits >= 0x7f800000. Integer maxima are exact and associative, so
// every run gives the same scales.
//
// Numerics (tessera.float8.quantize's, bit for bit): scale = amax / 448 in float32, 1 for an
// all-zero group, NaN for a group holding inf or NaN; q = x / scale, a float32 division (not a
// multiplication by the reciprocal, which rounds differently), rounded to nearest even to e4m3
// and saturated at +-448 by the conversion itself (a clamp by fminf would turn NaN into 448).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/matrix.hpp"
#include "tile/frag.cuh"
#include "tile/reduce.cuh"

namespace tessera {
namespace {

constexpr const char* kOp = "float8_quantize";
constexpr float kE4m3Max = 448.f;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kNanBits = 0x7fc00000u;  // torch's float('nan')
constexpr int kTile = 64;                    // the tile kernels' rows and columns
constexpr int kTileThreads = 256;
constexpr int kUnroll = 4;                   // a row kernel's loads in flight per thread
constexpr int kPitch = kTile + 16;           // q_t's staging rows: whole 16-byte runs, banks spread

struct QuantArgs {
  const void* x;
  int64_t xs;              // x's row stride, elements
  uint8_t* q;              // [rows, cols]
  uint8_t* qt;             // [cols, rows]; null: no transposed copy
  float* scale;            // row: [rows]; tensor: [1]
  float* scale_t;          // row: [cols]; tensor: [1]; null with qt
  uint32_t* amax;          // tile kernels: rows' maxima then columns' (row), or one word (tensor)
  int64_t rows, cols;
  bool tensor;
};

__device__ __forceinline__ uint32_t mag_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ __forceinline__ float scale_of(uint32_t amax) {
  if (amax >= kInfBits) return __uint_as_float(kNanBits);
  return amax == 0 ? 1.f : __fdiv_rn(__uint_as_float(amax), kE4m3Max);
}

__device__ __forceinline__ uint8_t to_e4m3(float v, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

// VW quantized bytes (a fragment's) stored at once: 8, 4 or 1 byte, aligned as the fragment.
template <int VW>
__device__ __forceinline__ void store_bytes(uint8_t* p, const uint8_t (&b)[VW]) {
  uint32_t w[(VW + 3) / 4] = {};
#pragma unroll
  for (int i = 0; i < VW; ++i) w[i / 4] |= uint32_t(b[i]) << (8 * (i % 4));
  if constexpr (VW == 8) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  else if constexpr (VW == 4) *reinterpret_cast<uint32_t*>(p) = w[0];
  else *p = b[0];
}

// ---- rows only: a CTA per row -------------------------------------------------------------------
// Each block of kUnroll fragments is loaded before any is used, so that a thread has kUnroll
// loads in flight rather than one.
template <class T, int VW, class F>
__device__ __forceinline__ void walk_row(const T* x, int64_t cols, F&& f) {
  const int64_t step = int64_t(blockDim.x) * VW;
  for (int64_t c0 = int64_t(threadIdx.x) * VW; c0 < cols; c0 += kUnroll * step) {
    tile::Frag<T, VW> v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (c0 + k * step < cols) v[k] = tile::load_frag<T, VW>(x + c0 + k * step);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (c0 + k * step < cols) f(c0 + k * step, v[k]);
  }
}

template <class T, int VW>
__global__ void __launch_bounds__(512) rows_kernel(QuantArgs a) {
  __shared__ uint32_t scratch[32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(a.x) + r * a.xs;
    uint32_t m = 0;
    walk_row<T, VW>(x, a.cols, [&](int64_t, const tile::Frag<T, VW>& v) {
#pragma unroll
      for (int i = 0; i < VW; ++i) m = max(m, mag_bits(v[i]));
    });
    const float s = scale_of(tile::block_reduce(m, tile::Max{}, 0u, scratch));
    if (threadIdx.x == 0) a.scale[r] = s;
    uint8_t* q = a.q + r * a.cols;
    walk_row<T, VW>(x, a.cols, [&](int64_t c, const tile::Frag<T, VW>& v) {
      uint8_t b[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) b[i] = to_e4m3(v[i], s);
      store_bytes<VW>(q + c, b);
    });
  }
}

// ---- the tile kernels ---------------------------------------------------------------------------
// A tile's fragments: thread t holds fragments t, t + 256, ... of the tile's 64 rows of V = 64 / VW
// fragments each. 256 is a multiple of V, so all of a thread's fragments lie in the same columns,
// rows 256 / V apart, and the V threads of a row are adjacent lanes (V <= 32) or whole warps.
template <class T, int VW>
struct TileMap {
  static constexpr int kV = kTile / VW;                     // fragments per tile row
  static constexpr int kPer = kTile * kV / kTileThreads;    // fragments per thread
  static constexpr int kRowStep = kTileThreads / kV;        // rows between a thread's fragments
  int64_t r0, c0;                                           // the tile's first row and column
  int row0, col;                                            // the thread's first row, first column (in the tile)
  __device__ TileMap(int64_t tile, int64_t col_tiles) {
    r0 = tile / col_tiles * kTile, c0 = tile % col_tiles * kTile;
    row0 = int(threadIdx.x) / kV, col = int(threadIdx.x) % kV * VW;
  }
  // Loads the thread's fragments inside x (the others stay unused: `in` says which).
  __device__ void load(const QuantArgs& a, tile::Frag<T, VW> (&v)[kPer], bool (&in)[kPer]) const {
    const T* x = static_cast<const T*>(a.x);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t r = r0 + row0 + j * kRowStep, c = c0 + col;
      in[j] = r < a.rows && c < a.cols;
      if (in[j]) v[j] = tile::load_frag<T, VW>(x + r * a.xs + c);
    }
  }
};

template <class T, int VW>
__global__ void __launch_bounds__(kTileThreads) tile_amax_kernel(QuantArgs a, int64_t col_tiles) {
  using M = TileMap<T, VW>;
  __shared__ uint32_t rmax[kTile], cmax[kTile], scratch[32];
  const M t(blockIdx.x, col_tiles);
  if (threadIdx.x < kTile) rmax[threadIdx.x] = cmax[threadIdx.x] = 0;
  tile::Frag<T, VW> v[M::kPer];
  bool in[M::kPer];
  t.load(a, v, in);
  uint32_t cm[VW] = {}, all = 0;
  __syncthreads();  // rmax and cmax zeroed
  constexpr int kGroup = M::kV < 32 ? M::kV : 32;  // lanes of one tile row within a warp
#pragma unroll
  for (int j = 0; j < M::kPer; ++j) {
    uint32_t rm = 0;
#pragma unroll
    for (int i = 0; i < VW; ++i) {
      const uint32_t b = in[j] ? mag_bits(v[j][i]) : 0u;
      rm = max(rm, b), cm[i] = max(cm[i], b);
    }
    all = max(all, rm);
    if (a.tensor) continue;
    rm = tile::warp_reduce<kGroup>(rm, tile::Max{});
    if (threadIdx.x % kGroup == 0 && rm) atomicMax(&rmax[t.row0 + j * M::kRowStep], rm);
  }
  if (a.tensor) {  // one word for the whole tensor: a CTA's maximum, one atomic
    all = tile::block_reduce(all, tile::Max{}, 0u, scratch);
    if (threadIdx.x == 0 && all) atomicMax(a.amax, all);
    return;
  }
#pragma unroll
  for (int i = 0; i < VW; ++i) {  // lanes kV apart hold the same columns
    for (int off = M::kV; off < 32; off <<= 1) cm[i] = max(cm[i], __shfl_xor_sync(0xffffffffu, cm[i], off));
    if (threadIdx.x % 32 < kGroup && cm[i]) atomicMax(&cmax[t.col + i], cm[i]);
  }
  __syncthreads();
  const int i = int(threadIdx.x);
  if (i < kTile && t.r0 + i < a.rows && rmax[i]) atomicMax(&a.amax[t.r0 + i], rmax[i]);
  if (i < kTile && t.c0 + i < a.cols && cmax[i]) atomicMax(&a.amax[a.rows + t.c0 + i], cmax[i]);
}

template <class T, int VW>
__global__ void __launch_bounds__(kTileThreads) tile_quant_kernel(QuantArgs a, int64_t col_tiles) {
  using M = TileMap<T, VW>;
  __shared__ __align__(16) uint8_t staged[kTile][kPitch];  // q_t's tile: [column][row]
  const M t(int64_t(gridDim.x) - 1 - blockIdx.x, col_tiles);  // pass 1's order reversed
  tile::Frag<T, VW> v[M::kPer];
  bool in[M::kPer];
  t.load(a, v, in);
  const uint32_t* cols_amax = a.tensor ? a.amax : a.amax + a.rows;
  float sc[VW];  // the thread's columns' scales (q_t)
#pragma unroll
  for (int i = 0; i < VW; ++i)
    sc[i] = a.qt && t.c0 + t.col + i < a.cols ? scale_of(cols_amax[a.tensor ? 0 : t.c0 + t.col + i]) : 1.f;
#pragma unroll
  for (int j = 0; j < M::kPer; ++j) {
    if (!in[j]) continue;
    const int rl = t.row0 + j * M::kRowStep;
    const int64_t r = t.r0 + rl;
    const float s = scale_of(a.amax[a.tensor ? 0 : r]);
    uint8_t b[VW];
#pragma unroll
    for (int i = 0; i < VW; ++i) b[i] = to_e4m3(v[j][i], s);
    store_bytes<VW>(a.q + r * a.cols + t.c0 + t.col, b);
    if (a.qt) {
#pragma unroll
      for (int i = 0; i < VW; ++i) staged[t.col + i][rl] = to_e4m3(v[j][i], sc[i]);
    }
  }
  const int i = int(threadIdx.x);
  // The scales, each written once: rows by the first column of tiles, columns by the first row.
  if (a.tensor) {
    if (blockIdx.x == 0 && i == 0) {
      a.scale[0] = scale_of(a.amax[0]);
      if (a.scale_t) a.scale_t[0] = scale_of(a.amax[0]);
    }
  } else {
    if (t.c0 == 0 && i < kTile && t.r0 + i < a.rows) a.scale[t.r0 + i] = scale_of(a.amax[t.r0 + i]);
    if (a.scale_t && t.r0 == 0 && i < kTile && t.c0 + i < a.cols) a.scale_t[t.c0 + i] = scale_of(cols_amax[t.c0 + i]);
  }
  if (!a.qt) return;
  __syncthreads();
  // q_t's rows (x's columns) in 16-byte runs: M and K multiples of 16, so runs are whole.
  const int cl = i / (kTile / 16), seg = i % (kTile / 16) * 16;
  if (t.c0 + cl < a.cols && t.r0 + seg < a.rows)
    *reinterpret_cast<uint4*>(a.qt + (t.c0 + cl) * a.rows + t.r0 + seg) =
        *reinterpret_cast<const uint4*>(&staged[cl][seg]);
}

// ---- host ---------------------------------------------------------------------------------------
template <class T, int VW>
void launch(const QuantArgs& a, bool rows_only, int device, cudaStream_t stream) {
  if (rows_only) {
    // Threads enough for about kUnroll fragments each on a row (32 to 512); rows beyond a full
    // wave of CTAs taken in turn.
    const int64_t frags = (a.cols + VW - 1) / VW;
    const int threads = int(std::clamp<int64_t>((frags / kUnroll + 31) / 32 * 32, 32, 512));
    const int sms = runtime::device_props(device).multiProcessorCount;
    const int64_t grid = std::min<int64_t>(a.rows, int64_t(sms) * (2048 / threads));
    rows_kernel<T, VW><<<unsigned(grid), threads, 0, stream>>>(a);
    TESSERA_LAUNCH_CHECK();
    return;
  }
  const int64_t col_tiles = (a.cols + kTile - 1) / kTile, tiles = col_tiles * ((a.rows + kTile - 1) / kTile);
  tile_amax_kernel<T, VW><<<unsigned(tiles), kTileThreads, 0, stream>>>(a, col_tiles);
  TESSERA_LAUNCH_CHECK();
  tile_quant_kernel<T, VW><<<unsigned(tiles), kTileThreads, 0, stream>>>(a, col_tiles);
  TESSERA_LAUNCH_CHECK();
}

std::string dims_of(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

// An output: on input's device, of `dtype`, contiguous, of `shape` (one_element: any shape of
// one element).
void check_output(const char* arg, const TensorView& t, const TensorView& input, DType dtype,
                  std::initializer_list<int64_t> shape, bool one_element = false) {
  detail::check_cuda_tensor(kOp, arg, t);
  detail::check_dtype_in(kOp, arg, t, {dtype});
  detail::check_same_device(kOp, arg, t, "input", input);
  bool ok = t.is_contiguous() && (dtype != DType::float8_e4m3fn || reinterpret_cast<uintptr_t>(t.data) % 16 == 0);
  if (one_element) {
    ok = ok && t.numel() == 1;
  } else {
    ok = ok && t.ndim == int(shape.size());
    int d = 0;
    for (int64_t v : shape) ok = ok && t.shape[d++] == v;
  }
  if (!ok)
    detail::throw_arg(ErrorKind::value, kOp, arg,
                      std::string(one_element ? "one element, contiguous" : "a contiguous " + dims_of(shape)) +
                          (dtype == DType::float8_e4m3fn ? ", 16-byte aligned" : ""),
                      detail::dims(t) + (t.is_contiguous() ? "" : " (not contiguous)"));
  detail::check_no_overlap(kOp, arg, t, "input", input, false);
}

void check(const TensorView& x, const TensorView& q, const TensorView& scale, const TensorView* q_t,
           const TensorView* scale_t, Float8Granularity g) {
  detail::check_cuda_tensor(kOp, "input", x);
  detail::check_dtype_in(kOp, "input", x, {DType::float32, DType::float16, DType::bfloat16});
  if (x.ndim != 2 || (x.strides[1] != 1 && x.shape[1] > 1))
    detail::throw_arg(ErrorKind::value, kOp, "input", "a 2-d tensor [M, K] with K contiguous",
                      detail::dims(x) + (x.ndim == 2 ? ", K stride " + std::to_string(x.strides[1]) : ""));
  const int64_t m = x.shape[0], k = x.shape[1];
  if (k < 1 || k > INT32_MAX || m > INT32_MAX || (g == Float8Granularity::tensor && m < 1))
    detail::throw_arg(ErrorKind::value, kOp, "input",
                      g == Float8Granularity::tensor ? "1 <= M, K < 2^31 (an amax needs an element)"
                                                     : "1 <= K < 2^31 and M < 2^31 (an amax needs an element)",
                      detail::dims(x));
  if ((q_t == nullptr) != (scale_t == nullptr))
    detail::throw_arg(ErrorKind::value, kOp, q_t ? "scale_t" : "q_t", "given with the other (both or neither)",
                      "None");
  if (q_t && (m % 16 || k % 16))
    detail::throw_arg(ErrorKind::value, kOp, "input",
                      "M and K multiples of 16 with the transposed copy (q_t feeds a float8 GEMM whose depth is M, "
                      "q one whose depth is K: the tensor cores step it by 16)",
                      detail::dims(x));
  const bool tensor = g == Float8Granularity::tensor;
  check_output("q", q, x, DType::float8_e4m3fn, {m, k});
  check_output("scale", scale, x, DType::float32, {m, 1}, tensor);
  if (q_t) {
    check_output("q_t", *q_t, x, DType::float8_e4m3fn, {k, m});
    check_output("scale_t", *scale_t, x, DType::float32, {1, k}, tensor);
    detail::check_no_overlap(kOp, "q_t", *q_t, "q", q, false);
  }
  detail::check_no_overlap(kOp, "scale", scale, "q", q, false);
}

}  // namespace

void parse(const char* op, std::string_view name, Float8Granularity& out) {
  if (name == "row") out = Float8Granularity::row;
  else if (name == "tensor") out = Float8Granularity::tensor;
  else detail::throw_arg(ErrorKind::value, op, "granularity", "'row' or 'tensor'", "'" + std::string(name) + "'");
}

void float8_quantize(const TensorView& input, const TensorView& q, const TensorView& scale, const TensorView* q_t,
                     const TensorView* scale_t, Float8Granularity granularity, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::float8_quantize");
  check(input, q, scale, q_t, scale_t, granularity);
  if (input.shape[0] == 0) return;
  runtime::DeviceGuard guard(input.device.index);
  QuantArgs a{};
  a.x = input.data, a.xs = input.strides[0];
  a.q = static_cast<uint8_t*>(q.data), a.qt = q_t ? static_cast<uint8_t*>(q_t->data) : nullptr;
  a.scale = static_cast<float*>(scale.data), a.scale_t = scale_t ? static_cast<float*>(scale_t->data) : nullptr;
  a.rows = input.shape[0], a.cols = input.shape[1];
  a.tensor = granularity == Float8Granularity::tensor;
  const bool rows_only = !a.tensor && !q_t;
  runtime::Scratch amax;
  if (!rows_only) {
    const size_t words = a.tensor ? 1 : size_t(a.rows + a.cols);
    amax = runtime::Scratch(words * sizeof(uint32_t), stream);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, words * sizeof(uint32_t), stream));
    a.amax = amax.as<uint32_t>();
  }
  // 16-byte fragments where every row starts on a 16-byte boundary and K fills them; else one
  // element at a time.
  const auto run = [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = int(16 / sizeof(T));
    const bool vec = reinterpret_cast<uintptr_t>(input.data) % 16 == 0 && a.cols % kVec == 0 &&
                     (a.rows <= 1 || a.xs % kVec == 0);
    if (vec) launch<T, kVec>(a, rows_only, input.device.index, stream);
    else launch<T, 1>(a, rows_only, input.device.index, stream);
  };
  switch (input.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
}

namespace {
// Outputs allocated by hand (float8 and transposed shapes, which no generic rule spells): the
// torch kernels are python/src/torch/matrix.cpp's. float8_quantize.columns adds the transposed
// copy (q_t [K, M], scale_t [1, K] for row, 0-d for tensor).
const OpRegistrar kFloat8Quantize =
    describe("float8_quantize", "matrix",
             "x [M, K] to float8_e4m3fn with float32 scales amax / 448 (one per row or per tensor), and "
             "optionally x's columns quantized along M, transposed ([K, M]), from the same reads")
        .schema("float8_quantize(Tensor input, *, str granularity='row') -> (Tensor, Tensor)")
        .schema("float8_quantize.columns(Tensor input, *, str granularity='row') -> (Tensor, Tensor, Tensor, Tensor)");
}  // namespace
}  // namespace tessera
