// add: out = a + alpha * b, with torch's broadcasting.
//
// Bytes: 3 * n * sizeof(T) for same-shape tensors (two reads, one write), 2 * n * sizeof(T) when b
// is a scalar. No FLOP worth counting: the kernel is memory-bound and its target is the copy
// bandwidth. Tiers, fastest first: all dense (vectorized map), b a scalar (vectorized map with b
// in a register), b dense over the trailing dimensions (rows kernel below), anything else
// (strided map).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/map.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

using tile::Inputs;

struct AddOp {
  float alpha;
  __device__ __forceinline__ float operator()(float a, float b) const { return a + alpha * b; }
};

// b is one element on the device: read once per thread, it stays in L1.
template <class T>
struct AddScalarAt {
  const T* b;
  float alpha;
  __device__ __forceinline__ float operator()(float a) const { return a + alpha * tile::to_float(__ldg(b)); }
};

struct AddScalarValue {
  float bv;  // alpha * b, folded on the host
  __device__ __forceinline__ float operator()(float a) const { return a + bv; }
};

// b has `inner` elements and repeats along the leading dimensions of a (a bias over rows).
// One modulo per vector, not per element: inner is a multiple of V on this path.
template <int V, class T>
__global__ __launch_bounds__(tile::kMapThreads) void add_rows_kernel(const T* __restrict__ a,
                                                                     const T* __restrict__ b,
                                                                     T* __restrict__ out, int64_t n,
                                                                     int64_t inner, float alpha) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * V) {
    const auto va = tile::load_tile<V>(a, i, n);
    const auto vb = tile::load<V>(b + i % inner);  // i % inner + V <= inner
    tile::Vec<T, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) r[e] = tile::from_float<T>(tile::to_float(va[e]) + alpha * tile::to_float(vb[e]));
    tile::store_tile<V>(out, i, n, r);
  }
}

// True when bb (b broadcast to out's shape) is b's dense data repeated over leading dimensions.
bool rows_broadcast(const TensorView& bb, const TensorView& b, int64_t& inner) {
  if (!b.is_contiguous()) return false;
  int d = bb.ndim;
  int64_t expect = 1;
  while (d > 0 && bb.strides[d - 1] == expect && bb.shape[d - 1] != 1) expect *= bb.shape[--d];
  for (int k = 0; k < d; ++k)
    if (bb.strides[k] != 0 && bb.shape[k] != 1) return false;
  inner = expect;
  return inner == b.numel();
}

// One call as the tiers see it, with the layout facts they choose by.
template <class T>
struct Call {
  const TensorView& out;
  TensorView ab, bb;     // a and b broadcast to out's shape (bb unset for a host scalar)
  const T* a;
  const T* b;            // null for a host scalar
  float alpha, value;    // value: alpha * the host scalar
  int64_t n, inner = 0;  // inner: b's length where it repeats over rows
  bool dense_a, dense_b, one_b, rows;
  int sms;
  T* o() const { return static_cast<T*>(out.data); }
};

struct AddPlan {
  tile::MapConfig config{};
  unsigned grid = 0;  // strided and rows tiers
  std::string describe() const {
    if (grid) return std::to_string(grid) + " CTAs of " + std::to_string(tile::kMapThreads) + " threads";
    return std::string(config.vec ? "16-byte vectors" : "single elements") + ", " + std::to_string(config.unroll) +
           " per thread";
  }
};

template <class T>
AddPlan map_plan(const Call<T>& c, int nin) {
  return nin == 2 ? AddPlan{tile::map_config<2>(c.n, c.o(), Inputs<T, 2>{{c.a, c.b}}, c.sms), 0}
                  : AddPlan{tile::map_config<1>(c.n, c.o(), Inputs<T, 1>{{c.a}}, c.sms), 0};
}

template <class T>
struct ScalarTier {
  static constexpr const char* kName = "scalar";
  static constexpr const char* kWhen = "b a host number, a and out dense: b in a register";
  static bool can_implement(const Call<T>& c, int) { return !c.b && c.dense_a; }
  static AddPlan plan(const Call<T>& c, int) { return map_plan(c, 1); }
  static void launch(const Call<T>& c, const AddPlan& p, cudaStream_t s) {
    tile::launch_map_contiguous<1>(c.n, c.o(), Inputs<T, 1>{{c.a}}, AddScalarValue{c.value}, p.config, s);
  }
};

