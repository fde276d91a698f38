// The SIMT tier's generic kernel (gemm_simt.cu has the tier and its float32 kernel): any dtype and
// strides, 64 x 64 tiles, 4 x 4 outputs per thread, loads element by element through the strides.
// A translation unit of its own, so that a build's cores share the SIMT tier's kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "tile/convert.cuh"

namespace tessera::matrix {
namespace {

constexpr int kThreads = 256;

constexpr int kTile = kSimtTile, kDepth = 16;

template <class T>
constexpr bool kIsFp8 = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

template <class T>
struct Operands {
  const T* a;
  const T* b;
  int64_t a_sb, a_sm, a_sk, b_sb, b_sk, b_sn;
};

// Thread (ty, tx) owns rows ty + 16 i and the column pairs 2 tx + 32 j (+ 1). After the K loop the
// tile is stored in two passes of 32 rows, each staged in the shared memory of the K loop's slices
// and stored from there (store_staged).
template <class T, class OutT>
__global__ void __launch_bounds__(kThreads)
    gemm_simt_kernel(const Operands<T> op, const __grid_constant__ Epilogue<OutT> epi, int64_t m,
                     int64_t n, int64_t k, int64_t batch) {
  constexpr int kPassRows = 32;
  __shared__ alignas(16) union {
    struct {
      float a[kDepth][kTile + 4];  // a[kk][row]
      float b[kDepth][kTile + 4];  // b[kk][col]
    } k;
    float out[kPassRows][kTile];
  } smem;
  auto& as = smem.k.a;
  auto& bs = smem.k.b;
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
        // Block-wise scales factor per element (a's by its row and K block, b's by its K and
        // column blocks), so each operand is scaled as it is loaded.
        if constexpr (kIsFp8<T>)
          if (epi.blocks_a) {
            if (gm < m && gk < k) as[kk][r] *= epi.block_a(gm, gk / kScaleBlock, m);
            if (gn < n && gkb < k) bs[kb][c] *= epi.block_b(gkb / kScaleBlock, gn, n);
          }
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kDepth; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          av[i] = as[kk][ty + 16 * i], bv[i] = bs[kk][2 * tx + 32 * (i / 2) + i % 2];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
    if constexpr (kIsFp8<T>)  // scaled_mm's row-wise scales, which alpha cannot carry
      if (epi.row_scales)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            acc[i][j] *= epi.row_scale(m0 + ty + 16 * i, m) * epi.col_scale(n0 + 2 * tx + 32 * (j / 2) + j % 2, n);
    // A loop, not unrolled, each pass picking its rows of acc by a select: the store code once.
    const int64_t rows = m - m0, cols = n - n0;
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          *reinterpret_cast<float2*>(&smem.out[ty + 16 * i][2 * tx + 32 * j]) =
              pass ? make_float2(acc[2 + i][2 * j], acc[2 + i][2 * j + 1])
                   : make_float2(acc[i][2 * j], acc[i][2 * j + 1]);
      __syncthreads();
      const int64_t left = rows - pass * kPassRows;
      if (left > 0)
        store_staged<kTile, kThreads>(epi, &smem.out[0][0], kTile, b, m0 + pass * kPassRows, n0,
                                      left < kPassRows ? int(left) : kPassRows,
                                      cols < kTile ? int(cols) : kTile, threadIdx.x);
      __syncthreads();  // before the next pass or tile writes the buffer
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

// Outputs: float32, or the input dtype; float8 inputs (scaled_mm) store bfloat16 or float16.
template <class T>
void launch_in(const GemmArgs& g, dim3 grid, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) return launch_typed<T, float>(g, grid, stream);
  if constexpr (kIsFp8<T>) {
    if (g.out_dtype == DType::bfloat16) return launch_typed<T, __nv_bfloat16>(g, grid, stream);
    if (g.out_dtype == DType::float16) return launch_typed<T, __half>(g, grid, stream);
    throw Error(ErrorKind::runtime, std::string("matmul: internal error: float8 inputs with out ") +
                                        dtype_name(g.out_dtype));
  } else {
    launch_typed<T, T>(g, grid, stream);
  }
}

}  // namespace

void launch_simt_generic(const GemmArgs& g, dim3 grid, cudaStream_t stream) {
  switch (g.dtype) {
    case DType::float16: launch_in<__half>(g, grid, stream); break;
    case DType::bfloat16: launch_in<__nv_bfloat16>(g, grid, stream); break;
    case DType::float8_e4m3fn: launch_in<__nv_fp8_e4m3>(g, grid, stream); break;
    case DType::float8_e5m2: launch_in<__nv_fp8_e5m2>(g, grid, stream); break;
    default: launch_in<float>(g, grid, stream); break;
  }
}

}  // namespace tessera::matrix
