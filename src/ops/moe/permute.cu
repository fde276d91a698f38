// A Mixture-of-Experts layer's tokens moved into expert order and back: moe_permute (each token
// written to its k pair rows, optionally scaled by its routing weight), moe_unpermute (each
// token's k pair rows summed with their weights: the deterministic inverse) and their gradients,
// which are each other's kernels: permute's input gradient is an unpermute of the output's, and
// unpermute's a permute. The routing weights' gradients are dot products of the two rows a pair
// joins, taken in the same pass.
//
// A warp per token walks its row in 32-lane chunks of 16-byte vectors (one element where the rows
// are not 16-byte aligned). Bytes (T tokens, k pairs each, H wide): permute reads T H and writes
// T k H elements; unpermute reads T k H and writes T H; each backward reads the dot's other row
// too. Gather and scatter rows are whole rows, so every access is a full 32 x 16-byte line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/moe.hpp"
#include "tile/convert.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace tessera {
namespace moe {
namespace {

constexpr int kWarps = 8;  // tokens per CTA
// Dot products that the gather kernel keeps per lane across its chunks; more pairs a token take a
// second pass over their rows.
constexpr int kMaxDots = 8;

struct Rows {  // a [n, H] operand: base pointer and row stride, in elements
  const void* p;
  int64_t stride;
};

struct PairArgs {
  Rows x;          // scatter: the token rows [T, H]; gather: the pair rows [T k, H]
  void* out;       // scatter: pair rows [T k, H]; gather: token rows [T, H]
  int64_t out_stride;
  Rows dot;        // the dot's other operand (scatter: pair rows; gather: token rows), or p null
  const int* rows;     // [T, k]
  const void* weight;  // [T, k] or null
  void* grad_weight;   // [T, k] (weight's dtype) or null
  int64_t tokens, h;
  int k;
  int64_t pairs;  // T k: rows outside [0, pairs) are dropped
};

template <class W>
__device__ __forceinline__ float weight_at(const PairArgs& a, int64_t i) {
  return a.weight ? tile::to_float(static_cast<const W*>(a.weight)[i]) : 1.0f;
}

template <int V, class T>
__device__ __forceinline__ tile::Vec<float, V> load_floats(const T* p) {
  const tile::Vec<T, V> v = tile::load<V>(p);
  tile::Vec<float, V> f;
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = tile::to_float(v[i]);
  return f;
}

template <int V, class T>
__device__ __forceinline__ void store_floats(T* p, const tile::Vec<float, V>& f) {
  tile::Vec<T, V> v;
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = tile::from_float<T>(f[i]);
  tile::store<V>(p, v);
}

// <a, b> over one row pair, by the whole warp (every lane gets the sum).
template <int V, class T>
__device__ __forceinline__ float row_dot(const T* a, const T* b, int64_t h, int lane) {
  float s = 0.0f;
  for (int64_t c = int64_t(lane) * V; c < h; c += 32 * V) {
    const tile::Vec<float, V> x = load_floats<V>(a + c), y = load_floats<V>(b + c);
#pragma unroll
    for (int i = 0; i < V; ++i) s = fmaf(x[i], y[i], s);
  }
  return tile::warp_sum(s);
}

// out[rows[t, j]] = weight[t, j] x[t]; grad_weight[t, j] = <dot[rows[t, j]], x[t]>.
template <class T, class W, int V>
__global__ void __launch_bounds__(kWarps * 32) scatter_kernel(PairArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= a.tokens) return;
  const T* x = static_cast<const T*>(a.x.p) + t * a.x.stride;
  for (int j = 0; j < a.k; ++j) {
    const int64_t i = t * a.k + j, r = a.rows[i];
    if (r < 0 || r >= a.pairs) {
      if (a.grad_weight && lane == 0) static_cast<W*>(a.grad_weight)[i] = tile::from_float<W>(0.0f);
      continue;
    }
    const float w = weight_at<W>(a, i);
    T* o = static_cast<T*>(a.out) + r * a.out_stride;
    for (int64_t c = int64_t(lane) * V; c < a.h; c += 32 * V) {
      tile::Vec<float, V> f = load_floats<V>(x + c);
#pragma unroll
      for (int e = 0; e < V; ++e) f[e] *= w;
      store_floats<V>(o + c, f);
    }
    if (a.grad_weight) {
      const float d = row_dot<V>(static_cast<const T*>(a.dot.p) + r * a.dot.stride, x, a.h, lane);
      if (lane == 0) static_cast<W*>(a.grad_weight)[i] = tile::from_float<W>(d);
    }
  }
}

// out[t] = sum_j weight[t, j] x[rows[t, j]] (j in order); grad_weight[t, j] = <x[rows[t, j]], dot[t]>.
template <class T, class W, int V>
__global__ void __launch_bounds__(kWarps * 32) gather_kernel(PairArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= a.tokens) return;
  const T* x = static_cast<const T*>(a.x.p);
  const T* dot = a.grad_weight ? static_cast<const T*>(a.dot.p) + t * a.dot.stride : nullptr;
  const bool fused = dot && a.k <= kMaxDots;
  float dots[kMaxDots] = {};
  for (int64_t c = int64_t(lane) * V; c < a.h; c += 32 * V) {
    tile::Vec<float, V> acc = {}, d = {};
    if (fused) d = load_floats<V>(dot + c);
#pragma unroll 4
    for (int j = 0; j < a.k; ++j) {
      const int64_t i = t * a.k + j, r = a.rows[i];
      if (r < 0 || r >= a.pairs) continue;
      const tile::Vec<float, V> v = load_floats<V>(x + r * a.x.stride + c);
      const float w = weight_at<W>(a, i);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = fmaf(w, v[e], acc[e]);
      if (fused) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < V; ++e) s = fmaf(v[e], d[e], s);
#pragma unroll
        for (int q = 0; q < kMaxDots; ++q)  // a register array: indices known at compile time
          if (q == j) dots[q] += s;
      }
    }
    store_floats<V>(static_cast<T*>(a.out) + t * a.out_stride + c, acc);
  }
  if (!dot) return;
  W* gw = static_cast<W*>(a.grad_weight) + t * a.k;
  for (int j = 0; j < a.k; ++j) {
    const int64_t r = a.rows[t * a.k + j];
    float s = 0.0f;
    if (r >= 0 && r < a.pairs) {
      if (!fused) s = row_dot<V>(x + r * a.x.stride, dot, a.h, lane);
      else {
#pragma unroll
        for (int q = 0; q < kMaxDots; ++q)
          if (q == j) s = tile::warp_sum(dots[q]);
      }
    }
    if (lane == 0) gw[j] = tile::from_float<W>(s);
  }
}

