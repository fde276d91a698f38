// Tile layer: indexers (CPU), reductions and masked vector access (GPU).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "gpu.hpp"
#include "runtime/check.hpp"
#include "runtime/layout.hpp"
#include "runtime/memory.hpp"
#include "tile/indexing.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace {

using tessera::TensorView;

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
    tessera::runtime::poison(out.data(), out.bytes(), nullptr);
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

}  // namespace
