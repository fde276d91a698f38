// Tile layer, rows: reductions over aligned groups of a warp's lanes, named-barrier groups of
// warps, clusters of CTAs and every scope (tile/reduce.cuh), the row accumulators (Welford moments,
// the online-softmax state and its merge weight, tile/online_softmax.cuh) and the row partition
// and row offsets (tile/row.cuh), against host-side expectations. Integer-valued inputs make sums
// exact in any order, so those compare bit for bit; other sums are compared with the same order
// of additions done on the host.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/launch.cuh"
#include "runtime/memory.hpp"
#include "tile/frag.cuh"
#include "tile/indexing.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"
#include "tile/row.cuh"
#include "tile_testing.hpp"

namespace {

using namespace tessera::tile_testing;
namespace tile = tessera::tile;

// ---- GroupReduce --------------------------------------------------------------------------------
constexpr int kGroupOutputs = 7;

// Groups of gs threads, group g meeting at named barrier 1 + g. Reductions in the order a kernel
// may issue them: buffer 0, a Pair sum (its own slots), buffer 1, buffer 1 again (fence), buffer
// 0, buffer 1. Input k of thread i is in[k * total + i]; output k goes to out[k * total + i].
__global__ void group_reduce_kernel(const float* in, int gs, float* out) {
  __shared__ float slots[8][64];
  __shared__ tile::Pair pair_slots[8][64];
  const int g = threadIdx.x / gs, t = threadIdx.x % gs;
  const int total = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
  const tile::GroupReduce<float> sum{slots[g], gs, 1 + g, t >> 5};
  const tile::GroupReduce<tile::Pair> pair_sum{pair_slots[g], gs, 1 + g, t >> 5};
  const float x = in[i], y = in[total + i], z = in[2 * total + i], f = in[3 * total + i];
  float r[kGroupOutputs];
  r[0] = sum(x, 0);
  const tile::Pair p = pair_sum(tile::Pair{y, z}, 0);
  r[1] = sum(y, 1);
  r[2] = sum(z, 1, true);
  r[3] = sum(z - x, 0);
  r[4] = sum(f, 1);
  r[5] = p.a, r[6] = p.b;
  for (int k = 0; k < kGroupOutputs; ++k) out[k * total + i] = r[k];
}

TEST(TileRowGpu, GroupReduceSumsEachGroupAndGivesEveryThreadTheSameBits) {
  TESSERA_REQUIRE_GPU();
  for (int gs : {32, 64, 128, 256, 512}) {
    SCOPED_TRACE("group size " + std::to_string(gs));
    const int groups = std::min(8, 1024 / gs), block = groups * gs, ctas = 2, total = ctas * block;
    Lcg rng{static_cast<uint64_t>(gs)};
    std::vector<float> in(4 * total);
    for (int j = 0; j < 3 * total; ++j) in[j] = static_cast<float>(rng.integer(-1000, 1000));
    for (int j = 3 * total; j < 4 * total; ++j) in[j] = rng.uniform(-1.0f, 1.0f);
    DeviceBuffer din = to_device(in), dout(kGroupOutputs * total * 4);
    group_reduce_kernel<<<ctas, block>>>(ptr<float>(din), gs, ptr<float>(dout));
    TESSERA_LAUNCH_CHECK();
    const auto out = from_device<float>(dout, kGroupOutputs * total);
    for (int g0 = 0; g0 < total; g0 += gs) {  // first thread of each group
      // Integer sums below 2^24: exact in any order, so a fixed-order host sum is the answer.
      double x = 0, y = 0, z = 0, d = 0, f = 0;
      for (int i = g0; i < g0 + gs; ++i) {
        x += in[i], y += in[total + i], z += in[2 * total + i], f += in[3 * total + i];
        d += static_cast<double>(in[2 * total + i] - in[i]);
      }
      const float want[kGroupOutputs] = {float(x), float(y), float(z), float(d), 0.0f, float(y), float(z)};
      EXPECT_NEAR(out[4 * total + g0], f, 1e-3) << "group at thread " << g0;
      for (int k = 0; k < kGroupOutputs; ++k)
        for (int i = g0; i < g0 + gs; ++i) {
          const float w = k == 4 ? out[4 * total + g0] : want[k];  // non-integer: same bits as the first
          ASSERT_EQ(float_bits(out[k * total + i]), float_bits(w)) << "output " << k << " thread " << i;
        }
    }
  }
}

// ---- warp, CTA and cluster scopes ---------------------------------------------------------------
// Sum then max with the same scratch and slot (the call may be repeated), and the cluster rank.
template <tile::Scope K>
__global__ void scope_kernel(const float* in, float* out, int* ranks) {
  __shared__ float scratch[32];
  __shared__ float slot;
  const int total = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = in[i];
  out[i] = tile::scope_reduce<K>(v, tile::Sum{}, 0.0f, scratch, &slot);
  out[total + i] = tile::scope_reduce<K>(v, tile::Max{}, -INFINITY, scratch, &slot);
  if (threadIdx.x == 0) ranks[blockIdx.x] = tile::cluster_rank();
}

// Runs scope_kernel<K> over `ctas` CTAs of `block` threads and checks every thread against the
// sum and max of its span of `span` threads, and every CTA's rank against its place in a cluster
// of `cluster` CTAs (1: no cluster).
template <tile::Scope K>
void check_scope(int ctas, int block, int span, int cluster) {
  SCOPED_TRACE("span " + std::to_string(span) + ", cluster " + std::to_string(cluster));
  const int total = ctas * block;
  Lcg rng{static_cast<uint64_t>(span * 31 + cluster)};
  std::vector<float> in(total);
  for (auto& v : in) v = static_cast<float>(rng.integer(-1000, 1000));
  DeviceBuffer din = to_device(in), dout(2 * total * 4), dranks(ctas * 4);
  if (cluster > 1) {
    tessera::runtime::launch_cluster(scope_kernel<K>, dim3(ctas), dim3(block), 0, cluster, nullptr,
                                     ptr<const float>(din), ptr<float>(dout), ptr<int>(dranks));
  } else {
    scope_kernel<K><<<ctas, block>>>(ptr<float>(din), ptr<float>(dout), ptr<int>(dranks));
  }
  TESSERA_LAUNCH_CHECK();
  const auto out = from_device<float>(dout, 2 * total);
  const auto ranks = from_device<int>(dranks, ctas);
  for (int s0 = 0; s0 < total; s0 += span) {
    double sum = 0;
    float mx = -INFINITY;
    for (int i = s0; i < s0 + span; ++i) sum += in[i], mx = std::max(mx, in[i]);
    for (int i = s0; i < s0 + span; ++i) {
      ASSERT_EQ(out[i], static_cast<float>(sum)) << "sum, thread " << i;
      ASSERT_EQ(out[total + i], mx) << "max, thread " << i;
    }
  }
  for (int b = 0; b < ctas; ++b) EXPECT_EQ(ranks[b], b % cluster) << "cluster_rank of CTA " << b;
}

TEST(TileRowGpu, ScopeReduceOverWarpsAndBlocks) {
  TESSERA_REQUIRE_GPU();
  check_scope<tile::Scope::warp>(3, 96, 32, 1);
  check_scope<tile::Scope::block>(3, 96, 96, 1);
  check_scope<tile::Scope::block>(2, 1024, 1024, 1);
}

TEST(TileRowGpu, ClusterReduceOverClustersOfTwoAndFourCtas) {
  TESSERA_REQUIRE_GPU();
  const int major = tessera::runtime::device_props(0).major;
  if (major < 9) GTEST_SKIP() << "cluster_reduce needs sm_90 (thread-block clusters); device major is " << major;
  // The query runs on this module's CUDA runtime, the one that knows the kernel (the library's
  // runtime::active_clusters answers for the library's own kernels only).
  const void* kernel = reinterpret_cast<const void*>(scope_kernel<tile::Scope::cluster>);
  cudaFuncAttributes fa{};
  TESSERA_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  if (fa.binaryVersion < 90)
    GTEST_SKIP() << "this build holds no sm_90 code (CMAKE_CUDA_ARCHITECTURES): the kernel runs "
                 << "sm_" << fa.binaryVersion << " code, which has no clusters";
  for (int c : {2, 4}) {
    cudaLaunchAttribute attr = tessera::runtime::cluster_attribute(c);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(c);
    cfg.blockDim = dim3(256);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    ASSERT_GT(n, 0) << "clusters of " << c << " CTAs of 256 threads";
  }
  check_scope<tile::Scope::cluster>(6, 256, 2 * 256, 2);
  check_scope<tile::Scope::cluster>(12, 256, 4 * 256, 4);
}

// ---- warp_reduce over aligned groups of lanes ---------------------------------------------------
// Each lane reduces its value over its group of Width lanes: sums in both butterfly orders, and
// fmaxf maxima (MaxNum) of a second input holding a NaN. out: three values per lane.
template <int Width>
__global__ void lane_group_kernel(const float* in, const float* in_max, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[3 * i] = tile::warp_reduce<Width>(in[i], tile::Sum{});
  out[3 * i + 1] = tile::warp_reduce<Width, tile::Butterfly::near_first>(in[i], tile::Sum{});
  out[3 * i + 2] = tile::warp_reduce<Width>(in_max[i], tile::MaxNum{});
}

// The butterfly on the host, in float: what each lane must hold, bit for bit.
std::vector<float> host_butterfly(std::vector<float> v, int width, bool near_first) {
  for (int k = 1; k < width; k *= 2) {
    const int offset = near_first ? k : width / (2 * k);
    std::vector<float> next(v.size());
    for (size_t l = 0; l < v.size(); ++l) next[l] = v[l] + v[l ^ size_t(offset)];
    v = next;
  }
  return v;
}

template <int Width>
void check_lane_groups(const std::vector<float>& in, const std::vector<float>& in_max) {
  SCOPED_TRACE("width " + std::to_string(Width));
  const int n = static_cast<int>(in.size());
  DeviceBuffer din = to_device(in), dmax = to_device(in_max), dout(3 * n * 4);
  lane_group_kernel<Width><<<1, n>>>(ptr<float>(din), ptr<float>(dmax), ptr<float>(dout));
  TESSERA_LAUNCH_CHECK();
  const auto out = from_device<float>(dout, 3 * n);
  const auto wide = host_butterfly(in, Width, false), near = host_butterfly(in, Width, true);
  for (int l = 0; l < n; ++l) {
    // fmaxf over the group: a NaN is skipped where the group holds a number (a group of one lane
    // keeps its value, NaN included).
    const int first = l / Width * Width;
    float mx = in_max[first];
    for (int j = first + 1; j < first + Width; ++j) mx = std::fmax(mx, in_max[j]);
    ASSERT_EQ(float_bits(out[3 * l]), float_bits(wide[l])) << "wide-first sum, lane " << l;
    ASSERT_EQ(float_bits(out[3 * l + 1]), float_bits(near[l])) << "near-first sum, lane " << l;
    ASSERT_EQ(float_bits(out[3 * l + 2]), float_bits(mx)) << "max, lane " << l;
  }
}

TEST(TileRowGpu, WarpReduceOverAlignedGroupsOfLanes) {
  TESSERA_REQUIRE_GPU();
  const int n = 64;  // two warps
  Lcg rng{17};
  std::vector<float> in(n), in_max(n);
  for (int l = 0; l < n; ++l) in[l] = rng.uniform(-1.0f, 1.0f) * float(1 << (l % 7)), in_max[l] = rng.uniform(-5.0f, 5.0f);
  in_max[37] = NAN;
  in_max[44] = -INFINITY;
  check_lane_groups<1>(in, in_max);
  check_lane_groups<2>(in, in_max);
  check_lane_groups<4>(in, in_max);
  check_lane_groups<8>(in, in_max);
  check_lane_groups<16>(in, in_max);
  check_lane_groups<32>(in, in_max);
  // Lanes of different magnitudes: the two orders round differently somewhere, so the test above
  // tells them apart.
  EXPECT_NE(host_butterfly(in, 32, false), host_butterfly(in, 32, true));
}

// ---- Welford moments and the online-softmax state over a warp ----------------------------------
constexpr int kPerLane = 8;

// Lane i holds counts[i] values in[i * kPerLane + j]; its state is built element by element with
// the merge, then reduced over the warp.
__global__ void moments_kernel(const float* in, const int* counts, tile::Moments* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile::Moments m{0.0f, 0.0f, 0.0f};
  for (int j = 0; j < counts[i]; ++j) m = tile::MergeMoments{}(m, tile::Moments{1.0f, in[i * kPerLane + j], 0.0f});
  out[i] = tile::warp_reduce(m, tile::MergeMoments{});
}

// The per-lane state as the softmax kernels build it: the max first, then the exps against it
// (against 0 while the max is -inf, so that -inf adds 0 and NaN makes the sum NaN).
__global__ void softmax_state_kernel(const float* in, const int* counts, tile::SoftmaxState* out, const float* ex,
                                     float* ex_out, int nex) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float m = -INFINITY, s = 0.0f;
  for (int j = 0; j < counts[i]; ++j) m = fmaxf(m, in[i * kPerLane + j]);
  const float base = m == -INFINITY ? 0.0f : m;
  for (int j = 0; j < counts[i]; ++j) s += tile::fast_exp(in[i * kPerLane + j] - base);
  out[i] = tile::warp_reduce(tile::SoftmaxState{m, s}, tile::SoftmaxMerge{});
  if (i < nex) ex_out[i] = tile::fast_exp(ex[i]);
}