template <class T>
bool aligned_rows(const PairArgs& a) {
  constexpr int v = tile::kVec16<T>;
  bool ok = a.h % v == 0 && a.x.stride % v == 0 && a.out_stride % v == 0 &&
            tile::is_aligned<T, v>(a.x.p) && tile::is_aligned<T, v>(a.out);
  if (a.dot.p) ok = ok && a.dot.stride % v == 0 && tile::is_aligned<T, v>(a.dot.p);
  return ok;
}

template <class T, class W>
void launch_typed(bool scatter, const PairArgs& a, cudaStream_t stream) {
  constexpr int v = tile::kVec16<T>;
  const dim3 grid(unsigned((a.tokens + kWarps - 1) / kWarps)), block(kWarps * 32);
  const bool vec = aligned_rows<T>(a);
  if (scatter && vec) scatter_kernel<T, W, v><<<grid, block, 0, stream>>>(a);
  else if (scatter) scatter_kernel<T, W, 1><<<grid, block, 0, stream>>>(a);
  else if (vec) gather_kernel<T, W, v><<<grid, block, 0, stream>>>(a);
  else gather_kernel<T, W, 1><<<grid, block, 0, stream>>>(a);
  TESSERA_LAUNCH_CHECK();
}

template <class T>
void launch_weight(bool scatter, DType weight, const PairArgs& a, cudaStream_t stream) {
  switch (weight) {
    case DType::float16: return launch_typed<T, __half>(scatter, a, stream);
    case DType::bfloat16: return launch_typed<T, __nv_bfloat16>(scatter, a, stream);
    default: return launch_typed<T, float>(scatter, a, stream);
  }
}

}  // namespace
}  // namespace moe

