// float8_quantize: a 2-d tensor to float8_e4m3fn with its scales, for scaled_mm
// (tessera/ops/matrix.hpp), and where asked the transposed copy quantized along the other
// dimension, from the same reads of x.
//
// The op is memory-bound: its floor is one read of x and one write of q (and of q_t). A scale
// needs its group's amax before any element of the group can be written, so:
//   - rows only (granularity row, no transposed copy): a CTA per row reads the row once from HBM
//     for the amax, then again for the products; the second read finds the row (a few KB) in L1
//     or L2, where the CTA has just put it.
//   - otherwise (the transposed copy, or one scale for the tensor): two kernels. Pass 1 reads x by
//     strips of 256 columns, a warp a row's 512 contiguous bytes at a time, takes the rows' and
//     columns' maxima (in registers and shuffles; the columns' over all of a CTA's rows, then
//     shared memory) and merges them into global amax words by atomicMax on the bits, one a row
//     per strip and one a column per CTA. Pass 2 reads x again by 128 x 64 tiles, each thread 4
//     rows x 8 columns of one, writes q row by row, and writes q_t through shared memory (a
//     thread's 4 rows of a column packed in one word), so that a warp stores 128 contiguous bytes
//     of it. Pass 2 walks the tiles from the last, so that it starts on rows pass 1 read late,
//     still in L2; a tensor larger than L2 is read twice from HBM for the rest. One scale for the
//     whole tensor takes the same two passes, its maxima all merged into one word: a grid-wide
//     amax needs every CTA to have finished reading before any product is final, and a second
//     launch is the barrier that costs nothing to get right.
//   - the block granularities (1 x 128 blocks of rows, 128 x 128 blocks): a group is inside one
//     128 x 128 tile, so one pass does it (float8_quantize_blocks.cu): a CTA reads its tile once,
//     takes the blocks' maxima and writes the products from the registers.
//
// float8_quantize_gated quantizes a gated product act(gate) * up without writing it for a second
// read where it can: per row with the transposed copy and per tensor, pass 1 computes the product
// (a Src of the strip kernel), takes its maxima and leaves it in scratch for pass 2, one read of
// the product and one launch fewer than the gated op then float8_quantize; the block kernel
// computes it in its one pass from both inputs in registers (the unstaged kernel: two inputs
// would double the staged ring), and rows alone take the two passes where float8_quantize takes
// one: both slower than that composition, which tessera.float8 uses there instead.
//
// float8_quantize.cuh has the numerics, the amax's bits and the tiles' layouts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/matrix/float8_quantize.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tile/reduce.cuh"

namespace tessera {
namespace {
using namespace float8;

constexpr const char* kOp = "float8_quantize";
constexpr int kUnroll = 4;  // a row kernel's loads in flight per thread

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
    uint32_t m_bits = 0;
    walk_row<T, VW>(x, a.cols, [&](int64_t, const tile::Frag<T, VW>& v) {
#pragma unroll
      for (int i = 0; i < VW; ++i) m_bits = max(m_bits, mag_bits(v[i]));
    });
    const float m = multiplier_of(tile::block_reduce(m_bits, tile::Max{}, 0u, scratch));
    if (threadIdx.x == 0) a.scale[r] = scale_of(m);
    uint8_t* q = a.q + r * a.cols;
    walk_row<T, VW>(x, a.cols, [&](int64_t c, const tile::Frag<T, VW>& v) {
      uint8_t b[VW];
#pragma unroll
      for (int i = 0; i < VW; i += 2) {  // two products a conversion
        const uint32_t w = e4m3x2(__fmul_rn(v[i], m), i + 1 < VW ? __fmul_rn(v[i + 1], m) : 0.f);
        b[i] = uint8_t(w);
        if (i + 1 < VW) b[i + 1] = uint8_t(w >> 8);
      }
      store_bytes<VW>(q + c, b);
    });
  }
}

// ---- the tile kernels: Tile (float8_quantize.cuh) --------------------------------------------