// merge_weight in natural and log2 units.
__global__ void merge_weight_kernel(const float* m, const float* mm, int n, float* we, float* w2) {
  const int i = threadIdx.x;
  if (i < n) we[i] = tile::merge_weight(m[i], mm[i]), w2[i] = tile::merge_weight<tile::Base::two>(m[i], mm[i]);
}

// Warp w's inputs: case w of `kinds` below (counts and values per lane).
struct WarpCases {
  std::vector<float> values;
  std::vector<int> counts;
};

template <class Fill>
WarpCases warp_cases(int warps, Fill fill) {
  WarpCases c{std::vector<float>(warps * 32 * kPerLane, 0.0f), std::vector<int>(warps * 32, 0)};
  for (int w = 0; w < warps; ++w)
    for (int l = 0; l < 32; ++l) fill(w, l, &c.counts[w * 32 + l], &c.values[(w * 32 + l) * kPerLane]);
  return c;
}

TEST(TileRowGpu, MergeMomentsOverAWarpGivesMeanAndVariance) {
  TESSERA_REQUIRE_GPU();
  // 0: 8 values per lane near 10; 1: l % 5 per lane (empty lanes: the identity) near -3;
  // 2: lane 7 alone, 3 values; 3: no values at all; 4: lane 31 alone, one value; 5: near 100,
  // where E[x^2] - E[x]^2 in float would be off by ~1e-3 relative.
  const int warps = 6;
  Lcg rng{5};
  const WarpCases c = warp_cases(warps, [&](int w, int l, int* n, float* v) {
    const int counts[6] = {8, l % 5, l == 7 ? 3 : 0, 0, l == 31 ? 1 : 0, 8};
    const float centre[6] = {10.0f, -3.0f, 0.5f, 0.0f, 2.75f, 100.0f};
    *n = counts[w];
    for (int j = 0; j < *n; ++j) v[j] = centre[w] + rng.uniform(-1.0f, 1.0f);
  });
  DeviceBuffer din = to_device(c.values), dcounts = to_device(c.counts), dout(warps * 32 * sizeof(tile::Moments));
  moments_kernel<<<1, warps * 32>>>(ptr<float>(din), ptr<int>(dcounts), ptr<tile::Moments>(dout));
  TESSERA_LAUNCH_CHECK();
  const auto out = from_device<float>(dout, warps * 32 * 3);  // (n, mean, m2) per lane
  for (int w = 0; w < warps; ++w) {
    SCOPED_TRACE("case " + std::to_string(w));
    double n = 0, sum = 0, sq = 0, scale = 0;  // scale: the largest |x|, what rounding errors follow
    for (int i = w * 32; i < w * 32 + 32; ++i)
      for (int j = 0; j < c.counts[i]; ++j)
        n += 1, sum += c.values[i * kPerLane + j], scale = std::max(scale, std::fabs(double(c.values[i * kPerLane + j])));
    const double mean = n > 0 ? sum / n : 0;
    for (int i = w * 32; i < w * 32 + 32; ++i)
      for (int j = 0; j < c.counts[i]; ++j) sq += (c.values[i * kPerLane + j] - mean) * (c.values[i * kPerLane + j] - mean);
    const float* r = &out[w * 32 * 3];
    EXPECT_EQ(r[0], static_cast<float>(n));
    if (n == 0) {
      EXPECT_EQ(float_bits(r[1]), 0u);  // {0, 0, 0} merged with itself stays {0, 0, 0}
      EXPECT_EQ(float_bits(r[2]), 0u);
    } else {
      EXPECT_NEAR(r[1], mean, 2e-6 * scale);
      EXPECT_NEAR(r[2] / r[0], sq / n, 2e-4 * (sq / n) + 1e-9 * scale * scale);
    }
    for (int l = 1; l < 32; ++l)
      for (int k = 0; k < 3; ++k) ASSERT_EQ(float_bits(r[l * 3 + k]), float_bits(r[k])) << "lane " << l << " field " << k;
  }
}

