// Tile layer: indexers (CPU), reductions and masked vector access (GPU), and the packed fragment
// (tile/frag.cuh: packing, unpacking and rounding, windowed, hinted and streaming loads and stores,
// row_lead, frag_max, the register-pressure helpers) against host-side expectations. Reductions over groups, clusters and
// the row accumulators (tile/reduce.cuh, tile/row.cuh) are in tile_row_test.cu.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "gpu.hpp"
#include "runtime/check.hpp"
#include "runtime/layout.hpp"
#include "runtime/memory.hpp"
#include "tile/frag.cuh"
#include "tile/indexing.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"
#include "tile_testing.hpp"

namespace {

using tessera::TensorView;
using namespace tessera::tile_testing;
namespace tile = tessera::tile;

TEST(TileIndexing, OffsetsFollowStrides) {
  tessera::tile::StridedIndexer<2> idx{};
  idx.ndim = 3;
  const int64_t shape[3] = {2, 3, 4};
  const int64_t s0[3] = {12, 4, 1}, s1[3] = {1, 2, 6};  // row-major, and a permuted layout
  for (int d = 0; d < 3; ++d) {
    idx.shape[d] = shape[d];
    idx.strides[0][d] = s0[d];
    idx.strides[1][d] = s1[d];
  }
  for (int64_t i = 0; i < 24; ++i) {
    int64_t off[2];
    idx.offsets(i, off);
    const int64_t c0 = i / 12, c1 = (i / 4) % 3, c2 = i % 4;
    EXPECT_EQ(off[0], i);
    EXPECT_EQ(off[1], c0 * 1 + c1 * 2 + c2 * 6);
  }
}

TEST(TileIndexing, MakeIndexerMergesContiguousDims) {
  auto a = TensorView::contiguous(nullptr, tessera::DType::float32, {4, 1, 5, 6});
  auto b = TensorView::strided(nullptr, tessera::DType::float32, {4, 1, 5, 6}, {0, 7, 6, 1});
  auto idx = tessera::runtime::make_indexer<2>({&a, &b});
  // The size-1 dim drops; (5, 6) merge in both views; 4 stays apart (b broadcasts it).
  ASSERT_EQ(idx.ndim, 2);
  EXPECT_EQ(idx.shape[0], 4);
  EXPECT_EQ(idx.shape[1], 30);
  EXPECT_EQ(idx.strides[1][0], 0);
  auto t = TensorView::strided(nullptr, tessera::DType::float32, {5, 6}, {1, 5});
  auto c = TensorView::contiguous(nullptr, tessera::DType::float32, {5, 6});
  EXPECT_EQ((tessera::runtime::make_indexer<2>({&c, &t}).ndim), 2);  // transposed: no merge
}

__global__ void reduce_kernel(const float* in, float* sums, float* maxes, int n) {
  __shared__ float scratch[32];
  float s = 0, m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    s += in[i];
    m = fmaxf(m, in[i]);
  }
  const float bs = tessera::tile::block_sum(s, scratch);
  const float bm = tessera::tile::block_reduce(m, tessera::tile::Max{}, -INFINITY, scratch);
  sums[threadIdx.x] = bs;  // every thread must see the result
  maxes[threadIdx.x] = bm;
}