// Pass 1 by strips of kStripCols columns: CTA (x, y) takes strip x over its share of the rows
// (rows_per_cta, a multiple of 32), warp w rows 4w.. of each 32 in turn, lane l its 8 columns l * 8..
// of each, so that a load instruction reads one row's 512 contiguous bytes (16-bit x) where a
// tile's reads 64 bytes of each of 8 rows: the gated source's two loads and the product's store
// a step run as whole runs of a row, as silu_mul's own streams do. A step's 4 rows: their
// maxima over the warp's 256 columns (a scattered shuffle reduction, then 3 more shuffles), one
// atomicMax a row and a strip; the columns' maxima stay in registers over all the CTA's rows, then
// merge over the 8 warps in shared memory: one atomicMax a column a CTA. A gated Src's product
// goes to a.product on the way, for pass 2.
template <class T, int VW, class Src>
__global__ void __launch_bounds__(kTileThreads) strip_amax_kernel(QuantArgs a, int64_t rows_per_cta) {
  static_assert(kStripCols == kTileThreads, "a thread a column of the strip at the end");
  using S = Strip<T, VW>;
  constexpr int kWarps = kTileThreads / 32, kOut = Src::kOutputs;
  __shared__ uint32_t cmax[kWarps][kStripCols], scratch[32];
  const int i = int(threadIdx.x), lane = i % 32, w = i / 32;
  const int64_t c0 = int64_t(blockIdx.x) * kStripCols, r_begin = int64_t(blockIdx.y) * rows_per_cta;
  const int64_t r_end = std::min(a.rows, r_begin + rows_per_cta);
  const bool full_cols = c0 + kStripCols <= a.cols;
  const auto amax = [&](int o) { return o ? a.amax2 : a.amax; };  // output o's maxima
  // Each output's: the thread's columns' maxima over its rows (T's magnitude bits); the tensor's.
  uint32_t cm[kOut][8] = {}, all[kOut] = {};
  for (int64_t r0 = r_begin + 4 * w; r0 < r_end; r0 += 4 * kWarps) {
    const S s(r0, c0);
    typename S::Frags v[kOut];
    const bool full = full_cols && r0 + 4 <= a.rows;  // no clamps (see tile_quant_kernel)
    if constexpr (kOut == 2) {
      full ? Src::template load2<true>(a, s, v[0], v[1]) : Src::template load2<false>(a, s, v[0], v[1]);
      Src::store2(a, s, v[0], v[1]);
    } else {
      full ? Src::template load<true>(a, s, v[0]) : Src::template load<false>(a, s, v[0]);
      if constexpr (!std::is_same_v<Src, Plain>) Src::store(a, s, v[0]);
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      uint32_t rm[4] = {};
      fold_maxima<T, VW>(v[o], rm, cm[o]);
      if (a.tensor()) {
        all[o] = max(all[o], max(max(rm[0], rm[1]), max(rm[2], rm[3])));
        continue;
      }
      uint32_t m = max_scatter<4, 16>(rm);  // row 2 (lane & 16) + (lane & 8), over 4 of the lanes
#pragma unroll
      for (int off = 4; off >= 1; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
      const int64_t r = r0 + (lane >> 4) * 2 + (lane >> 3 & 1);
      if (lane % 8 == 0 && m && a.q && r < a.rows) atomicMax(&amax(o)[r], mag_f32<T>(m));
    }
  }
#pragma unroll
  for (int o = 0; o < kOut; ++o) {
    if (o) __syncthreads();  // the previous output's reads of the shared buffers are done
    if (a.tensor()) {  // one word for the whole tensor: the CTA's maximum, one atomic
      const uint32_t m = tile::block_reduce(mag_f32<T>(all[o]), tile::Max{}, 0u, scratch);
      if (i == 0 && m) atomicMax(amax(o), m);
      continue;
    }
    const S s(0, c0);
#pragma unroll
    for (int e = 0; e < 8; ++e) cmax[w][s.col_of(e)] = mag_f32<T>(cm[o][e]);
    __syncthreads();
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) m = max(m, cmax[k][i]);
    if (m && c0 + i < a.cols) atomicMax(&amax(o)[a.rows + c0 + i], m);
  }
}