namespace {

using moe::PairArgs;

// The checks every call shares, then the launch. `tokens` [T, H] and `pairs` [T k, H] name the
// arguments in the caller's terms; `scatter`: tokens are read and pairs written (permute).
struct Call {
  const char* op;
  const TensorView& rows;
  const TensorView* weight;
  const TensorView* grad_weight;

  void check_rows(const char* arg, const TensorView& t, const char* ref_arg, const TensorView& ref) const {
    detail::check_cuda_tensor(op, arg, t);
    detail::check_same_device(op, arg, t, ref_arg, ref);
    if (t.ndim != 2 || t.shape[1] < 1 || (t.numel() > 0 && (t.strides[1] != 1 || t.strides[0] != t.shape[1])))
      detail::throw_arg(ErrorKind::value, op, arg, "a contiguous 2-d [tokens, k] tensor, k >= 1", detail::dims(t));
  }

  void check_matrix(const char* arg, const TensorView& t, int64_t n, int64_t h, const char* like_arg,
                    const TensorView& like) const {
    detail::check_cuda_tensor(op, arg, t);
    detail::check_same_device(op, arg, t, like_arg, like);
    detail::check_same_dtype(op, arg, t, like_arg, like);
    if (t.ndim != 2 || t.shape[0] != n || t.shape[1] != h || (h > 1 && t.strides[1] != 1))
      detail::throw_arg(ErrorKind::value, op, arg,
                        "[" + std::to_string(n) + ", " + std::to_string(h) + "] with its last dimension contiguous",
                        t.shape_str());
  }

  // x_arg: the argument read (token rows where `scatter`, else pair rows), out_arg the one
  // written; dot_arg: the dot's other operand (read only where grad_weight is given).
  void run(bool scatter, const char* x_arg, const TensorView& x, const char* out_arg, const TensorView& out,
           const char* dot_arg, const TensorView* dot, cudaStream_t stream) const {
    detail::check_cuda_tensor(op, x_arg, x);
    detail::check_dtype_in(op, x_arg, x, {DType::float32, DType::float16, DType::bfloat16});
    check_rows("rows", rows, x_arg, x);
    const int64_t tokens = rows.shape[0], k = rows.shape[1], h = x.ndim == 2 ? x.shape[1] : -1;
    if (x.ndim != 2) detail::throw_arg(ErrorKind::value, op, x_arg, "a 2-d tensor", detail::dims(x));
    const int64_t x_rows = scatter ? tokens : tokens * k, out_rows = scatter ? tokens * k : tokens;
    check_matrix(x_arg, x, x_rows, h, x_arg, x);
    check_matrix(out_arg, out, out_rows, h, x_arg, x);
    detail::check_no_overlap(op, out_arg, out, x_arg, x, false);
    if (k > (int64_t(1) << 20) || tokens * k >= (int64_t(1) << 31))
      detail::throw_arg(ErrorKind::value, op, "rows", "fewer than 2^31 pairs (int32 rows)", rows.shape_str());
    for (const TensorView* w : {weight, grad_weight}) {
      if (!w) continue;
      const char* arg = w == weight ? "weight" : "grad_weight";
      detail::check_cuda_tensor(op, arg, *w);
      detail::check_same_device(op, arg, *w, x_arg, x);
      detail::check_dtype_in(op, arg, *w, {DType::float32, DType::float16, DType::bfloat16});
      if (w->ndim != 2 || w->shape[0] != tokens || w->shape[1] != k || (w->numel() > 0 && w->strides[1] != 1) ||
          (w->numel() > 0 && w->strides[0] != k))
        detail::throw_arg(ErrorKind::value, op, arg,
                          "a contiguous [" + std::to_string(tokens) + ", " + std::to_string(k) + "] tensor (rows' shape)",
                          w->shape_str());
    }
    if (grad_weight && weight) detail::check_same_dtype(op, "grad_weight", *grad_weight, "weight", *weight);
    if (dot) check_matrix(dot_arg, *dot, scatter ? tokens * k : tokens, h, x_arg, x);
    if (tokens == 0) return;
    PairArgs a{};
    a.x = {x.data, x.strides[0]};
    a.out = out.data, a.out_stride = out.strides[0];
    a.dot = {grad_weight ? dot->data : nullptr, grad_weight ? dot->strides[0] : 0};
    a.rows = static_cast<const int*>(rows.data);
    a.weight = weight ? weight->data : nullptr;
    a.grad_weight = grad_weight ? grad_weight->data : nullptr;
    a.tokens = tokens, a.h = h, a.k = int(k), a.pairs = tokens * k;
    const DType wt = weight ? weight->dtype : grad_weight ? grad_weight->dtype : DType::float32;
    runtime::DeviceGuard guard(x.device.index);
    switch (x.dtype) {
      case DType::float16: return moe::launch_weight<__half>(scatter, wt, a, stream);
      case DType::bfloat16: return moe::launch_weight<__nv_bfloat16>(scatter, wt, a, stream);
      default: return moe::launch_weight<float>(scatter, wt, a, stream);
    }
  }
};

}  // namespace