template <class T>
struct ScalarStridedTier {
  static constexpr const char* kName = "scalar_strided";
  static constexpr const char* kWhen = "b a host number, any layout";
  static bool can_implement(const Call<T>& c, int) { return !c.b; }
  static AddPlan plan(const Call<T>& c, int) { return {{}, tile::map_strided_grid(c.n, c.sms)}; }
  static void launch(const Call<T>& c, const AddPlan&, cudaStream_t s) {
    tile::launch_map_strided<1>(c.n, c.o(), Inputs<T, 1>{{c.a}}, runtime::make_indexer<2>({&c.out, &c.ab}),
                                AddScalarValue{c.value}, c.sms, s);
  }
};

template <class T>
struct ContiguousTier {
  static constexpr const char* kName = "contiguous";
  static constexpr const char* kWhen = "a, b and out dense, one shape";
  static bool can_implement(const Call<T>& c, int) { return c.dense_a && c.dense_b; }
  static AddPlan plan(const Call<T>& c, int) { return map_plan(c, 2); }
  static void launch(const Call<T>& c, const AddPlan& p, cudaStream_t s) {
    tile::launch_map_contiguous<2>(c.n, c.o(), Inputs<T, 2>{{c.a, c.b}}, AddOp{c.alpha}, p.config, s);
  }
};

template <class T>
struct OneElementTier {
  static constexpr const char* kName = "one_element";
  static constexpr const char* kWhen = "b one element on the device, a and out dense";
  static bool can_implement(const Call<T>& c, int) { return c.dense_a && c.one_b; }
  static AddPlan plan(const Call<T>& c, int) { return map_plan(c, 1); }
  static void launch(const Call<T>& c, const AddPlan& p, cudaStream_t s) {
    tile::launch_map_contiguous<1>(c.n, c.o(), Inputs<T, 1>{{c.a}}, AddScalarAt<T>{c.b, c.alpha}, p.config, s);
  }
};

template <class T>
struct RowsTier {
  static constexpr const char* kName = "rows";
  static constexpr const char* kWhen = "b dense over the trailing dimensions, repeated over rows";
  static bool vec(const Call<T>& c) {
    constexpr int V = tile::kVec16<T>;
    return c.inner % V == 0 && tile::is_aligned<T, V>(c.a) && tile::is_aligned<T, V>(c.b) && tile::is_aligned<T, V>(c.o());
  }
  static bool can_implement(const Call<T>& c, int) { return c.dense_a && c.rows; }
  static AddPlan plan(const Call<T>& c, int) {
    const int v = vec(c) ? tile::kVec16<T> : 1;
    const long long blocks = (c.n / v + tile::kMapThreads - 1) / tile::kMapThreads;
    return {{vec(c), 1}, static_cast<unsigned>(std::min<long long>(std::max(blocks, 1LL), 16LL * c.sms))};
  }
  static void launch(const Call<T>& c, const AddPlan& p, cudaStream_t s) {
    if (p.config.vec)
      add_rows_kernel<tile::kVec16<T>><<<p.grid, tile::kMapThreads, 0, s>>>(c.a, c.b, c.o(), c.n, c.inner, c.alpha);
    else add_rows_kernel<1><<<p.grid, tile::kMapThreads, 0, s>>>(c.a, c.b, c.o(), c.n, c.inner, c.alpha);
  }
};

template <class T>
struct StridedTier {
  static constexpr const char* kName = "strided";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const Call<T>&, int) { return true; }
  static AddPlan plan(const Call<T>& c, int) { return {{}, tile::map_strided_grid(c.n, c.sms)}; }
  static void launch(const Call<T>& c, const AddPlan&, cudaStream_t s) {
    tile::launch_map_strided<2>(c.n, c.o(), Inputs<T, 2>{{c.a, c.b}},
                                runtime::make_indexer<3>({&c.out, &c.ab, &c.bb}), AddOp{c.alpha}, c.sms, s);
  }
};