// Pass 2: first a thread for each of the tile's rows and columns takes its multiplier into shared
// memory (writing its scale out once: rows from the first column of tiles, columns from the first
// row), while the tile's loads are in flight; then quantize_tile and store_staged.
// A tile wholly inside x (every one but the last row and column of tiles, where they are partial)
// takes the kFull forms, with no bounds to check: per fragment, the clamps, checks and 64-bit
// index products would cost more instructions than the quantization itself, enough to make the
// kernel issue-bound rather than memory-bound.
template <class T, int VW, bool kFull>
__device__ __forceinline__ void quantize_one_tile(const QuantArgs& a, const Tile<T, VW>& t, uint32_t* staged,
                                                  float* mult) {
  typename Tile<T, VW>::Frags v;
  t.template load<kFull>(a, v);
  const int i = int(threadIdx.x);
  const bool tensor = a.tensor();
  if (i < kTileRows + kTileCols) {
    const bool row = i < kTileRows;
    const int64_t g = row ? t.r0 + i : t.c0 + (i - kTileRows);  // x's row or column
    const bool in = g < (row ? a.rows : a.cols);
    const float m = multiplier_of(in ? a.amax[tensor ? 0 : row ? g : a.rows + g] : 0u);
    mult[i] = m;
    float* out = row ? a.scale : a.scale_t;  // no rows' scales where only the columns are asked for
    if (out && (tensor ? blockIdx.x == 0 && i == 0 : in && (row ? t.c0 == 0 : t.r0 == 0)))
      out[tensor ? 0 : g] = scale_of(m);
    if (tensor && blockIdx.x == 0 && i == 0 && a.scale_t) a.scale_t[0] = scale_of(m);
  }
  __syncthreads();
  quantize_tile<T, VW, kFull>(a, t, v, mult, mult + kTileRows, staged);
  if (!a.qt) return;
  __syncthreads();
  store_staged<T, VW, kFull>(a, t, staged);
}

template <class T, int VW>
__global__ void __launch_bounds__(kTileThreads) tile_quant_kernel(QuantArgs a, int64_t col_tiles) {
  using L = Tile<T, VW>;
  __shared__ uint32_t staged[kTileCols * kPitch<VW>];  // q_t's tile, [column][row / 4]
  __shared__ float mult[kTileRows + kTileCols];        // the tile's rows', then its columns'
  const L t = L::nth(int64_t(gridDim.x) - 1 - blockIdx.x, col_tiles);  // from the last tile
  if (t.r0 + kTileRows <= a.rows && t.c0 + kTileCols <= a.cols) quantize_one_tile<T, VW, true>(a, t, staged, mult);
  else quantize_one_tile<T, VW, false>(a, t, staged, mult);
}

// ---- host ---------------------------------------------------------------------------------------
template <class T, int VW, class Src>
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
  // Rows shared among as many CTAs as fill the GPU with the strips, in multiples of 32 (a step of
  // each warp).
  const auto kernel = strip_amax_kernel<T, VW, Src>;
  const int64_t strips = (a.cols + kStripCols - 1) / kStripCols, steps = (a.rows + 31) / 32;
  const int64_t ctas = runtime::resident_ctas(reinterpret_cast<const void*>(kernel), kTileThreads);
  const int64_t splits = std::clamp<int64_t>(ctas / strips, 1, steps);
  const int64_t rows_per_cta = (steps + splits - 1) / splits * 32;
  const dim3 grid(unsigned(strips), unsigned((a.rows + rows_per_cta - 1) / rows_per_cta));
  kernel<<<grid, kTileThreads, 0, stream>>>(a, rows_per_cta);
  TESSERA_LAUNCH_CHECK();
}

