// The row-wise passes around the Hopper backward's multiplies (attention_backward_sm90.cuh):
// memory-bound, 16 bytes a thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "ops/attention/attention_backward_sm90.cuh"
#include "runtime/check.hpp"
#include "tile/constants.cuh"
#include "tile/convert.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace tessera::attn::sm90_bwd {
namespace {

using tile::kLog2e;

// delta = rowsum(dO * O) and lse in log2 units, in the padded [batch * heads_q][m_blocks * kBM]
// layout; padding rows and rows that saw no key get lse2 = +inf (P = 0). D / 8 threads a row,
// 16 bytes each (out and dO have the head dimension contiguous, 16-byte aligned rows).
template <class T, int D>
__global__ void __launch_bounds__(256) prepare_kernel(Params p, const void* dout, Strides sdo, const float* lse,
                                                      float* lse2, float* delta, int64_t rows_per_head) {
  constexpr int kLanes = D / 8;
  const int64_t row = (int64_t(blockIdx.x) * 256 + threadIdx.x) / kLanes;
  const int u = threadIdx.x % kLanes;
  const bool live = row < p.batch * p.heads_q * rows_per_head;  // no return before the shuffles
  const int64_t i = row % rows_per_head, bh = row / rows_per_head, h = bh % p.heads_q, b = bh / p.heads_q;
  const Seq sq = live ? seq_of(p, b) : Seq{0, 0, 0, 0};
  float d = 0.f;
  if (i < sq.len_q) {
    const auto o = tile::load<8>(static_cast<const T*>(p.out) + b * p.so.b + (sq.q0 + i) * p.so.s + h * p.so.h + 8 * u);
    const auto g = tile::load<8>(static_cast<const T*>(dout) + b * sdo.b + (sq.q0 + i) * sdo.s + h * sdo.h + 8 * u);
#pragma unroll
    for (int e = 0; e < 8; ++e) d += tile::to_float(o[e]) * tile::to_float(g[e]);
  }
  d = tile::warp_reduce<kLanes>(d, tile::Sum{});
  if (live && u == 0) {
    lse2[row] = i < sq.len_q ? lse[b * p.lse_b + h * p.lse_h + sq.q0 + i] * kLog2e : INFINITY;
    delta[row] = d;
  }
}

// dq = scale * dq_acc, from stage_dq's accumulator order: in a block of kCols columns, float4
// j4 * 128 + t holds thread t's values 4 j4 .. 4 j4 + 3: row 16 (t / 32) + (t % 32) / 4 in x, y and
// that row + 8 in z, w, columns 8 j4 + 2 (t % 4) + {0, 1}. A thread here takes four consecutive
// float4 (t % 4 = 0..3): 8 columns of two rows, written 16 bytes each where dq allows.
template <class T, class C>
__global__ void __launch_bounds__(256) finish_dq_kernel(Params p, const float* dq_acc, void* dq, Strides sdq,
                                                        int64_t m_blocks, bool vector) {
  constexpr int kCols = C::kCols, kPer = 32 * kCols / 8;  // threads per column block of a tile
  const int idx = int(blockIdx.x) * 256 + int(threadIdx.x);  // within head blockIdx.y of sequence blockIdx.z
  const int x = idx % kPer, j4 = x / 32, w = (x % 32) / 8, g = x % 8;
  const int part = idx / kPer % C::kParts, mb = idx / kPer / C::kParts;
  const int64_t h = blockIdx.y, b = blockIdx.z, bh = b * p.heads_q + h;
  const Seq sq = seq_of(p, b);
  const int64_t block = (bh * m_blocks + mb) * C::kParts + part;
  const float4* src = reinterpret_cast<const float4*>(dq_acc + block * (kBM * kCols)) + j4 * 128 + 32 * w + 4 * g;
  float v[2][8];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float4 f4 = src[t];
    v[0][2 * t] = f4.x * p.scale, v[0][2 * t + 1] = f4.y * p.scale;
    v[1][2 * t] = f4.z * p.scale, v[1][2 * t + 1] = f4.w * p.scale;
  }
  const int col = part * kCols + 8 * j4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = mb * kBM + 16 * w + g + 8 * r;
    if (i >= sq.len_q) continue;
    T* out = static_cast<T*>(dq) + b * sdq.b + (sq.q0 + i) * sdq.s + h * sdq.h;
    if (vector) {
      tile::Vec<T, 8> o;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = tile::from_float<T>(v[r][e]);
      tile::store<8>(out + col, o);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) out[(col + e) * sdq.d] = tile::from_float<T>(v[r][e]);
    }
  }
}