template <class T>
void add_typed(const TensorView& a, const TensorView& b, const double* b_value, const TensorView& out,
               float alpha, cudaStream_t s) {
  const int64_t n = out.numel();
  Call<T> c{out, detail::broadcast_to("add", "input", a, out), {}, static_cast<const T*>(a.data), nullptr, alpha, 0.0f, n};
  c.sms = runtime::device_props(out.device.index).multiProcessorCount;
  c.dense_a = a.numel() == n && a.is_contiguous() && out.is_contiguous();
  if (b_value) {
    c.value = static_cast<float>(alpha * *b_value);
    runtime::run_first<ScalarTier<T>, ScalarStridedTier<T>>("add", c, out.device.index, s);
    return;
  }
  c.bb = detail::broadcast_to("add", "other", b, out);
  c.b = static_cast<const T*>(b.data);
  c.dense_b = b.numel() == n && b.is_contiguous();
  c.one_b = b.numel() == 1;
  c.rows = c.dense_a && !c.dense_b && !c.one_b && rows_broadcast(c.bb, b, c.inner);
  runtime::run_first<ContiguousTier<T>, OneElementTier<T>, RowsTier<T>, StridedTier<T>>("add", c, out.device.index, s);
}

void check_add(const TensorView& a, const TensorView* b, const TensorView& out) {
  using namespace detail;
  check_cuda_tensor("add", "input", a);
  check_dtype_in("add", "input", a, {DType::float32, DType::float16, DType::bfloat16});
  if (b) {
    check_cuda_tensor("add", "other", *b);
    check_same_device("add", "other", *b, "input", a);
    check_same_dtype("add", "other", *b, "input", a);
  }
  check_cuda_tensor("add", "out", out);
  check_same_device("add", "out", out, "input", a);
  check_same_dtype("add", "out", out, "input", a);
  TensorView expected = a;
  if (b) expected.ndim = broadcast_shapes("add", "input", a, "other", *b, expected.shape);
  check_same_shape("add", "out", out, "a and b broadcast together", expected);
  check_no_internal_overlap("add", "out", out);
  check_no_overlap("add", "out", out, "input", a, /*allow_identical=*/true);
  if (b) check_no_overlap("add", "out", out, "other", *b, /*allow_identical=*/true);
}

void add_impl(const TensorView& a, const TensorView* b, const double* b_value, const TensorView& out,
              double alpha, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add");
  check_add(a, b, out);
  if (out.numel() == 0) return;
  runtime::DeviceGuard guard(out.device.index);
  const TensorView& bv = b ? *b : a;
  switch (a.dtype) {
    case DType::float32: add_typed<float>(a, bv, b_value, out, static_cast<float>(alpha), stream); break;
    case DType::float16: add_typed<__half>(a, bv, b_value, out, static_cast<float>(alpha), stream); break;
    default: add_typed<__nv_bfloat16>(a, bv, b_value, out, static_cast<float>(alpha), stream); break;
  }
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

void add(const TensorView& a, const TensorView& b, const TensorView& out, double alpha,
         cudaStream_t stream) {
  add_impl(a, &b, nullptr, out, alpha, stream);
}

void add(const TensorView& a, double b, const TensorView& out, double alpha, cudaStream_t stream) {
  add_impl(a, nullptr, &b, out, alpha, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// add's two overloads, named apart.
constexpr void (*kAddTensor)(const TensorView&, const TensorView&, const TensorView&, double, cudaStream_t) = &add;
constexpr void (*kAddScalar)(const TensorView&, double, const TensorView&, double, cudaStream_t) = &add;
// The output takes the broadcast shape. Autograd is written by hand (python/src/torch/
// elementwise.cpp): a broadcast input's gradient is summed back to its shape, by torch's ops.
const OpRegistrar kAdd = describe("add", "elementwise", "out = input + alpha * other with broadcasting")
    .schema("add(Tensor input, Tensor other, *, float alpha=1) -> Tensor")
    .kernel<kAddTensor>({"input", "other", "out", "alpha"}, {out::broadcast("out", "input", "other")})
    .overload(describe("add.Scalar", "elementwise", "out = input + alpha * other for a number other")
                  .schema("add.Scalar(Tensor input, float other, *, float alpha=1) -> Tensor")
                  .kernel<kAddScalar>({"input", "other", "out", "alpha"}, {{"out", "input"}}))
    .torch("torch.add");
}  // namespace
}  // namespace tessera