// Pass 2 over x (a gated call's product), after pass 1.
template <class T, int VW>
void launch_quant(const QuantArgs& a, cudaStream_t stream) {
  const int64_t col_tiles = (a.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = col_tiles * ((a.rows + kTileRows - 1) / kTileRows);
  tile_quant_kernel<T, VW><<<unsigned(tiles), kTileThreads, 0, stream>>>(a, col_tiles);
  TESSERA_LAUNCH_CHECK();
}

std::string dims_of(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

// The arguments every pass takes: x and its outputs (null where not asked for).
QuantArgs args_for(const TensorView& x, const TensorView* q, const TensorView* scale, const TensorView* q_t,
                   const TensorView* scale_t, Float8Granularity g) {
  QuantArgs a{};
  a.x = x.data, a.xs = x.strides[0];
  a.q = q ? static_cast<uint8_t*>(q->data) : nullptr, a.qt = q_t ? static_cast<uint8_t*>(q_t->data) : nullptr;
  a.scale = scale ? static_cast<float*>(scale->data) : nullptr;
  a.scale_t = scale_t ? static_cast<float*>(scale_t->data) : nullptr;
  a.rows = x.shape[0], a.cols = x.shape[1];
  a.granularity = g;
  return a;
}

// The op's name and its input's: float8_quantize's input, or float8_quantize_gated's gate (and up).
struct Names {
  const char* op;
  const char* input;
};

// An output: on input's device, of `dtype`, contiguous, of `shape` (one_element: any shape of
// one element).
void check_output(const Names& n, const char* arg, const TensorView& t, const TensorView& input, DType dtype,
                  const std::vector<int64_t>& shape, bool one_element = false) {
  const char* kOp = n.op;
  detail::check_cuda_tensor(kOp, arg, t);
  detail::check_dtype_in(kOp, arg, t, {dtype});
  detail::check_same_device(kOp, arg, t, n.input, input);
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
  detail::check_no_overlap(kOp, arg, t, n.input, input, false);
}

// q and scale absent: the columns alone (float8_quantize_transposed), q_t and scale_t then present.
void check(const Names& n, const TensorView& x, const TensorView* q, const TensorView* scale, const TensorView* q_t,
           const TensorView* scale_t, Float8Granularity g) {
  const char* kOp = n.op;
  detail::check_cuda_tensor(kOp, n.input, x);
  detail::check_dtype_in(kOp, n.input, x, {DType::float32, DType::float16, DType::bfloat16});
  if (x.ndim != 2 || (x.strides[1] != 1 && x.shape[1] > 1))
    detail::throw_arg(ErrorKind::value, kOp, n.input, "a 2-d tensor [M, K] with K contiguous",
                      detail::dims(x) + (x.ndim == 2 ? ", K stride " + std::to_string(x.strides[1]) : ""));
  const int64_t m = x.shape[0], k = x.shape[1];
  if (k < 1 || k > INT32_MAX || m > INT32_MAX || (g == Float8Granularity::tensor && m < 1))
    detail::throw_arg(ErrorKind::value, kOp, n.input,
                      g == Float8Granularity::tensor ? "1 <= M, K < 2^31 (an amax needs an element)"
                                                     : "1 <= K < 2^31 and M < 2^31 (an amax needs an element)",
                      detail::dims(x));
  if (g == Float8Granularity::block2d && (m % kBlock || k % kBlock))
    detail::throw_arg(ErrorKind::value, kOp, n.input,
                      "M and K multiples of 128 with granularity 'block2d' (whole 128 x 128 blocks)", detail::dims(x));
  if ((q_t == nullptr) != (scale_t == nullptr))
    detail::throw_arg(ErrorKind::value, kOp, q_t ? "scale_t" : "q_t", "given with the other (both or neither)",
                      "None");
  if (q_t && (m % 16 || k % 16))
    detail::throw_arg(ErrorKind::value, kOp, n.input,
                      "M and K multiples of 16 with the transposed copy (q_t feeds a float8 GEMM whose depth is M, "
                      "q one whose depth is K: the tensor cores step it by 16)",
                      detail::dims(x));
  const Float8ScaleShapes s = float8_scale_shapes(m, k, g);
  const bool tensor = g == Float8Granularity::tensor;
  if (q) {
    check_output(n, "q", *q, x, DType::float8_e4m3fn, {m, k});
    check_output(n, "scale", *scale, x, DType::float32, s.scale, tensor);
    detail::check_no_overlap(kOp, "scale", *scale, "q", *q, false);
  }
  if (q_t) {
    check_output(n, "q_t", *q_t, x, DType::float8_e4m3fn, {k, m});
    check_output(n, "scale_t", *scale_t, x, DType::float32, s.scale_t, tensor);
    detail::check_no_overlap(kOp, "scale_t", *scale_t, "q_t", *q_t, false);
  }
  if (q && q_t) {
    detail::check_no_overlap(kOp, "q_t", *q_t, "q", *q, false);
    detail::check_no_overlap(kOp, "scale_t", *scale_t, "scale", *scale, false);
    detail::check_no_overlap(kOp, "q_t", *q_t, "scale", *scale, false);
    detail::check_no_overlap(kOp, "scale_t", *scale_t, "q", *q, false);
  }
}

}  // namespace

Float8ScaleShapes float8_scale_shapes(int64_t m, int64_t k, Float8Granularity g) {
  const int64_t mb = (m + kBlock - 1) / kBlock, kb = (k + kBlock - 1) / kBlock;
  switch (g) {
    case Float8Granularity::tensor: return {{}, {}};
    case Float8Granularity::row: return {{m, 1}, {1, k}};
    case Float8Granularity::block: return {{m, kb}, {mb, k}};
    default: return {{mb, kb}, {mb, kb}};
  }
}

void parse(const char* op, std::string_view name, Float8Granularity& out) {
  if (name == "row") out = Float8Granularity::row;
  else if (name == "tensor") out = Float8Granularity::tensor;
  else if (name == "block") out = Float8Granularity::block;
  else if (name == "block2d") out = Float8Granularity::block2d;
  else
    detail::throw_arg(ErrorKind::value, op, "granularity", "'row', 'tensor', 'block' or 'block2d'",
                      "'" + std::string(name) + "'");
}

namespace {
// A gated call's second input and activation (float8_quantize_gated).
struct GatedInput {
  const TensorView& up;
  Activation activation;
};

// Rows (q, scale), columns (q_t, scale_t) or both, of x or (gated) of act(x) * up: the kernels
// skip the rows' products and stores where q is null.
void quantize(const TensorView& input, const GatedInput* gated, const TensorView* q, const TensorView* scale,
              const TensorView* q_t, const TensorView* scale_t, Float8Granularity granularity, cudaStream_t stream) {
  const Names n = gated ? Names{"float8_quantize_gated", "gate"} : Names{kOp, "input"};
  runtime::NvtxRange range(gated ? "tessera::float8_quantize_gated" : "tessera::float8_quantize");
  check(n, input, q, scale, q_t, scale_t, granularity);
  if (gated) {
    const TensorView& up = gated->up;
    detail::check_like(n.op, "up", up, "gate", input);
    if ((input.shape[0] > 1 && up.strides[0] != input.strides[0]) || (input.shape[1] > 1 && up.strides[1] != 1))
      detail::throw_arg(ErrorKind::value, n.op, "up", "gate's strides (" + std::to_string(input.strides[0]) + ", 1)",
                        "(" + std::to_string(up.strides[0]) + ", " + std::to_string(up.strides[1]) + ")");
    for (const auto& [arg, t] : {std::pair{"q", q}, {"scale", scale}, {"q_t", q_t}, {"scale_t", scale_t}})
      if (t) detail::check_no_overlap(n.op, arg, *t, "up", gated->up, false);
    if (gated->activation != Activation::silu && gated->activation != Activation::gelu_tanh)
      detail::throw_arg(ErrorKind::value, n.op, "activation", "'silu' or 'gelu_tanh' (the gate's activation)",
                        std::string("'") + activation_name(gated->activation) + "'");
  }
  if (input.shape[0] == 0) return;
  runtime::DeviceGuard guard(input.device.index);
  QuantArgs a = args_for(input, q, scale, q_t, scale_t, granularity);
  const bool blocks = granularity == Float8Granularity::block || granularity == Float8Granularity::block2d;
  const bool rows_only = !gated && granularity == Float8Granularity::row && !q_t;
  const bool two_pass = !rows_only && !blocks;
  runtime::Scratch amax, product;
  if (two_pass) {
    const size_t words = a.tensor() ? 1 : size_t(a.rows + a.cols);
    amax = runtime::Scratch(words * sizeof(uint32_t), stream);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, words * sizeof(uint32_t), stream));
    a.amax = amax.as<uint32_t>();
  }
  if (gated) {
    a.up = gated->up.data;
    if (two_pass) {
      product = runtime::Scratch(size_t(a.rows * a.cols) * dtype_size(input.dtype), stream);
      a.product = product.data();
    }
  }
  // 16-byte fragments where every row starts on a 16-byte boundary and K fills them; else one
  // element at a time.
  const auto run = [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = int(16 / sizeof(T));
    const auto aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = aligned(a.x) && (!gated || aligned(a.up)) && a.cols % kVec == 0 &&
                     (a.rows <= 1 || a.xs % kVec == 0);
    const int sms = runtime::device_props(input.device.index).multiProcessorCount;
    const auto first = [&](auto src) {  // the rows kernel, pass 1, or the block kernel
      using Src = decltype(src);
      if (blocks) vec ? launch_blocks<T, kVec, Src>(a, sms, stream) : launch_blocks<T, 1, Src>(a, sms, stream);
      else if (vec) launch<T, kVec, Src>(a, rows_only, input.device.index, stream);
      else launch<T, 1, Src>(a, rows_only, input.device.index, stream);
    };
    if (!gated) first(Plain{});
    else if (gated->activation == Activation::silu) first(Gated<tile::Silu>{});
    else first(Gated<tile::GeluTanh>{});
    if (!two_pass) return;
    QuantArgs b = a;  // pass 2 reads x, or the product pass 1 left (contiguous)
    if (gated) b.x = a.product, b.xs = a.cols, b.up = nullptr;
    if (gated ? a.cols % kVec == 0 : vec) launch_quant<T, kVec>(b, stream);
    else launch_quant<T, 1>(b, stream);
  };
  switch (input.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
}
}  // namespace