TEST(TileRowGpu, SoftmaxMergeOverAWarpAndFastExp) {
  TESSERA_REQUIRE_GPU();
  // 0: 4 values per lane in [-10, 10]; 1: l % 3 per lane (empty lanes: {-inf, 0}); 2: all -inf;
  // 3: one NaN (lane 5) among finite values; 4: one NaN among -inf; 5: no values; 6: [-60, 60],
  // so that most terms are rescaled many times.
  const int warps = 7;
  Lcg rng{9};
  const WarpCases c = warp_cases(warps, [&](int w, int l, int* n, float* v) {
    *n = w == 1 ? l % 3 : w == 5 ? 0 : 4;
    for (int j = 0; j < *n; ++j) {
      v[j] = w == 6 ? rng.uniform(-60.0f, 60.0f) : rng.uniform(-10.0f, 10.0f);
      if (w == 2 || w == 4) v[j] = -INFINITY;
      if ((w == 3 || w == 4) && l == 5 && j == 2) v[j] = NAN;
    }
  });
  std::vector<float> ex = {-80.0f, -30.5f, -1.0f, -1e-3f, 0.0f, 0.25f, 1.0f, 7.5f, 42.0f, 80.0f, -INFINITY, NAN};
  const int nex = static_cast<int>(ex.size());
  DeviceBuffer din = to_device(c.values), dcounts = to_device(c.counts), dex = to_device(ex), dex_out(nex * 4),
               dout(warps * 32 * sizeof(tile::SoftmaxState));
  softmax_state_kernel<<<1, warps * 32>>>(ptr<float>(din), ptr<int>(dcounts), ptr<tile::SoftmaxState>(dout),
                                          ptr<float>(dex), ptr<float>(dex_out), nex);
  TESSERA_LAUNCH_CHECK();
  const auto out = from_device<float>(dout, warps * 32 * 2);  // (m, s) per lane
  for (int w = 0; w < warps; ++w) {
    SCOPED_TRACE("case " + std::to_string(w));
    double m = -INFINITY, s = 0;
    bool nan = false;
    for (int i = w * 32; i < w * 32 + 32; ++i)
      for (int j = 0; j < c.counts[i]; ++j) {
        const float x = c.values[i * kPerLane + j];
        nan |= std::isnan(x);
        if (!std::isnan(x)) m = std::max(m, static_cast<double>(x));
      }
    for (int i = w * 32; i < w * 32 + 32; ++i)
      for (int j = 0; j < c.counts[i]; ++j)
        if (m > -INFINITY) s += std::exp(static_cast<double>(c.values[i * kPerLane + j]) - m);
    const float* r = &out[w * 32 * 2];
    int differ = 0;
    for (int l = 0; l < 32; ++l) {
      ASSERT_EQ(r[l * 2], static_cast<float>(m)) << "max, lane " << l;
      if (nan) ASSERT_TRUE(std::isnan(r[l * 2 + 1])) << "a NaN element makes the sum NaN, lane " << l;
      else differ += float_bits(r[l * 2 + 1]) != float_bits(r[1]);
    }
    // The butterfly gives every lane the same bits only if the merge is symmetric bit for bit.
    EXPECT_EQ(differ, 0) << "lanes whose sum differs in bits from lane 0's";
    if (!nan) EXPECT_NEAR(r[1], s, 1e-4 * s);  // -inf only, or nothing: exactly (-inf, 0)
    if (w == 2 || w == 5) EXPECT_EQ(float_bits(r[1]), 0u);
    if (w == 2 || w == 4 || w == 5) EXPECT_EQ(r[0], -INFINITY);
  }
  const auto e = from_device<float>(dex_out, nex);
  for (int i = 0; i < nex - 2; ++i) EXPECT_NEAR(e[i], std::exp(double(ex[i])), 1e-5 * std::exp(double(ex[i]))) << ex[i];
  EXPECT_EQ(e[nex - 2], 0.0f);
  EXPECT_TRUE(std::isnan(e[nex - 1]));
}

