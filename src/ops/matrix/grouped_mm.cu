// grouped_mm: torch._grouped_mm's products of many groups in one call (a Mixture-of-Experts
// layer's tokens grouped by expert), sync-free: the groups' offsets stay on the device.
//
// The forms (G groups, offs the groups' cumulative ends):
//   rows     input [M, K] x other [G, K, N], offs over M -> [M, N]: the expert layers' forward and
//            input gradient. GemmArgs::offs: the sm90 tier's persistent kernel walks each group's
//            tiles (gemm_sm90.cuh), else the generic kernel below.
//   columns  input [G, M, K] x other [K, N], offs over N -> [M, N]: the rows form on the
//            transposes (out^T = other^T x input[g]^T).
//   depth    input [M, K] x other [K, N], offs over K -> [G, M, N]: the weights' gradient (each
//            group's tokens summed over). GemmArgs::offs_over_k: the sm90 tier for MN-major
//            operands (the K blocks a group shares with its neighbour masked in shared memory),
//            else the generic kernel.
//   batched  input [G, M, K] x other [G, K, N] -> [G, M, N]: matmul's batched product.
//
// grouped_prepare (below) clamps the ends (a decreasing end makes its group empty; none passes the
// extent) and counts each group's tiles on the GPU, so no bad offset reads out of bounds and the
// host never waits; the rows (columns) past the last end are zeroed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "ops/matrix/gemm.cuh"
#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/matrix.hpp"
#include "tessera/op.hpp"
#include "tile/convert.cuh"