namespace float8 {
void check_outputs(const char* op, const char* input, const TensorView& x, const TensorView* q,
                   const TensorView* scale, const TensorView* q_t, const TensorView* scale_t, Float8Granularity g) {
  if (g != Float8Granularity::row && g != Float8Granularity::tensor)
    detail::throw_arg(ErrorKind::value, op, "granularity", "'row' or 'tensor'",
                      g == Float8Granularity::block ? "'block'" : "'block2d'");
  check(Names{op, input}, x, q, scale, q_t, scale_t, g);
}

void quantize_given_maxima(const TensorView& x, const TensorView* q, const TensorView* scale, const TensorView* q_t,
                           const TensorView* scale_t, Float8Granularity g, uint32_t* amax, cudaStream_t stream) {
  if (x.shape[0] == 0) return;
  runtime::DeviceGuard guard(x.device.index);
  QuantArgs a = args_for(x, q, scale, q_t, scale_t, g);
  a.amax = amax;
  const auto run = [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = int(16 / sizeof(T));
    const bool vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.cols % kVec == 0 && (a.rows <= 1 || a.xs % kVec == 0);
    if (vec) launch_quant<T, kVec>(a, stream);
    else launch_quant<T, 1>(a, stream);
  };
  switch (x.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
}
}  // namespace float8

void float8_quantize(const TensorView& input, const TensorView& q, const TensorView& scale, const TensorView* q_t,
                     const TensorView* scale_t, Float8Granularity granularity, cudaStream_t stream) {
  quantize(input, nullptr, &q, &scale, q_t, scale_t, granularity, stream);
}

void float8_quantize_transposed(const TensorView& input, const TensorView& q_t, const TensorView& scale_t,
                                Float8Granularity granularity, cudaStream_t stream) {
  quantize(input, nullptr, nullptr, nullptr, &q_t, &scale_t, granularity, stream);
}

void float8_quantize_gated(const TensorView& gate, const TensorView& up, Activation activation, const TensorView& q,
                           const TensorView& scale, const TensorView* q_t, const TensorView* scale_t,
                           Float8Granularity granularity, cudaStream_t stream) {
  const GatedInput gated{up, activation};
  quantize(gate, &gated, &q, &scale, q_t, scale_t, granularity, stream);
}

void float8_quantize_gated_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                                    Activation activation, const TensorView& grad_gate, const TensorView& grad_up,
                                    const Float8Copy& gate_copy, const Float8Copy& up_copy,
                                    Float8Granularity granularity, cudaStream_t stream) {
  constexpr const char* op = "float8_quantize_gated_backward";
  runtime::NvtxRange range("tessera::float8_quantize_gated_backward");
  if (granularity != Float8Granularity::row && granularity != Float8Granularity::tensor)
    detail::throw_arg(ErrorKind::value, op, "granularity", "'row' or 'tensor'",
                      granularity == Float8Granularity::block ? "'block'" : "'block2d'");
  if (activation != Activation::silu && activation != Activation::gelu_tanh)
    detail::throw_arg(ErrorKind::value, op, "activation", "'silu' or 'gelu_tanh' (the gate's activation)",
                      std::string("'") + activation_name(activation) + "'");
  // grad_output checked as float8_quantize checks its input; gate and up like it, with its strides
  check(Names{op, "grad_output"}, grad_output, nullptr, nullptr, nullptr, nullptr, granularity);
  for (const auto& [name, t] : {std::pair{"gate", &gate}, {"up", &up}}) {
    detail::check_like(op, name, *t, "grad_output", grad_output);
    if ((t->shape[0] > 1 && t->strides[0] != grad_output.strides[0]) || (t->shape[1] > 1 && t->strides[1] != 1))
      detail::throw_arg(ErrorKind::value, op, name,
                        "grad_output's strides (" + std::to_string(grad_output.strides[0]) + ", 1)",
                        "(" + std::to_string(t->strides[0]) + ", " + std::to_string(t->strides[1]) + ")");
  }
  const int64_t m = grad_output.shape[0], k = grad_output.shape[1];
  const Names outs{op, "grad_output"};
  check_output(outs, "grad_gate", grad_gate, grad_output, grad_output.dtype, {m, k});
  check_output(outs, "grad_up", grad_up, grad_output, grad_output.dtype, {m, k});
  check(Names{op, "grad_gate"}, grad_gate, &gate_copy.q, &gate_copy.scale, gate_copy.q_t, gate_copy.scale_t,
        granularity);
  check(Names{op, "grad_up"}, grad_up, &up_copy.q, &up_copy.scale, up_copy.q_t, up_copy.scale_t, granularity);
  // No two arguments share a byte.
  const std::pair<const char*, const TensorView*> all[] = {
      {"grad_output", &grad_output}, {"gate", &gate}, {"up", &up}, {"grad_gate", &grad_gate}, {"grad_up", &grad_up},
      {"q (grad_gate's)", &gate_copy.q}, {"scale (grad_gate's)", &gate_copy.scale},
      {"q_t (grad_gate's)", gate_copy.q_t}, {"scale_t (grad_gate's)", gate_copy.scale_t},
      {"q (grad_up's)", &up_copy.q}, {"scale (grad_up's)", &up_copy.scale}, {"q_t (grad_up's)", up_copy.q_t},
      {"scale_t (grad_up's)", up_copy.scale_t}};
  for (size_t o = 3; o < std::size(all); ++o)  // the outputs against everything before them
    for (size_t p = 0; p < o; ++p)
      if (all[o].second && all[p].second)
        detail::check_no_overlap(op, all[o].first, *all[o].second, all[p].first, *all[p].second, false);
  if (m == 0) return;
  runtime::DeviceGuard guard(grad_output.device.index);
  const bool tensor = granularity == Float8Granularity::tensor;
  const size_t words = tensor ? 1 : size_t(m + k);
  runtime::Scratch amax(2 * words * sizeof(uint32_t), stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, 2 * words * sizeof(uint32_t), stream));
  float8::QuantArgs a{};
  a.x = gate.data, a.up = up.data, a.dy = grad_output.data, a.xs = grad_output.strides[0];
  a.product = grad_gate.data, a.product2 = grad_up.data;
  a.amax = amax.as<uint32_t>(), a.amax2 = a.amax + words;
  a.q = static_cast<uint8_t*>(gate_copy.q.data);  // pass 1 takes the rows' maxima where q is asked for
  a.rows = m, a.cols = k;
  a.granularity = granularity;
  const auto run = [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = int(16 / sizeof(T));
    const auto aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = aligned(a.x) && aligned(a.up) && aligned(a.dy) && k % kVec == 0 && (m <= 1 || a.xs % kVec == 0);
    const auto first = [&](auto src) {
      using Src = decltype(src);
      if (vec) launch<T, kVec, Src>(a, false, grad_output.device.index, stream);
      else launch<T, 1, Src>(a, false, grad_output.device.index, stream);
    };
    if (activation == Activation::silu) first(float8::GatedGrads<tile::Silu, tile::SiluBackward>{});
    else first(float8::GatedGrads<tile::GeluTanh, tile::GeluTanhBackward>{});
  };
  switch (grad_output.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
  for (int o = 0; o < 2; ++o) {  // pass 2 over each gradient (contiguous)
    const Float8Copy& c = o ? up_copy : gate_copy;
    float8::quantize_given_maxima(o ? grad_up : grad_gate, &c.q, &c.scale, c.q_t, c.scale_t, granularity,
                                  o ? a.amax2 : a.amax, stream);
  }
}