void moe_permute(const TensorView& input, const TensorView& rows, const TensorView* weight, const TensorView& out,
                 cudaStream_t stream) {
  runtime::NvtxRange range("tessera::moe_permute");
  Call{"moe_permute", rows, weight, nullptr}.run(true, "input", input, "out", out, nullptr, nullptr, stream);
}

void moe_unpermute(const TensorView& input, const TensorView& rows, const TensorView* weight, const TensorView& out,
                   cudaStream_t stream) {
  runtime::NvtxRange range("tessera::moe_unpermute");
  Call{"moe_unpermute", rows, weight, nullptr}.run(false, "input", input, "out", out, nullptr, nullptr, stream);
}

void moe_permute_backward(const TensorView& grad_output, const TensorView& input, const TensorView& rows,
                          const TensorView* weight, const TensorView& grad_input, const TensorView* grad_weight,
                          cudaStream_t stream) {
  runtime::NvtxRange range("tessera::moe_permute_backward");
  Call{"moe_permute_backward", rows, weight, grad_weight}.run(false, "grad_output", grad_output, "grad_input",
                                                              grad_input, "input", &input, stream);
}

void moe_unpermute_backward(const TensorView& grad_output, const TensorView& input, const TensorView& rows,
                            const TensorView* weight, const TensorView& grad_input, const TensorView* grad_weight,
                            cudaStream_t stream) {
  runtime::NvtxRange range("tessera::moe_unpermute_backward");
  Call{"moe_unpermute_backward", rows, weight, grad_weight}.run(true, "grad_output", grad_output, "grad_input",
                                                                grad_input, "input", &input, stream);
}

namespace {
// The forwards' outputs have T k or T rows (rows' count, not an argument's shape): torch kernels
// written by hand (python/src/torch/moe.cpp). The backwards' outputs are like their arguments.
const OpRegistrar kPermute =
    describe("moe_permute", "moe", "MoE tokens into expert order: out[rows[t, j]] = weight[t, j] * input[t]")
        .schema("moe_permute(Tensor input, Tensor rows, Tensor? weight=None) -> Tensor");
const OpRegistrar kUnpermute =
    describe("moe_unpermute", "moe",
             "MoE pairs back to tokens, deterministic: out[t] = sum_j weight[t, j] * input[rows[t, j]]")
        .schema("moe_unpermute(Tensor input, Tensor rows, Tensor? weight=None) -> Tensor");
const OpRegistrar kPermuteBackward =
    describe("moe_permute_backward", "moe", "moe_permute backward: grad_input, grad_weight")
        .schema("moe_permute_backward(Tensor grad_output, Tensor input, Tensor rows, Tensor? weight=None) -> "
                "(Tensor, Tensor)")
        .kernel<&moe_permute_backward>({"grad_output", "input", "rows", "weight", "grad_input", "grad_weight"},
                                       {out::like("grad_input", "input"), out::like("grad_weight", "weight")});
const OpRegistrar kUnpermuteBackward =
    describe("moe_unpermute_backward", "moe", "moe_unpermute backward: grad_input, grad_weight")
        .schema("moe_unpermute_backward(Tensor grad_output, Tensor input, Tensor rows, Tensor? weight=None) -> "
                "(Tensor, Tensor)")
        .kernel<&moe_unpermute_backward>({"grad_output", "input", "rows", "weight", "grad_input", "grad_weight"},
                                         {out::like("grad_input", "input"), out::like("grad_weight", "weight")});
}  // namespace
}  // namespace tessera