TEST(TileGpu, BlockReductionsGiveEveryThreadTheResult) {
  TESSERA_REQUIRE_GPU();
  const int n = 5000;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>((i * 37) % 101) - 50.0f;  // integers: exact sums
  const float want_sum = std::accumulate(h.begin(), h.end(), 0.0f);
  const float want_max = *std::max_element(h.begin(), h.end());
  tessera::runtime::DeviceBuffer in(n * sizeof(float)), sums(1024 * sizeof(float)), maxes(1024 * sizeof(float));
  TESSERA_CUDA_CHECK(cudaMemcpy(in.data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  for (int threads : {32, 96, 256, 1024}) {
    reduce_kernel<<<1, threads>>>(static_cast<float*>(in.data()), static_cast<float*>(sums.data()),
                                  static_cast<float*>(maxes.data()), n);
    TESSERA_LAUNCH_CHECK();
    std::vector<float> s(threads), m(threads);
    TESSERA_CUDA_CHECK(cudaMemcpy(s.data(), sums.data(), threads * sizeof(float), cudaMemcpyDeviceToHost));
    TESSERA_CUDA_CHECK(cudaMemcpy(m.data(), maxes.data(), threads * sizeof(float), cudaMemcpyDeviceToHost));
    for (int t = 0; t < threads; ++t) {
      ASSERT_EQ(s[t], want_sum) << "threads=" << threads << " t=" << t;
      ASSERT_EQ(m[t], want_max) << "threads=" << threads << " t=" << t;
    }
  }
}

// Copies n floats through load_tile/store_tile in vectors of 4.
__global__ void copy_kernel(const float* in, float* out, int64_t n) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4;
  tessera::tile::store_tile<4>(out, i, n, tessera::tile::load_tile<4>(in, i, n));
}

TEST(TileGpu, MaskedVectorAccessStopsAtTheEnd) {
  TESSERA_REQUIRE_GPU();
  for (int64_t n : {1, 3, 4, 5, 127, 1001}) {
    std::vector<float> h(n + 8);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i + 1);
    tessera::runtime::DeviceBuffer in(h.size() * sizeof(float)), out(h.size() * sizeof(float));
    TESSERA_CUDA_CHECK(cudaMemcpy(in.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    poison(out);
    copy_kernel<<<static_cast<unsigned>((n + 255) / 256), 64>>>(static_cast<float*>(in.data()),
                                                                static_cast<float*>(out.data()), n);
    TESSERA_LAUNCH_CHECK();
    std::vector<uint32_t> r(h.size());
    TESSERA_CUDA_CHECK(cudaMemcpy(r.data(), out.data(), r.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < static_cast<int64_t>(h.size()); ++i) {
      if (i < n) {
        float v;
        std::memcpy(&v, &r[i], 4);
        ASSERT_EQ(v, h[i]) << "n=" << n << " i=" << i;
      } else {
        ASSERT_EQ(r[i], 0xFFFFFFFFu) << "n=" << n << " wrote past the end at " << i;
      }
    }
  }
}

// ---- Frag: packing, rounding, splats -----------------------------------------------------------
// Thread i packs floats [i V, i V + V) with pack and with pack_each, and reports every element
// through operator[] and element_bits, and the fragment through store_frag.
template <class T, int V>
__global__ void pack_kernel(const float* in, int nfrag, float* as_float, uint32_t* bits, uint32_t* bits_each,
                            T* stored) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nfrag) return;
  float v[V];
  for (int e = 0; e < V; ++e) v[e] = in[i * V + e];
  const tile::Frag<T, V> f = tile::pack<T, V>(v), g = tile::pack_each<T, V>(v);
  for (int e = 0; e < V; ++e) {
    as_float[i * V + e] = f[e];
    bits[i * V + e] = elem_bits(f, e);
    bits_each[i * V + e] = elem_bits(g, e);
  }
  tile::store_frag<T, V>(stored + i * V, f);
}

// Values that round in every way: ties to even, subnormals of each type, overflow to inf, inf, NaN.
std::vector<float> rounding_inputs() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3, -2.5f, 65504.0f, 65519.0f, 65520.0f,
                          70000.0f, 1e-8f, 6e-8f, 2.98023224e-8f, 8.9e-8f, 1e-5f, 3e38f,
                          std::numeric_limits<float>::max(), 1e-40f, INFINITY, -INFINITY, NAN,
                          1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f,
                          -(1.0f + 0x1p-8f), 256.5f, 257.0f, 2049.0f, 2051.0f};
  Lcg rng{7};
  while (v.size() < 512) {
    const float m = rng.uniform(1.0f, 2.0f);
    const float x = std::ldexp(m, rng.integer(-30, 20));
    v.push_back(rng.next() & 1 ? -x : x);
  }
  return v;
}