namespace {
// Outputs allocated by hand (float8 and transposed shapes, which no generic rule spells): the
// torch kernels are python/src/torch/matrix.cpp's. float8_quantize.columns adds the transposed
// copy (q_t [K, M]; scale_t [1, K] for row, 0-d for tensor, [ceil(M / 128), K] for block, as scale
// for block2d); float8_quantize.transposed gives that copy alone (q_t, scale_t).
const OpRegistrar kFloat8Quantize =
    describe("float8_quantize", "matrix",
             "x [M, K] to float8_e4m3fn with float32 scales about amax / 448 (one per row, per tensor, per 1 x 128 "
             "block of a row or per 128 x 128 block), and optionally x's columns quantized along M, transposed "
             "([K, M]), from the same reads")
        .schema("float8_quantize(Tensor input, *, str granularity='row') -> (Tensor, Tensor)")
        .schema("float8_quantize.columns(Tensor input, *, str granularity='row') -> (Tensor, Tensor, Tensor, Tensor)")
        .schema("float8_quantize.transposed(Tensor input, *, str granularity='row') -> (Tensor, Tensor)");

// Its own op rather than an overload of float8_quantize: torch aborts at exit while deregistering
// an op whose three or more overloads take different counts of tensors.
const OpRegistrar kFloat8QuantizeGated =
    describe("float8_quantize_gated", "matrix",
             "a gated feed-forward's product act(gate) * up (SwiGLU's, GeGLU's) quantized as float8_quantize "
             "quantizes x, in the pass that computes it, optionally with its transposed copy")
        .schema("float8_quantize_gated(Tensor gate, Tensor up, *, str activation='silu', str granularity='row') -> "
                "(Tensor, Tensor)")
        .schema("float8_quantize_gated.columns(Tensor gate, Tensor up, *, str activation='silu', "
                "str granularity='row') -> (Tensor, Tensor, Tensor, Tensor)");
}  // namespace
}  // namespace tessera