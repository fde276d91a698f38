// Seeded inverted dropout, forward and backward, on Philox4x32-10.
//
// Element i (row-major logical index) draws word i % 4 of Philox(counter = offset + i / 4,
// key = seed) and is kept when its top 24 bits, as a uniform in [0, 1), are >= p; kept elements
// are multiplied by scale = 1 / (1 - p). The mask is a pure function of (seed, offset, i), so it
// is never stored: the backward pass regenerates it, and the result does not depend on the launch
// shape, the layout or the GPU.
//
// Bytes: 2n * sizeof(T) each way (x in, out out). One Philox call serves 4 elements: one per
// 16-byte vector of float32, two per vector of 8 half-type elements. A call is ~40 integer
// instructions (19 wide multiplies, 20 three-input XORs), ~10 per element, and bf16 at copy
// bandwidth leaves ~30 issue slots per element, so the rest is kept lean: the keep test is one
// unsigned compare against a host-computed threshold (philox.cuh), the round keys are operands
// from the constant bank, and half types convert in pairs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <charconv>
#include <string>
#include <type_traits>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/indexing.cuh"
#include "tile/philox.cuh"
#include "tile/vec.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

constexpr int kThreads = 256;

struct DropoutParams {
  tile::PhiloxKeys keys;  // schedule of key = seed
  uint64_t offset;        // counter of elements 0..3
  uint32_t threshold;     // keep when the word is >= threshold ...
  bool keep_any;          // ... and p < 1 (p = 1 has no 32-bit threshold)
  float scale;            // 1 / (1 - p), rounded to float once
};

__device__ __forceinline__ float drop(float x, uint32_t word, const DropoutParams& prm) {
  const bool keep = prm.keep_any && word >= prm.threshold;
  return keep ? x * prm.scale : 0.0f;
}

