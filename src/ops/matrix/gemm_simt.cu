// The GEMM tier that takes anything: any dtype, any strides, any GPU, K = 0. Exact float32
// arithmetic (FFMA), so it is also the float32 path where TF32 is not allowed.
//
// Each CTA of 256 threads computes a 64 x 64 output tile, 4 x 4 elements per thread, staging
// 16-deep slices of A and B in shared memory as float32 (converted once, on load). Loads go
// through the operands' strides element by element: this tier is for correctness on every layout,
// not for speed on the common ones, which the tensor-core tiers take.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "tile/convert.cuh"

namespace tessera::matrix {
namespace {

constexpr int kTile = 64, kDepth = 16, kThreads = 256;

template <class T>
struct Operands {
  const T* a;
  const T* b;
  int64_t a_sb, a_sm, a_sk, b_sb, b_sk, b_sn;
};

template <class T, class OutT>
__global__ void __launch_bounds__(kThreads)
    gemm_simt_kernel(const Operands<T> op, const Epilogue<OutT> epi, int64_t m, int64_t n,
                     int64_t k, int64_t batch) {
  __shared__ float as[kDepth][kTile + 4];  // as[kk][row]
  __shared__ float bs[kDepth][kTile + 4];  // bs[kk][col]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t n0 = int64_t(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z)
  for (int64_t m0 = int64_t(blockIdx.y) * kTile; m0 < m; m0 += int64_t(gridDim.y) * kTile) {
    const T* a = op.a + b * op.a_sb;
    const T* bm = op.b + b * op.b_sb;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      for (int i = threadIdx.x; i < kTile * kDepth; i += kThreads) {
        const int r = i / kDepth, kk = i % kDepth;  // A: consecutive threads walk K
        const int64_t gm = m0 + r, gk = k0 + kk;
        as[kk][r] = gm < m && gk < k ? tile::to_float(a[gm * op.a_sm + gk * op.a_sk]) : 0.0f;
        const int c = i % kTile, kb = i / kTile;  // B: consecutive threads walk N
        const int64_t gn = n0 + c, gkb = k0 + kb;
        bs[kb][c] = gn < n && gkb < k ? tile::to_float(bm[gkb * op.b_sk + gn * op.b_sn]) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kDepth; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i], bv[i] = bs[kk][tx + 16 * i];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t row = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
        if (row < m && col < n)
          epi.template store<!std::is_same_v<OutT, float>>(b, row, col, acc[i][j]);
      }
  }
}

template <class T, class OutT>
void launch_typed(const GemmArgs& g, dim3 grid, cudaStream_t stream) {
  const Operands<T> op{static_cast<const T*>(g.a), static_cast<const T*>(g.b), g.a_sb, g.a_sm,
                       g.a_sk, g.b_sb, g.b_sk, g.b_sn};
  gemm_simt_kernel<T, OutT><<<grid, kThreads, 0, stream>>>(op, Epilogue<OutT>::from(g), g.m, g.n,
                                                           g.k, g.batch);
  TESSERA_LAUNCH_CHECK();
}

template <class T>
void launch_in(const GemmArgs& g, dim3 grid, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_typed<T, float>(g, grid, stream);
  else launch_typed<T, T>(g, grid, stream);
}

}  // namespace

std::string SimtTier::Plan::describe() const {
  return std::to_string(kTile) + " x " + std::to_string(kTile) + " tiles, grid " +
         std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " + std::to_string(grid.z);
}

SimtTier::Plan SimtTier::plan(const GemmArgs& g, const GemmCtx&) {
  Plan p;
  p.grid = dim3(unsigned((g.n + kTile - 1) / kTile),
                unsigned(std::min<int64_t>((g.m + kTile - 1) / kTile, 65535)),
                unsigned(std::min<int64_t>(g.batch, 65535)));
  return p;
}

void SimtTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  switch (g.dtype) {
    case DType::float16: launch_in<__half>(g, p.grid, stream); break;
    case DType::bfloat16: launch_in<__nv_bfloat16>(g, p.grid, stream); break;
    default: launch_in<float>(g, p.grid, stream); break;
  }
}

}  // namespace tessera::matrix