template <class T, int V>
void check_pack() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  const std::vector<float> x = rounding_inputs();
  const int n = static_cast<int>(x.size()), nfrag = n / V;
  DeviceBuffer in = to_device(x), as_float(n * 4), bits(n * 4), bits_each(n * 4), stored(n * sizeof(T));
  pack_kernel<T, V><<<(nfrag + 127) / 128, 128>>>(ptr<float>(in), nfrag, ptr<float>(as_float),
                                                  ptr<uint32_t>(bits), ptr<uint32_t>(bits_each), ptr<T>(stored));
  TESSERA_LAUNCH_CHECK();
  const auto f = from_device<float>(as_float, n);
  const auto b = from_device<uint32_t>(bits, n), be = from_device<uint32_t>(bits_each, n);
  const auto st = element_bits_of<T>(stored, n);
  for (int i = 0; i < n; ++i) {
    const uint32_t want = host_bits<T>(x[i]);
    if (std::isnan(x[i])) {  // NaN stays NaN (its payload may be canonicalized)
      EXPECT_TRUE(std::isnan(host_float<T>(b[i])) && std::isnan(host_float<T>(be[i])) &&
                  std::isnan(host_float<T>(st[i])) && std::isnan(f[i]))
          << "i=" << i;
      continue;
    }
    EXPECT_EQ(b[i], want) << "pack of " << x[i] << " (i=" << i << ")";
    EXPECT_EQ(be[i], want) << "pack_each of " << x[i] << " (i=" << i << ")";
    EXPECT_EQ(st[i], want) << "stored element " << i;
    EXPECT_EQ(float_bits(f[i]), float_bits(host_float<T>(want))) << "operator[] of " << x[i] << " (i=" << i << ")";
  }
}

TEST(TileFrag, PackRoundsLikeTheHostAndRoundTrips) {
  TESSERA_REQUIRE_GPU();
  check_pack<float, 1>();
  check_pack<float, 4>();
  check_pack<__half, 1>();
  check_pack<__half, 8>();
  check_pack<__nv_bfloat16, 1>();
  check_pack<__nv_bfloat16, 8>();
}

// Thread i: splat(x[i]) and splat_bits(b[i]), every element; thread 0 also neg_inf_bits.
template <class T, int V>
__global__ void splat_kernel(const float* x, const uint32_t* b, int n, uint32_t* splat_out, float* bits_out,
                             uint32_t* neg_inf) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) *neg_inf = tile::neg_inf_bits<T>();
  if (i >= n) return;
  const tile::Frag<T, V> f = tile::splat<T, V>(x[i]), g = tile::splat_bits<T, V>(b[i]);
  for (int e = 0; e < V; ++e) {
    splat_out[i * V + e] = elem_bits(f, e);
    bits_out[i * V + e] = g[e];
  }
}

template <class T, int V>
void check_splat() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  std::vector<float> x = rounding_inputs();
  x.erase(std::remove_if(x.begin(), x.end(), [](float v) { return std::isnan(v); }), x.end());
  const int n = static_cast<int>(x.size());
  std::vector<uint32_t> b(n);
  for (int i = 0; i < n; ++i) b[i] = host_bits<T>(x[i]);
  DeviceBuffer dx = to_device(x), db = to_device(b), s(n * V * 4), g(n * V * 4), ni(4);
  splat_kernel<T, V><<<(n + 127) / 128, 128>>>(ptr<float>(dx), ptr<uint32_t>(db), n, ptr<uint32_t>(s), ptr<float>(g),
                                               ptr<uint32_t>(ni));
  TESSERA_LAUNCH_CHECK();
  const auto sv = from_device<uint32_t>(s, n * V);
  const auto gv = from_device<float>(g, n * V);
  EXPECT_EQ(from_device<uint32_t>(ni, 1)[0], host_bits<T>(-INFINITY));
  for (int i = 0; i < n; ++i)
    for (int e = 0; e < V; ++e) {
      ASSERT_EQ(sv[i * V + e], b[i]) << "splat(" << x[i] << ") element " << e;
      ASSERT_EQ(float_bits(gv[i * V + e]), float_bits(host_float<T>(b[i]))) << "splat_bits of " << x[i] << " element " << e;
    }
}