// Half types convert two at a time: one instruction per element in, one packing convert per
// pair out, about half of what element-wise conversion costs; at 8 elements per 16-byte vector
// those instructions are a noticeable share of the bf16 budget. p points into a Vec, aligned to
// at least two elements.
__device__ __forceinline__ float2 load_pair(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
// bf16 is the upper half of a float32: a shift for the low element and a mask for the high one
// (the library conversion extracts the high element and then shifts it).
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  const uint32_t b = *reinterpret_cast<const uint32_t*>(p);
  return make_float2(__uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
}
__device__ __forceinline__ void store_pair(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// y[0..3] = dropout of x[0..3] with the four words of one Philox call. x and y are 4 elements of
// a Vec (aligned to at least two elements).
template <class T>
__device__ __forceinline__ void drop4(const T* x, T* y, uint4 w, const DropoutParams& prm) {
  if constexpr (std::is_same_v<T, float>) {
    y[0] = drop(x[0], w.x, prm);
    y[1] = drop(x[1], w.y, prm);
    y[2] = drop(x[2], w.z, prm);
    y[3] = drop(x[3], w.w, prm);
  } else {
    const float2 a = load_pair(x), b = load_pair(x + 2);
    store_pair(y, drop(a.x, w.x, prm), drop(a.y, w.y, prm));
    store_pair(y + 2, drop(b.x, w.z, prm), drop(b.y, w.w, prm));
  }
}

// Elements [i, i + V) of a dense tensor, i a multiple of V and V a multiple of 4, so every group
// of 4 that one Philox call serves lies inside one thread's vector. kVector: x and out allow
// 16-byte accesses; otherwise the elements move one by one (a view that starts off alignment).
// kFull: all V elements are in bounds.
template <int V, bool kVector, bool kFull, class T>
__device__ __forceinline__ tile::Vec<T, V> load_group(const T* x, int64_t i, int64_t n) {
  if constexpr (kFull && kVector) return tile::load<V>(x + i);
  else return tile::load_masked<V>(x + i, kFull ? V : static_cast<int>(n - i < V ? n - i : V), T{});
}

template <int V, bool kVector, bool kFull, class T>
__device__ __forceinline__ void store_group(T* out, int64_t i, int64_t n, const tile::Vec<T, V>& v) {
  if constexpr (kFull && kVector) tile::store<V>(out + i, v);
  else tile::store_masked<V>(out + i, v, kFull ? V : static_cast<int>(n - i < V ? n - i : V));
}

// One block's UNROLL x kThreads x V elements from `base`. The generator does not depend on the
// loads, so its arithmetic overlaps their latency. x and out may be the same memory (in-place use,
// hence no __restrict__): every element is read before the same thread writes it.
template <int V, int UNROLL, bool kVector, bool kFull, class T>
__device__ __forceinline__ void dropout_block(const T* x, T* out, int64_t base, int64_t n,
                                              const DropoutParams& prm) {
  tile::Vec<T, V> v[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t i = base + static_cast<int64_t>(u * kThreads + threadIdx.x) * V;
    if (kFull || i < n) v[u] = load_group<V, kVector, kFull>(x, i, n);
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t i = base + static_cast<int64_t>(u * kThreads + threadIdx.x) * V;
    if (!kFull && i >= n) break;
    const uint64_t counter = prm.offset + static_cast<uint64_t>(i) / 4;
    tile::Vec<T, V> r;
#pragma unroll
    for (int g = 0; g < V / 4; ++g)
      drop4(v[u].v + 4 * g, r.v + 4 * g, tile::philox4x32_10(tile::philox_counter(counter + g), prm.keys), prm);
    store_group<V, kVector, kFull>(out, i, n, r);
  }
}

// Dense path. Only the last block can be partial; every other one runs without bounds checks,
// which also lets half-type vectors stay packed in registers from load to store.
template <int V, int UNROLL, bool kVector, class T>
__global__ __launch_bounds__(kThreads) void dropout_dense_kernel(const T* x, T* out, int64_t n,
                                                                 const DropoutParams prm) {
  static_assert(V % 4 == 0, "one Philox call per 4 elements");
  constexpr int64_t kPerBlock = int64_t(kThreads) * UNROLL * V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPerBlock;
  if (base + kPerBlock <= n) dropout_block<V, UNROLL, kVector, true>(x, out, base, n, prm);
  else dropout_block<V, UNROLL, kVector, false>(x, out, base, n, prm);
}

// General layout: one thread per group of 4 consecutive logical indices (one Philox call); idx
// holds out's strides in slot 0 and x's in slot 1.
template <class T>
__global__ __launch_bounds__(kThreads) void dropout_strided_kernel(const T* x, T* out, int64_t n,
                                                                   tile::StridedIndexer<2> idx,
                                                                   const DropoutParams prm) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int valid = n - 4 * g < 4 ? static_cast<int>(n - 4 * g) : 4;
    int64_t off[4][2];
    tile::Vec<T, 4> v, r;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = T{};
      if (e < valid) {
        idx.offsets(4 * g + e, off[e]);
        v[e] = x[off[e][1]];
      }
    }
    const uint64_t counter = prm.offset + static_cast<uint64_t>(g);
    drop4(v.v, r.v, tile::philox4x32_10(tile::philox_counter(counter), prm.keys), prm);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < valid) out[off[e][0]] = r[e];
  }
}

template <int V, int UNROLL, bool kVector, class T>
void launch_dense(const T* x, T* out, int64_t n, const DropoutParams& prm, cudaStream_t stream) {
  constexpr int64_t per_block = int64_t(kThreads) * UNROLL * V;
  const auto grid = static_cast<unsigned>((n + per_block - 1) / per_block);
  dropout_dense_kernel<V, UNROLL, kVector><<<grid, kThreads, 0, stream>>>(x, out, n, prm);
}

// One call as the tiers see it: `in` is x or grad_out, `out` is out or grad_in.
struct Call {
  const TensorView& in;
  const TensorView& out;
  float p;
  const DropoutParams& prm;
};

