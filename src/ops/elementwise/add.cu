// add: out = a + alpha * b, with torch's broadcasting.
//
// Bytes: 3 * n * sizeof(T) for same-shape tensors (two reads, one write), 2 * n * sizeof(T) when b
// is a scalar. No FLOP worth counting: the kernel is memory-bound and its target is the copy
// bandwidth. Paths, fastest first: all dense (vectorized map), b a scalar (vectorized map with b
// in a register), b dense over the trailing dimensions (rows kernel below), anything else
// (strided map).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/map.cuh"

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

template <class T>
void launch_rows(const T* a, const T* b, T* out, int64_t n, int64_t inner, float alpha, int sms,
                 cudaStream_t s) {
  constexpr int V = tile::kVec16<T>;
  const bool vec = inner % V == 0 && tile::is_aligned<T, V>(a) && tile::is_aligned<T, V>(b) &&
                   tile::is_aligned<T, V>(out);
  const int v = vec ? V : 1;
  const long long blocks = (n / v + tile::kMapThreads - 1) / tile::kMapThreads;
  const auto grid = static_cast<unsigned>(std::min<long long>(std::max(blocks, 1LL), 16LL * sms));
  if (vec) add_rows_kernel<V><<<grid, tile::kMapThreads, 0, s>>>(a, b, out, n, inner, alpha);
  else add_rows_kernel<1><<<grid, tile::kMapThreads, 0, s>>>(a, b, out, n, inner, alpha);
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

template <class T>
void add_typed(const TensorView& a, const TensorView& b, const double* b_value, const TensorView& out,
               float alpha, cudaStream_t s) {
  const int64_t n = out.numel();
  const int sms = runtime::device_props(out.device.index).multiProcessorCount;
  auto* o = static_cast<T*>(out.data);
  const TensorView ab = detail::broadcast_to("add", "a", a, out);
  const auto* pa = static_cast<const T*>(a.data);
  const bool dense_a = a.numel() == n && a.is_contiguous() && out.is_contiguous();

  if (b_value) {
    const AddScalarValue f{static_cast<float>(alpha * *b_value)};
    if (dense_a) {
      tile::launch_map_contiguous<1>(n, o, Inputs<T, 1>{{pa}}, f, sms, s);
    } else {
      auto idx = runtime::make_indexer<2>({&out, &ab});
      tile::launch_map_strided<1>(n, o, Inputs<T, 1>{{pa}}, idx, f, sms, s);
    }
    return;
  }
  const TensorView bb = detail::broadcast_to("add", "b", b, out);
  const auto* pb = static_cast<const T*>(b.data);
  int64_t inner = 0;
  if (dense_a && b.numel() == n && b.is_contiguous()) {
    tile::launch_map_contiguous<2>(n, o, Inputs<T, 2>{{pa, pb}}, AddOp{alpha}, sms, s);
  } else if (dense_a && b.numel() == 1) {
    tile::launch_map_contiguous<1>(n, o, Inputs<T, 1>{{pa}}, AddScalarAt<T>{pb, alpha}, sms, s);
  } else if (dense_a && rows_broadcast(bb, b, inner)) {
    launch_rows(pa, pb, o, n, inner, alpha, sms, s);
  } else {
    auto idx = runtime::make_indexer<3>({&out, &ab, &bb});
    tile::launch_map_strided<2>(n, o, Inputs<T, 2>{{pa, pb}}, idx, AddOp{alpha}, sms, s);
  }
}

void check_add(const TensorView& a, const TensorView* b, const TensorView& out) {
  using namespace detail;
  check_cuda_tensor("add", "a", a);
  check_dtype_in("add", "a", a, {DType::float32, DType::float16, DType::bfloat16});
  if (b) {
    check_cuda_tensor("add", "b", *b);
    check_same_device("add", "b", *b, "a", a);
    check_same_dtype("add", "b", *b, "a", a);
  }
  check_cuda_tensor("add", "out", out);
  check_same_device("add", "out", out, "a", a);
  check_same_dtype("add", "out", out, "a", a);
  TensorView expected = a;
  if (b) expected.ndim = broadcast_shapes("add", a, *b, expected.shape);
  check_same_shape("add", "out", out, "a and b broadcast together", expected);
  check_no_internal_overlap("add", "out", out);
  check_no_overlap("add", "out", out, "a", a, /*allow_identical=*/true);
  if (b) check_no_overlap("add", "out", out, "b", *b, /*allow_identical=*/true);
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