TEST(TileRowGpu, MergeWeightRescalesToTheMergedMax) {
  TESSERA_REQUIRE_GPU();
  const std::vector<float> m = {-1.0f, -10.5f, 2.0f, 3.25f, -INFINITY, -INFINITY, -20.0f};
  const std::vector<float> mm = {0.0f, 3.0f, 2.0f, 3.25f, 5.0f, -INFINITY, 0.0f};
  const int n = static_cast<int>(m.size());
  DeviceBuffer dm = to_device(m), dmm = to_device(mm), dwe(n * 4), dw2(n * 4);
  merge_weight_kernel<<<1, 32>>>(ptr<float>(dm), ptr<float>(dmm), n, ptr<float>(dwe), ptr<float>(dw2));
  TESSERA_LAUNCH_CHECK();
  const auto we = from_device<float>(dwe, n), w2 = from_device<float>(dw2, n);
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("m " + std::to_string(m[i]) + ", M " + std::to_string(mm[i]));
    if (mm[i] == -INFINITY) {  // every state empty: the weight is exactly 0
      EXPECT_EQ(float_bits(we[i]), 0u);
      EXPECT_EQ(float_bits(w2[i]), 0u);
      continue;
    }
    const double d = double(m[i]) - double(mm[i]);
    EXPECT_NEAR(we[i], std::exp(d), 4e-6 * std::exp(d));  // the rounding of d log2(e) included
    EXPECT_NEAR(w2[i], std::exp2(d), 1e-6 * std::exp2(d));
    if (m[i] == mm[i]) {
      EXPECT_EQ(we[i], 1.0f);
      EXPECT_EQ(w2[i], 1.0f);
    }
  }
}