TEST(TileFrag, SplatAndNegInfBits) {
  TESSERA_REQUIRE_GPU();
  check_splat<float, 1>();
  check_splat<float, 4>();
  check_splat<__half, 1>();
  check_splat<__half, 8>();
  check_splat<__nv_bfloat16, 1>();
  check_splat<__nv_bfloat16, 8>();
}

// ---- windowed loads and stores, row_lead -------------------------------------------------------
// Case i = (c, lo, hi): load_frag_window from `frame` (2V elements), and store_frag_window of
// src[c, c + V) into case i's own region of 4V poisoned elements, whose frame starts V in (the
// V on each side catch stray writes).
template <class T, int V>
__global__ void window_kernel(const T* frame, const T* src, const int* cases, int ncases, uint32_t fill,
                              uint32_t* loaded, T* regions) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ncases) return;
  const int c = cases[3 * i], lo = cases[3 * i + 1], hi = cases[3 * i + 2];
  const tile::Frag<T, V> f = tile::load_frag_window<T, V>(frame, c, lo, hi, fill);
  for (int e = 0; e < V; ++e) loaded[i * V + e] = elem_bits(f, e);
  tile::store_frag_window<T, V>(regions + i * 4 * V + V, c, lo, hi, tile::load_frag<T, V>(src + c));
}

template <class T, int V>
__global__ void lead_kernel(const T* base, int n, int* lead) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) lead[i] = tile::row_lead<V>(base + i);
}

template <class T, int V>
void check_window() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  const uint32_t base = sizeof(T) == 4 ? 0x3f800000u : 0x3c00u;  // 1.0, then distinct finite values
  std::vector<uint32_t> frame(2 * V), src(2 * V);
  for (int j = 0; j < 2 * V; ++j) frame[j] = base + 1 + j, src[j] = base + 101 + j;
  std::vector<int> cases;
  for (int c = 0; c < 2 * V; c += V)
    for (int lo = -1; lo <= 2 * V; ++lo)
      for (int hi = lo; hi <= 2 * V + 1; ++hi) cases.insert(cases.end(), {c, lo, hi});
  const int n = static_cast<int>(cases.size() / 3);
  const uint32_t fill = host_bits<T>(-3.0f);
  DeviceBuffer dframe = device_elements<T>(frame), dsrc = device_elements<T>(src), dcases = to_device(cases);
  DeviceBuffer loaded(n * V * 4), regions(n * 4 * V * sizeof(T));
  poison(regions);
  window_kernel<T, V><<<(n + 127) / 128, 128>>>(ptr<T>(dframe), ptr<T>(dsrc), ptr<int>(dcases), n, fill,
                                                ptr<uint32_t>(loaded), ptr<T>(regions));
  TESSERA_LAUNCH_CHECK();
  const auto ld = from_device<uint32_t>(loaded, n * V);
  const auto rg = element_bits_of<T>(regions, n * 4 * V);
  for (int i = 0; i < n; ++i) {
    const int c = cases[3 * i], lo = cases[3 * i + 1], hi = cases[3 * i + 2];
    for (int e = 0; e < V; ++e) {
      const int col = c + e;
      ASSERT_EQ(ld[i * V + e], col >= lo && col < hi ? frame[col] : fill)
          << "load c=" << c << " lo=" << lo << " hi=" << hi << " e=" << e;
    }
    for (int j = 0; j < 4 * V; ++j) {
      const int col = j - V;
      const bool written = col >= c && col < c + V && col >= lo && col < hi;
      ASSERT_EQ(rg[i * 4 * V + j], written ? src[col] : poison_bits<T>())
          << "store c=" << c << " lo=" << lo << " hi=" << hi << " frame column " << col;
    }
  }
  const int nl = 4 * V + 3;
  DeviceBuffer lead(nl * 4);
  lead_kernel<T, V><<<1, 128>>>(ptr<T>(dframe), nl, ptr<int>(lead));  // dframe: cudaMalloc'd, aligned
  TESSERA_LAUNCH_CHECK();
  const auto lv = from_device<int>(lead, nl);
  for (int i = 0; i < nl; ++i) EXPECT_EQ(lv[i], V == 1 ? 0 : i % V) << "row_lead at element offset " << i;
}