struct DropPlan {
  bool vectors = false;     // dense tier: 16-byte vectors (both tensors aligned) or single elements
  int vec = 0, unroll = 0;  // dense tier: elements per vector (or per group), groups per thread
  unsigned grid = 0;        // strided tier
  std::string describe() const {
    if (grid) return std::to_string(grid) + " CTAs of " + std::to_string(kThreads) + " threads";
    return std::to_string(vec) + (vectors ? "-element vectors, " : " single elements (misaligned), ") +
           std::to_string(unroll) + " per thread";
  }
};

// Every uniform is >= 0: p that rounds to 0 keeps everything with scale 1, a copy.
struct CopyTier {
  static constexpr const char* kName = "copy";
  static constexpr const char* kWhen = "p rounds to 0 in float32: nothing is dropped";
  static bool can_implement(const Call& c, int) { return c.p == 0.0f; }
  static DropPlan plan(const Call&, int) { return {}; }
  static void launch(const Call& c, const DropPlan&, cudaStream_t s) { copy(c.in, c.out, s); }
};

template <class F>
void with_type(DType dt, F&& f) {
  switch (dt) {
    case DType::float32: return f(float{});
    case DType::float16: return f(__half{});
    default: return f(__nv_bfloat16{});
  }
}

// One vector per thread for float32, two for 16-bit types once the grid covers the GPU 4 times
// over: more vectors per thread make CTAs long enough that the partial last wave costs more than
// the extra bytes in flight gain. Misaligned tensors: 4 single elements,
// twice.
struct DenseTier {
  static constexpr const char* kName = "dense";
  static constexpr const char* kWhen = "both tensors contiguous";
  static bool can_implement(const Call& c, int) { return c.in.is_contiguous() && c.out.is_contiguous(); }
  static DropPlan plan(const Call& c, int device) {
    const int64_t n = c.out.numel();
    const int sms = runtime::device_props(device).multiProcessorCount;
    const int size = static_cast<int>(dtype_size(c.out.dtype)), V = 16 / size;
    const bool aligned = reinterpret_cast<uintptr_t>(c.in.data) % 16 == 0 && reinterpret_cast<uintptr_t>(c.out.data) % 16 == 0;
    if (!aligned) return {false, 4, 2, 0};
    const bool large = n >= int64_t(kThreads) * 2 * V * 4 * sms;
    return {true, V, size == 2 && large ? 2 : 1, 0};
  }
  static void launch(const Call& c, const DropPlan& p, cudaStream_t s) {
    with_type(c.out.dtype, [&](auto type) {
      using T = decltype(type);
      constexpr int V = tile::kVec16<T>;
      const auto* x = static_cast<const T*>(c.in.data);
      auto* o = static_cast<T*>(c.out.data);
      const int64_t n = c.out.numel();
      if (!p.vectors) launch_dense<4, 2, false>(x, o, n, c.prm, s);
      else if (p.unroll == 2) launch_dense<V, 2, true>(x, o, n, c.prm, s);
      else launch_dense<V, 1, true>(x, o, n, c.prm, s);
    });
  }
};

struct StridedTier {
  static constexpr const char* kName = "strided";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const Call&, int) { return true; }
  static DropPlan plan(const Call& c, int device) {
    const int64_t blocks = runtime::ceil_div(runtime::ceil_div(c.out.numel(), 4), kThreads);
    const int64_t cap = 32LL * runtime::device_props(device).multiProcessorCount;
    return {false, 0, 0, static_cast<unsigned>(blocks < cap ? blocks : cap)};
  }
  static void launch(const Call& c, const DropPlan& p, cudaStream_t s) {
    with_type(c.out.dtype, [&](auto type) {
      using T = decltype(type);
      dropout_strided_kernel<<<p.grid, kThreads, 0, s>>>(static_cast<const T*>(c.in.data), static_cast<T*>(c.out.data),
                                                         c.out.numel(), runtime::make_indexer<2>({&c.out, &c.in}), c.prm);
    });
  }
};