// ---- RowLanes and row_offsets -------------------------------------------------------------------
constexpr int kLanesK = 3;

// Thread t of one CTA: for vectors k < kLanesK, col/in, load (fill 7.5) stored back through
// store, and param with a per-column vector and with none (the default vector).
template <class T, int V>
__global__ void row_lanes_kernel(const T* row, const T* vec, const T* dflt, int n, int after, T* out_row, int* cols,
                                 int* ins, uint32_t* loaded, uint32_t* with_vec, uint32_t* with_dflt) {
  const tile::RowLanes<V> p{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), n};
  for (int k = 0; k < kLanesK; ++k) {
    const int j = threadIdx.x * kLanesK + k;
    cols[j] = p.col(k);
    ins[j] = p.in(k);
    const tile::Frag<T, V> f = p.load(row, k, 7.5f);
    p.store(out_row, k, f);
    const tile::Frag<T, V> a = p.param(vec, dflt, k, -1.5f, after);
    const tile::Frag<T, V> b = p.param(static_cast<const T*>(nullptr), dflt, k, -1.5f, after);
    for (int e = 0; e < V; ++e) {
      loaded[j * V + e] = elem_bits(f, e);
      with_vec[j * V + e] = elem_bits(a, e);
      with_dflt[j * V + e] = elem_bits(b, e);
    }
  }
}