namespace tessera {
namespace matrix {
namespace {

constexpr int kScanThreads = 1024;

// One CTA, the groups kScanThreads at a time: ends[g] = min(max(offs[g], ends[g - 1]), extent)
// (a running max: a scan), then prefix[g] = the tiles of the groups before g, each group's
// ceil(rows / tile_m) * tiles_n (a second scan); prefix[groups] all of them.
__global__ void __launch_bounds__(kScanThreads) group_units_kernel(const int32_t* offs, int groups, int64_t extent,
                                                                  int tile_m, int tiles_n, int* prefix, int* ends,
                                                                  int* next) {
  __shared__ int scan[kScanThreads];
  __shared__ int carry_end, carry_units;
  const int t = threadIdx.x;
  if (t == 0) carry_end = 0, carry_units = 0, prefix[0] = 0;
  if (t == 0 && next) *next = 0;
  __syncthreads();
  for (int base = 0; base < groups; base += kScanThreads) {
    const int g = base + t;
    const int64_t o = g < groups ? offs[g] : 0;
    int v = int(o < 0 ? 0 : o > extent ? extent : o);
    for (int pass = 0; pass < 2; ++pass) {  // 0: the ends (max), 1: the units (sum)
      scan[t] = v;
      __syncthreads();
      for (int d = 1; d < kScanThreads; d *= 2) {
        const int other = t >= d ? scan[t - d] : (pass ? 0 : INT32_MIN);
        __syncthreads();
        scan[t] = pass ? scan[t] + other : max(scan[t], other);
        __syncthreads();
      }
      if (pass == 0) {
        const int end = max(scan[t], carry_end), begin = t ? max(scan[t - 1], carry_end) : carry_end;
        if (g < groups) ends[g] = end;
        v = g < groups ? (end - begin + tile_m - 1) / tile_m * tiles_n : 0;
        __syncthreads();
        if (t == kScanThreads - 1) carry_end = end;
      } else {
        if (g < groups) prefix[g + 1] = carry_units + scan[t];
        __syncthreads();
        if (t == kScanThreads - 1) carry_units += scan[t];
      }
      __syncthreads();
    }
  }
}

// C's rows past the last group's end, zeroed (E: an unsigned type of the output's element size).
template <class E>
__global__ void zero_tail_kernel(E* c, int64_t c_sm, int64_t c_sn, int64_t m, int64_t n, const int* last_end) {
  const int64_t first = *last_end, count = (m - first) * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    c[(first + i / n) * c_sm + i % n * c_sn] = E(0);
}

// ---- the generic kernel: any form's groups, any strides and dtype -----------------------------
constexpr int kTile = 64, kDepth = 16, kThreads = 256;

template <class T, class OutT>
struct GroupedArgs {
  const T* a;
  const T* b;
  OutT* c;
  int64_t a_sm, a_sk, b_sg, b_sk, b_sn, c_sg, c_sm, c_sn;
  int64_t m, n, k;
  const int* ends;  // clamped ends (rows: over M; depth: over K)
  int groups;
  bool depth;       // the depth form (blockIdx.z the group), else rows
  float alpha;
};

// The tile's rows [r0, r1) (of those from m0) times B's group over K [k0, k1), stored.
template <class T, class OutT>
__device__ void tile_product(const GroupedArgs<T, OutT>& p, float (&as)[kDepth][kTile + 4],
                             float (&bs)[kDepth][kTile + 4], const T* b, OutT* c, int64_t m0, int64_t n0,
                             int64_t r0, int64_t r1, int64_t k0, int64_t k1) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t kc = k0; kc < k1; kc += kDepth) {
    for (int i = threadIdx.x; i < kTile * kDepth; i += kThreads) {
      const int r = i / kDepth, kk = i % kDepth;
      const int64_t gm = m0 + r, gk = kc + kk;
      as[kk][r] = gm >= r0 && gm < r1 && gk < k1 ? tile::to_float(p.a[gm * p.a_sm + gk * p.a_sk]) : 0.0f;
      const int col = i % kTile, kb = i / kTile;
      const int64_t gn = n0 + col, gkb = kc + kb;
      bs[kb][col] = gn < p.n && gkb < k1 ? tile::to_float(b[gkb * p.b_sk + gn * p.b_sn]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(as[kk][ty + 16 * i], bs[kk][tx + 16 * j], acc[i][j]);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t row = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
      if (row >= r0 && row < r1 && col < p.n) c[row * p.c_sm + col * p.c_sn] = tile::from_float<OutT>(p.alpha * acc[i][j]);
    }
}

// Rows: the tile's rows group by group (a tile may straddle groups); depth: blockIdx.z's group over
// its K range, every row.
template <class T, class OutT>
__global__ void __launch_bounds__(kThreads) grouped_generic_kernel(const GroupedArgs<T, OutT> p) {
  __shared__ float as[kDepth][kTile + 4], bs[kDepth][kTile + 4];
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  if (p.depth) {
    const int g = blockIdx.z;
    tile_product(p, as, bs, p.b, p.c + g * p.c_sg, m0, n0, m0, p.m, g ? p.ends[g - 1] : 0, p.ends[g]);
    return;
  }
  for (int g = 0; g < p.groups; ++g) {
    const int64_t begin = g ? p.ends[g - 1] : 0, end = p.ends[g];
    if (end <= m0 || begin >= m0 + kTile || begin == end) continue;
    tile_product(p, as, bs, p.b + g * p.b_sg, p.c, m0, n0, begin > m0 ? begin : m0, end, 0, p.k);
  }
}

template <class T, class OutT>
void launch_generic(const GemmArgs& g, bool depth, const int* ends, cudaStream_t stream) {
  const GroupedArgs<T, OutT> p{static_cast<const T*>(g.a), static_cast<const T*>(g.b), static_cast<OutT*>(g.c),
                               g.a_sm, g.a_sk, g.b_sb, g.b_sk, g.b_sn, g.c_sb, g.c_sm, g.c_sn, g.m, g.n, g.k,
                               ends, int(g.groups), depth, g.alpha};
  const dim3 grid(unsigned((g.n + kTile - 1) / kTile), unsigned((g.m + kTile - 1) / kTile),
                  unsigned(depth ? g.groups : 1));
  grouped_generic_kernel<T, OutT><<<grid, kThreads, 0, stream>>>(p);
  TESSERA_LAUNCH_CHECK();
}

template <class T>
void launch_generic_in(const GemmArgs& g, bool depth, const int* ends, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_generic<T, float>(g, depth, ends, stream);
  else launch_generic<T, T>(g, depth, ends, stream);
}

void run_generic(const GemmArgs& g, bool depth, const int* ends, cudaStream_t stream) {
  switch (g.dtype) {
    case DType::float16: return launch_generic_in<__half>(g, depth, ends, stream);
    case DType::bfloat16: return launch_generic_in<__nv_bfloat16>(g, depth, ends, stream);
    default: return launch_generic_in<float>(g, depth, ends, stream);
  }
}

// Every grouped form where the sm90 tier does not take it: over rows, a tile's groups in turn;
// over K (GemmArgs::offs_over_k), a grid layer a group, over its K range.
struct GroupedGenericTier {
  static constexpr const char* kName = "grouped_simt";
  static constexpr const char* kWhen = "any GPU, dtype and layout: 64 x 64 tiles through the strides";
  struct Plan {
    bool depth = false;
    std::string describe() const {
      return std::string("64 x 64 tiles, float32 FMAs, ") + (depth ? "a grid layer a group" : "a tile's groups in turn");
    }
  };
  static bool can_implement(const GemmArgs&, const GemmCtx&) { return true; }
  static Plan plan(const GemmArgs& g, const GemmCtx&) { return {g.offs_over_k}; }
  static void launch(const GemmArgs& g, const Plan&, cudaStream_t stream) {
    runtime::Scratch units(std::size_t(2 * g.groups + 1) * sizeof(int), stream);
    grouped_prepare(g, kTile, kTile, units.as<int>(), units.as<int>() + g.groups + 1, stream);
    run_generic(g, g.offs_over_k, units.as<int>() + g.groups + 1, stream);
  }
};

}  // namespace

void grouped_prepare(const GemmArgs& g, int tile_m, int tile_n, int* prefix, int* ends, cudaStream_t stream,
                     int* next) {
  const int tiles_n = int((g.n + tile_n - 1) / tile_n);
  group_units_kernel<<<1, kScanThreads, 0, stream>>>(g.offs, int(g.groups), g.offs_over_k ? g.k : g.m, tile_m,
                                                     tiles_n, prefix, ends, next);
  TESSERA_LAUNCH_CHECK();
  if (g.offs_over_k) return;  // the K ranges only: nothing past them to zero
  const int* last = ends + g.groups - 1;
  const unsigned grid = unsigned(std::min<int64_t>(1024, (g.m * g.n + 255) / 256));
  switch (dtype_size(g.out_dtype)) {
    case 2: zero_tail_kernel<<<grid, 256, 0, stream>>>(static_cast<uint16_t*>(g.c), g.c_sm, g.c_sn, g.m, g.n, last); break;
    default: zero_tail_kernel<<<grid, 256, 0, stream>>>(static_cast<uint32_t*>(g.c), g.c_sm, g.c_sn, g.m, g.n, last); break;
  }
  TESSERA_LAUNCH_CHECK();
}

}  // namespace matrix

namespace {

constexpr const char* kOp = "grouped_mm";

void check_offs(const TensorView& offs, const TensorView& like, int64_t groups, const char* over) {
  detail::check_cuda_tensor(kOp, "offs", offs);
  detail::check_same_device(kOp, "offs", offs, "input", like);
  detail::check_dtype_in(kOp, "offs", offs, {DType::int32});
  if (offs.ndim != 1 || offs.strides[0] != 1 || (groups >= 0 && offs.shape[0] != groups))
    detail::throw_arg(ErrorKind::value, kOp, "offs",
                      std::string("a contiguous 1-d int32 tensor of the groups' cumulative ends over ") + over +
                          (groups >= 0 ? " (" + std::to_string(groups) + " groups)" : std::string()),
                      offs.shape_str());
}

void check_shape(const char* arg, const TensorView& t, std::initializer_list<int64_t> want) {
  bool same = t.ndim == int(want.size());
  int d = 0;
  for (int64_t w : want) same = same && t.shape[d++] == w;
  if (!same) {
    TensorView w = t;
    w.ndim = int(want.size());
    d = 0;
    for (int64_t v : want) w.shape[d++] = v;
    detail::throw_arg(ErrorKind::value, kOp, arg, w.shape_str(), t.shape_str());
  }
}

}  // namespace

void grouped_mm(const TensorView& input, const TensorView& other, const TensorView* offs, const TensorView& out,
                cudaStream_t stream) {
  runtime::NvtxRange range("tessera::grouped_mm");
  for (auto [arg, t] : {std::pair{"input", &input}, std::pair{"other", &other}, std::pair{"out", &out}}) {
    detail::check_cuda_tensor(kOp, arg, *t);
    if (t->ndim != 2 && t->ndim != 3) detail::throw_arg(ErrorKind::value, kOp, arg, "a 2-d or 3-d tensor", detail::dims(*t));
  }
  detail::check_same_device(kOp, "other", other, "input", input);
  detail::check_same_device(kOp, "out", out, "input", input);
  detail::check_dtype_in(kOp, "input", input, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_same_dtype(kOp, "other", other, "input", input);
  if (out.dtype != input.dtype && out.dtype != DType::float32)
    detail::throw_arg(ErrorKind::type, kOp, "out", std::string("dtype ") + dtype_name(input.dtype) + " (that of 'input') or float32",
                      dtype_name(out.dtype));
  const bool a3 = input.ndim == 3, b3 = other.ndim == 3;
  const int64_t k = input.shape[input.ndim - 1];
  if (other.shape[other.ndim - 2] != k)
    detail::throw_arg(ErrorKind::value, kOp, "other", "K = " + std::to_string(k) + " rows (input's last dimension)", other.shape_str());
  if (a3 && b3) {
    if (offs) detail::throw_arg(ErrorKind::value, kOp, "offs", "None for a 3-d input and a 3-d other (a batched product)", "a tensor");
    if (other.shape[0] != input.shape[0])
      detail::throw_arg(ErrorKind::value, kOp, "other", std::to_string(input.shape[0]) + " groups (input's)", other.shape_str());
    check_shape("out", out, {input.shape[0], input.shape[1], other.shape[2]});
    return matmul(input, other, out, MatmulOptions{}, stream);
  }
  if (!offs)
    detail::throw_arg(ErrorKind::value, kOp, "offs", "the groups' cumulative ends (input or other is 2-d)", "None");
  detail::check_no_overlap(kOp, "out", out, "input", input, false);
  detail::check_no_overlap(kOp, "out", out, "other", other, false);
  detail::check_no_overlap(kOp, "out", out, "offs", *offs, false);
  runtime::DeviceGuard guard(input.device.index);
  matrix::GemmArgs g;
  g.dtype = input.dtype, g.out_dtype = out.dtype, g.device = input.device.index;
  g.offs = static_cast<const int32_t*>(offs->data);
  const matrix::GemmCtx ctx{runtime::device_props(g.device).multiProcessorCount, runtime::device_props(g.device).major};
  // The rows form: a [M, K] grouped by rows times b [G, K, N] into c [M, N].
  const auto rows = [&](const TensorView& a, const TensorView& b, const TensorView& c) {
    g.groups = b.shape[0], g.m = a.shape[0], g.n = b.shape[2], g.k = k;
    g.a = a.data, g.a_sm = a.strides[0], g.a_sk = a.strides[1];
    g.b = b.data, g.b_sb = b.strides[0], g.b_sk = b.strides[1], g.b_sn = b.strides[2];
    g.c = c.data, g.c_sm = c.strides[0], g.c_sn = c.strides[1];
    if (g.m == 0 || g.n == 0 || g.groups == 0) return;
    runtime::run_first<matrix::Sm90Tier, matrix::GroupedGenericTier>(kOp, g, ctx, stream);
  };
  if (!a3 && b3) {
    check_offs(*offs, input, other.shape[0], "input's rows");
    check_shape("out", out, {input.shape[0], other.shape[2]});
    return rows(input, other, out);
  }
  if (a3 && !b3) {  // columns: out^T [N, M] = other^T [N, K] x input[g]^T [K, M], rows grouped
    check_offs(*offs, input, input.shape[0], "other's columns");
    check_shape("out", out, {input.shape[1], other.shape[1]});
    return rows(runtime::transposed(other), runtime::transposed(input), runtime::transposed(out));
  }
  // depth: out[g] = input[:, K_g] x other[K_g, :]
  const int64_t m = input.shape[0], n = other.shape[1];
  check_offs(*offs, input, -1, "K");
  const int64_t groups = offs->shape[0];
  check_shape("out", out, {groups, m, n});
  g.groups = groups, g.m = m, g.n = n, g.k = k;
  g.a = input.data, g.a_sm = input.strides[0], g.a_sk = input.strides[1];
  g.b = other.data, g.b_sk = other.strides[0], g.b_sn = other.strides[1];
  g.c = out.data, g.c_sb = out.strides[0], g.c_sm = out.strides[1], g.c_sn = out.strides[2];
  g.offs_over_k = true, g.batch = groups;
  if (m == 0 || n == 0 || groups == 0) return;
  runtime::run_first<matrix::Sm90Tier, matrix::GroupedGenericTier>(kOp, g, ctx, stream);
}

namespace {
// Output shapes by form: a torch kernel written by hand (python/src/torch/matrix.cpp).
const OpRegistrar kGroupedMm = describe("grouped_mm", "matrix", "grouped GEMM (torch._grouped_mm): a product per group of rows, columns or K, offsets on the device")
    .schema("grouped_mm(Tensor input, Tensor other, Tensor? offs=None, *, ScalarType? out_dtype=None) -> Tensor")
    .torch("torch._grouped_mm");
}  // namespace
}  // namespace tessera