void check_p(const char* op, double p) {
  if (p >= 0.0 && p <= 1.0) return;  // NaN fails too
  char buf[32];  // shortest form that reads back as p ("-0.1", "nan"), as Python prints it
  const auto end = std::to_chars(buf, buf + sizeof buf, p).ptr;
  detail::throw_arg(ErrorKind::value, op, "p", "a probability in [0, 1]", std::string(buf, end));
}

// Checks shared by both directions: `in` is x or grad_out, `out` is out or grad_in.
void check_args(const char* op, const char* in_arg, const TensorView& in, const char* out_arg,
                const TensorView& out, double p) {
  detail::check_cuda_tensor(op, in_arg, in);
  detail::check_dtype_in(op, in_arg, in, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, out_arg, out, in_arg, in);
  detail::check_no_internal_overlap(op, out_arg, out);
  detail::check_no_overlap(op, out_arg, out, in_arg, in, /*allow_identical=*/true);
  check_p(op, p);
}

void launch(const char* op, const TensorView& in, const TensorView& out, double p, uint64_t seed,
            uint64_t offset, cudaStream_t stream) {
  if (out.numel() == 0) return;
  const auto pf = static_cast<float>(p);
  DropoutParams prm{};
  prm.keys = tile::philox_key_schedule(seed);
  prm.offset = offset;
  prm.keep_any = pf < 1.0f;  // every uniform is < 1: p that rounds to 1 drops everything
  prm.threshold = prm.keep_any ? tile::philox_uniform_threshold(pf) : 0u;
  prm.scale = prm.keep_any ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  runtime::DeviceGuard guard(out.device.index);
  runtime::run_first<CopyTier, DenseTier, StridedTier>(op, Call{in, out, pf, prm}, out.device.index, stream);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

void dropout(const TensorView& x, const TensorView& out, double p, uint64_t seed, uint64_t offset,
             cudaStream_t stream) {
  runtime::NvtxRange range("tessera::dropout");
  check_args("dropout", "input", x, "out", out, p);
  launch("dropout", x, out, p, seed, offset, stream);
}

void dropout_backward(const TensorView& grad_out, const TensorView& grad_in, double p,
                      uint64_t seed, uint64_t offset, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::dropout_backward");
  check_args("dropout_backward", "grad_output", grad_out, "out", grad_in, p);
  // d out / d x is the forward's mask times scale: the same map applied to grad_out.
  launch("dropout_backward", grad_out, grad_in, p, seed, offset, stream);
}

uint64_t dropout_offset_increment(int64_t numel) {
  if (numel < 0)
    detail::throw_arg(ErrorKind::value, "dropout_offset_increment", "numel", "numel >= 0",
                      std::to_string(numel));
  return (static_cast<uint64_t>(numel) + 3) / 4;
}

}  // namespace tessera

namespace tessera {
namespace {
// seed and offset are uint64 to the library: the schema's int carries their bits.
const OpRegistrar kDropout = describe("dropout", "elementwise", "seeded inverted dropout: x * mask(seed, offset) / (1 - p)")
    .schema("dropout(Tensor input, float p, int seed, int offset) -> Tensor")
    .kernel<&dropout>({"input", "out", "p", "seed", "offset"}, {{"out", "input"}})
    .differentiable("dropout_backward", {"grad", "p", "seed", "offset"}, {"input"});
const OpRegistrar kDropoutBackward = describe("dropout_backward", "elementwise", "seeded dropout backward: grad_out * mask(seed, offset) / (1 - p)")
    .schema("dropout_backward(Tensor grad_output, float p, int seed, int offset) -> Tensor")
    .kernel<&dropout_backward>({"grad_output", "out", "p", "seed", "offset"}, {{"out", "grad_output"}});
}  // namespace
}  // namespace tessera