template <class T, int V>
void check_row_lanes() {
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(V));
  const int G = 64, slots = G * kLanesK, n = (G * (kLanesK - 1) + 29) * V, cap = slots * V;  // last k: 29 of 64 in
  const uint32_t base = sizeof(T) == 4 ? 0x3f800000u : 0x3c00u;
  std::vector<uint32_t> row(cap), vec(cap), dflt(V);
  for (int c = 0; c < cap; ++c) row[c] = base + c, vec[c] = base + 0x1000 + c;  // distinct, finite
  for (int e = 0; e < V; ++e) dflt[e] = base + 0x2000 + e;
  DeviceBuffer drow = device_elements<T>(row), dvec = device_elements<T>(vec), ddflt = device_elements<T>(dflt);
  DeviceBuffer out_row(cap * sizeof(T)), cols(slots * 4), ins(slots * 4), loaded(cap * 4), wv(cap * 4), wd(cap * 4);
  poison(out_row);
  row_lanes_kernel<T, V><<<1, G>>>(ptr<T>(drow), ptr<T>(dvec), ptr<T>(ddflt), n, 0, ptr<T>(out_row), ptr<int>(cols),
                                   ptr<int>(ins), ptr<uint32_t>(loaded), ptr<uint32_t>(wv), ptr<uint32_t>(wd));
  TESSERA_LAUNCH_CHECK();
  const auto cv = from_device<int>(cols, slots), iv = from_device<int>(ins, slots);
  const auto lv = from_device<uint32_t>(loaded, cap), vv = from_device<uint32_t>(wv, cap);
  const auto dv = from_device<uint32_t>(wd, cap), ov = element_bits_of<T>(out_row, cap);
  const uint32_t fill = host_bits<T>(7.5f), pfill = host_bits<T>(-1.5f);
  int inside = 0;
  for (int t = 0; t < G; ++t)
    for (int k = 0; k < kLanesK; ++k) {
      const int j = t * kLanesK + k, col = (k * G + t) * V;
      const bool in = col < n;
      inside += in;
      ASSERT_EQ(cv[j], col) << "t=" << t << " k=" << k;
      ASSERT_EQ(iv[j] != 0, in) << "t=" << t << " k=" << k;
      for (int e = 0; e < V; ++e) {
        ASSERT_EQ(lv[j * V + e], in ? row[col + e] : fill) << "load t=" << t << " k=" << k << " e=" << e;
        ASSERT_EQ(vv[j * V + e], in ? vec[col + e] : pfill) << "param t=" << t << " k=" << k << " e=" << e;
        ASSERT_EQ(dv[j * V + e], in ? dflt[e] : pfill) << "default param t=" << t << " k=" << k << " e=" << e;
      }
    }
  EXPECT_EQ(inside * V, n);  // every vector of the row is some thread's, once
  for (int c = 0; c < cap; ++c) ASSERT_EQ(ov[c], c < n ? row[c] : poison_bits<T>()) << "store, column " << c;
}