// dk, dv = the sum over the parts, 8 elements a thread (the Hopper tier takes dk and dv 16-byte
// aligned with 16-byte rows). Thread i < n takes dK's vector i, the rest dV's.
template <class T, int D>
__global__ void __launch_bounds__(256) sum_parts_kernel(Params p, BackwardArgs a, const float* dk_parts,
                                                        const float* dv_parts, int split, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i >= 2 * n) return;
  const bool is_v = i >= n;
  const int64_t e = (is_v ? i - n : i) * 8, heads_kv = p.heads_q / p.group;
  const int64_t row = e / (heads_kv * D), h = e / D % heads_kv, d = e % D;
  const float* src = (is_v ? dv_parts : dk_parts) + e;
  float acc[8] = {};
  for (int part = 0; part < split; ++part) {
    const float4 lo = *reinterpret_cast<const float4*>(src + part * n * 8);
    const float4 hi = *reinterpret_cast<const float4*>(src + part * n * 8 + 4);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += v[k];
  }
  const Strides st = is_v ? a.sdv : a.sdk;
  const int64_t b = p.cu_q ? 0 : row / p.seq_k, r = p.cu_q ? row : row % p.seq_k;
  tile::Vec<T, 8> o;
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = tile::from_float<T>(acc[k]);
  tile::store<8>(static_cast<T*>(is_v ? a.dv : a.dk) + b * st.b + r * st.s + h * st.h + d, o);
}

template <class T, int D>
void prepare_typed(const Params& p, const BackwardArgs& a, float* lse2, float* delta, int64_t m_blocks,
                   cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads_q * m_blocks * kBM;
  prepare_kernel<T, D><<<unsigned((rows * (D / 8) + 255) / 256), 256, 0, stream>>>(p, a.dout, a.sdo, a.lse, lse2,
                                                                                  delta, m_blocks * kBM);
  TESSERA_LAUNCH_CHECK();
}

template <class T, int D>
void finish_typed(const Params& p, const BackwardArgs& a, const float* dq_acc, int64_t m_blocks, cudaStream_t stream) {
  using C = Shape<D>;
  const dim3 grid(unsigned(m_blocks * C::kParts * (32 * C::kCols / 8) / 256), unsigned(p.heads_q), unsigned(p.batch));
  const bool vector = a.sdq.d == 1 && reinterpret_cast<uintptr_t>(a.dq) % 16 == 0 && a.sdq.s % 8 == 0 &&
                      a.sdq.h % 8 == 0 && a.sdq.b % 8 == 0;
  finish_dq_kernel<T, C><<<grid, 256, 0, stream>>>(p, dq_acc, a.dq, a.sdq, m_blocks, vector);
  TESSERA_LAUNCH_CHECK();
}

template <class T, int D>
void sum_typed(const Params& p, const BackwardArgs& a, const float* dk_parts, const float* dv_parts, int split,
               cudaStream_t stream) {
  const int64_t rows_k = p.cu_q ? p.total_k : p.batch * p.seq_k, n = rows_k * (p.heads_q / p.group) * D / 8;
  sum_parts_kernel<T, D><<<unsigned((2 * n + 255) / 256), 256, 0, stream>>>(p, a, dk_parts, dv_parts, split, n);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

void sum_parts(const Params& p, const BackwardArgs& a, const float* dk_parts, const float* dv_parts, int split,
               cudaStream_t stream) {
  const bool half = p.dtype == DType::float16;
  if (p.dim == 64) {
    if (half) sum_typed<__half, 64>(p, a, dk_parts, dv_parts, split, stream);
    else sum_typed<__nv_bfloat16, 64>(p, a, dk_parts, dv_parts, split, stream);
  } else {
    if (half) sum_typed<__half, 128>(p, a, dk_parts, dv_parts, split, stream);
    else sum_typed<__nv_bfloat16, 128>(p, a, dk_parts, dv_parts, split, stream);
  }
}

void prepare(const Params& p, const BackwardArgs& a, float* lse2, float* delta, int64_t m_blocks,
             cudaStream_t stream) {
  const bool half = p.dtype == DType::float16;
  if (p.dim == 64) {
    if (half) prepare_typed<__half, 64>(p, a, lse2, delta, m_blocks, stream);
    else prepare_typed<__nv_bfloat16, 64>(p, a, lse2, delta, m_blocks, stream);
  } else {
    if (half) prepare_typed<__half, 128>(p, a, lse2, delta, m_blocks, stream);
    else prepare_typed<__nv_bfloat16, 128>(p, a, lse2, delta, m_blocks, stream);
  }
}

void finish_dq(const Params& p, const BackwardArgs& a, const float* dq_acc, int64_t m_blocks, cudaStream_t stream) {
  const bool half = p.dtype == DType::float16;
  if (p.dim == 64) {
    if (half) finish_typed<__half, 64>(p, a, dq_acc, m_blocks, stream);
    else finish_typed<__nv_bfloat16, 64>(p, a, dq_acc, m_blocks, stream);
  } else {
    if (half) finish_typed<__half, 128>(p, a, dq_acc, m_blocks, stream);
    else finish_typed<__nv_bfloat16, 128>(p, a, dq_acc, m_blocks, stream);
  }
}

}  // namespace tessera::attn::sm90_bwd