TEST(TileFrag, WindowedAccessAndRowLead) {
  TESSERA_REQUIRE_GPU();
  check_window<float, 1>();
  check_window<float, 4>();
  check_window<__half, 1>();
  check_window<__half, 8>();
  check_window<__nv_bfloat16, 1>();
  check_window<__nv_bfloat16, 8>();
}

// ---- frag_max ----------------------------------------------------------------------------------
constexpr int kMaxU = 3;

template <class T, int V>
__global__ void frag_max_kernel(const T* in, const float* m, int ncases, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ncases) return;
  tile::Frag<T, V> f[kMaxU];
  for (int u = 0; u < kMaxU; ++u) f[u] = tile::load_frag<T, V>(in + (i * kMaxU + u) * V);
  out[i] = tile::frag_max(f, m[i]);
}

template <class T, int V>
void check_frag_max() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  constexpr int kPer = kMaxU * V;
  const int n = 96;
  Lcg rng{11};
  std::vector<uint32_t> bits(n * kPer);
  std::vector<float> m(n), want(n);
  for (int i = 0; i < n; ++i) {
    const int kind = i % 8, at = (i / 8) % kPer;
    m[i] = kind == 1 ? 1000.0f : -INFINITY;
    for (int j = 0; j < kPer; ++j) {
      float x = kind == 7 ? -rng.uniform(1.0f, 100.0f) : rng.uniform(-100.0f, 100.0f);
      if ((kind == 2 && j == at) || (kind == 3 && j % 2 == 0) || kind == 4) x = NAN;
      if (kind == 5 || (kind == 6 && j % 2 == 1)) x = -INFINITY;
      if (kind == 6 && j % 2 == 0) x = NAN;
      if (kind == 7 && j == at) x = -INFINITY;
      bits[i * kPer + j] = host_bits<T>(x);
    }
    float r = m[i];  // fmaxf's rule: NaN operands are skipped
    for (int j = 0; j < kPer; ++j) r = std::fmax(r, host_float<T>(bits[i * kPer + j]));
    want[i] = r;
  }
  DeviceBuffer din = device_elements<T>(bits), dm = to_device(m), out(n * 4);
  frag_max_kernel<T, V><<<1, 128>>>(ptr<T>(din), ptr<float>(dm), n, ptr<float>(out));
  TESSERA_LAUNCH_CHECK();
  const auto got = from_device<float>(out, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << "case " << i << " (kind " << i % 8 << ")";
  EXPECT_EQ(want[4], -INFINITY);  // the cases mean what they say: all NaN, all -inf, NaN and -inf
  EXPECT_EQ(want[5], -INFINITY);
  EXPECT_EQ(want[6], -INFINITY);
  EXPECT_EQ(want[1], 1000.0f);
}

TEST(TileFrag, FragMaxSkipsNaNLikeFmaxf) {
  TESSERA_REQUIRE_GPU();
  check_frag_max<float, 1>();
  check_frag_max<float, 4>();
  check_frag_max<__half, 1>();
  check_frag_max<__half, 8>();
  check_frag_max<__nv_bfloat16, 1>();
  check_frag_max<__nv_bfloat16, 8>();
}