TEST(TileRowGpu, RowLanesPartitionLoadStoreAndParam) {
  TESSERA_REQUIRE_GPU();
  check_row_lanes<float, 1>();
  check_row_lanes<float, 4>();
  check_row_lanes<__half, 8>();
  check_row_lanes<__nv_bfloat16, 1>();
  check_row_lanes<__nv_bfloat16, 8>();
}

// Both overloads for each row: uniform strides (s0, s1), and the indexer.
__global__ void row_offsets_kernel(tessera::tile::StridedIndexer<2> idx, int64_t s0, int64_t s1, const int64_t* rows,
                                   int n, int64_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t stride[2] = {s0, s1};
  int64_t a[2], b[2];
  tile::row_offsets(stride, rows[i], a);
  tile::row_offsets(idx, rows[i], b);
  out[4 * i] = a[0], out[4 * i + 1] = a[1], out[4 * i + 2] = b[0], out[4 * i + 3] = b[1];
}

TEST(TileRowGpu, RowOffsetsUniformAndIndexed) {
  TESSERA_REQUIRE_GPU();
  const int64_t s0 = 7, s1 = int64_t{1} << 21;
  tessera::tile::StridedIndexer<2> one{}, two{};
  one.ndim = 1;  // rows uniformly strided, past 2^31 rows: 64-bit products
  one.shape[0] = 5000000000LL;
  one.strides[0][0] = 3, one.strides[1][0] = int64_t{1} << 20;
  two.ndim = 2;  // 3 x 5 rows: a row-major tensor, and a permuted one
  two.shape[0] = 3, two.shape[1] = 5;
  two.strides[0][0] = 500, two.strides[0][1] = 100, two.strides[1][0] = 1, two.strides[1][1] = 3;
  for (const auto* idx : {&one, &two}) {
    SCOPED_TRACE("ndim " + std::to_string(idx->ndim));
    std::vector<int64_t> rows;
    if (idx->ndim == 1) rows = {0, 1, 17, 2147483648LL, 3000000001LL, 4999999999LL};
    else for (int64_t r = 0; r < 15; ++r) rows.push_back(r);
    const int n = static_cast<int>(rows.size());
    DeviceBuffer drows = to_device(rows), dout(4 * n * 8);
    row_offsets_kernel<<<1, 32>>>(*idx, s0, s1, ptr<int64_t>(drows), n, ptr<int64_t>(dout));
    TESSERA_LAUNCH_CHECK();
    const auto out = from_device<int64_t>(dout, 4 * n);
    for (int i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      EXPECT_EQ(out[4 * i], r * s0) << "row " << r;
      EXPECT_EQ(out[4 * i + 1], r * s1) << "row " << r;
      for (int t = 0; t < 2; ++t) {
        const int64_t want = idx->ndim == 1 ? r * idx->strides[t][0]
                                            : (r / 5) * idx->strides[t][0] + (r % 5) * idx->strides[t][1];
        EXPECT_EQ(out[4 * i + 2 + t], want) << "row " << r << " tensor " << t;
      }
    }
  }
}

}  // namespace