// ---- L2-hinted loads, 16-byte stores, the register-pressure helpers -----------------------------
// Fragment i is copied four ways: load_frag_hint (evict_last) + store_frag_16B, load_frag_hint
// (evict_first) + store_frag, unpacked to floats and packed again + store_frag_stream, and
// through make_opaque(z) / refresh(r, zero), reported as words.
template <class T, int V>
__global__ void hint_kernel(const T* in, int nfrag, T* out_a, T* out_b, T* out_c, uint32_t z, float r, uint32_t zero,
                            uint32_t* opaque, uint32_t* refreshed, int* after) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nfrag) return;
  const auto a = tile::load_frag_hint<T, V>(in + i * V, tile::l2_policy<tile::L2Hint::kEvictLast>());
  const auto b = tile::load_frag_hint<T, V>(in + i * V, tile::l2_policy<tile::L2Hint::kEvictFirst>());
  if constexpr (V > 1) tile::store_frag_16B<T, V>(out_a + i * V, a);
  else tile::store_frag<T, V>(out_a + i * V, a);
  tile::store_frag<T, V>(out_b + i * V, b);
  float f[V];
  tile::unpack(tile::load_frag<T, V>(in + i * V), f);
  tile::store_frag_stream(out_c + i * V, tile::pack<T, V>(f));
  constexpr int W = tile::Frag<T, V>::kWords;
  tile::Frag<T, V> o = tile::load_frag<T, V>(in + i * V), x[2] = {o, o};
  tile::make_opaque(o, z);
  tile::refresh(x, r, zero);
  for (int w = 0; w < W; ++w) opaque[i * W + w] = o.w[w], refreshed[i * W + w] = x[1].w[w];
  after[i] = tile::zero_after(r, zero);
}

template <class T, int V>
void check_hint() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  constexpr int W = tile::Frag<T, V>::kWords, kPer = 4 / static_cast<int>(sizeof(T) < 4 && V > 1 ? 2 : 4);
  const int nfrag = 200, n = nfrag * V;
  std::vector<uint32_t> bits(n);
  for (int j = 0; j < n; ++j) bits[j] = host_bits<T>(static_cast<float>(j % 97) - 40.5f);
  const float r = 3.25f;
  const uint32_t z = 0x00010001u, rb = float_bits(r);
  DeviceBuffer in = device_elements<T>(bits), a(n * sizeof(T)), b(n * sizeof(T)), c(n * sizeof(T)), op(nfrag * W * 4),
               rf(nfrag * W * 4), af(nfrag * 4);
  for (uint32_t zero : {0u, 0xffffffffu}) {
    SCOPED_TRACE("zero=" + std::to_string(zero));
    hint_kernel<T, V><<<(nfrag + 127) / 128, 128>>>(ptr<T>(in), nfrag, ptr<T>(a), ptr<T>(b), ptr<T>(c), z, r, zero,
                                                    ptr<uint32_t>(op), ptr<uint32_t>(rf), ptr<int>(af));
    TESSERA_LAUNCH_CHECK();
    EXPECT_EQ(element_bits_of<T>(a, n), bits);
    EXPECT_EQ(element_bits_of<T>(b, n), bits);
    EXPECT_EQ(element_bits_of<T>(c, n), bits) << "unpack, pack, store_frag_stream";
    const auto ov = from_device<uint32_t>(op, nfrag * W), rv = from_device<uint32_t>(rf, nfrag * W);
    const auto avv = from_device<int>(af, nfrag);
    for (int i = 0; i < nfrag; ++i) {
      ASSERT_EQ(avv[i], static_cast<int>(rb & zero)) << "zero_after";
      for (int w = 0; w < W; ++w) {
        uint32_t word = 0;  // the fragment's word w, from its elements
        for (int j = 0; j < kPer; ++j) word |= bits[i * V + w * kPer + j] << (16 * j);
        // 16-bit types mix the word in; float fragments are left alone.
        ASSERT_EQ(ov[i * W + w], sizeof(T) == 4 ? word : word ^ z) << "make_opaque, fragment " << i;
        ASSERT_EQ(rv[i * W + w], sizeof(T) == 4 ? word : word ^ (rb & zero)) << "refresh, fragment " << i;
      }
    }
  }
}

TEST(TileFrag, HintedLoadsSixteenByteStoresAndOpaqueWords) {
  TESSERA_REQUIRE_GPU();
  check_hint<float, 1>();
  check_hint<float, 4>();
  check_hint<__half, 1>();
  check_hint<__half, 8>();
  check_hint<__nv_bfloat16, 1>();
  check_hint<__nv_bfloat16, 8>();
}

}  // namespace
