// The Hopper tier of attention_backward (Sm90BackwardTier): when it applies, its grid, and the
// launch: the row-wise pass before (attention_backward_sm90_rows.cu), the kernel
// (attention_backward_sm90_kernel.cuh, which says how it works; compiled here, where its
// instances are launched), then the passes after.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/attention/attention.cuh"
#include "ops/attention/attention_backward_sm90.cuh"
#include "ops/attention/attention_backward_sm90_kernel.cuh"
#include "ops/attention/attention_sm90.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tma.hpp"

namespace tessera::attn {
namespace sm90_bwd {

template <class T, class C>
const void* kernel_of() {
  return reinterpret_cast<const void*>(attention_bwd_sm90_kernel<T, C, false, false>);
}

struct Maps {
  runtime::TmaShape q, k, v, dout;
};

Maps maps_of(const Params& p, const Strides& sdo) {
  const int64_t heads_kv = p.heads_q / p.group, batch = p.cu_q ? 1 : p.batch;
  const int64_t rows_q = p.cu_q ? p.total_q : p.seq_q, rows_k = p.cu_q ? p.total_k : p.seq_k;
  return {sm90::shape_of(p.sq, batch, rows_q, p.heads_q, p.dim, kBM),
          sm90::shape_of(p.sk, batch, rows_k, heads_kv, p.dim, kBN),
          sm90::shape_of(p.sv, batch, rows_k, heads_kv, p.dim, kBN),
          sm90::shape_of(sdo, batch, rows_q, p.heads_q, p.dim, kBM)};
}

// A CTA per 128 keys of a KV head of a sequence (the longest, for packed sequences), or `split`
// CTAs per key tile, each over group / split of the group's query heads, where a CTA per key tile
// would leave SMs idle (few keys, KV heads or sequences): the parts' dK and dV are summed after.
// Not in the deterministic mode, whose dq order counts one CTA per key tile and head.
int split_of(const Params& p) {
  const int64_t ctas = (p.seq_k + kBN - 1) / kBN * (p.heads_q / p.group) * p.batch;
  const int64_t enough = 3 * int64_t(runtime::device_props(p.device).multiProcessorCount) / 2;
  int split = 1;
  while (!p.deterministic && ctas * split < enough && p.group % (2 * split) == 0) split *= 2;
  return split;
}

dim3 grid_of(const Params& p) {
  return dim3(unsigned((p.seq_k + kBN - 1) / kBN), unsigned(p.heads_q / p.group * split_of(p)), unsigned(p.batch));
}

template <class T, int D>
void launch_typed(const Params& p, const BackwardArgs& a, cudaStream_t stream) {
  using C = Shape<D>;
  const Maps mp = maps_of(p, a.sdo);
  const char* op = "attention_backward";
  const CUtensorMap mq = runtime::tma_map(op, p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128);
  const CUtensorMap mk = runtime::tma_map(op, p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128);
  const CUtensorMap mv = runtime::tma_map(op, p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128);
  const CUtensorMap mdo = runtime::tma_map(op, p.dtype, a.dout, mp.dout, runtime::TmaSwizzle::b128);
  const int64_t m_blocks = (p.seq_q + kBM - 1) / kBM, rows = p.batch * p.heads_q * m_blocks * kBM;
  runtime::Scratch stats(std::size_t(2 * rows) * sizeof(float), stream);
  runtime::Scratch dq_acc(std::size_t(rows * D) * sizeof(float), stream);  // kParts * kCols = D
  TESSERA_CUDA_CHECK(cudaMemsetAsync(dq_acc.data(), 0, dq_acc.bytes(), stream));
  runtime::Scratch order;
  if (p.deterministic) {
    order = runtime::Scratch(std::size_t(rows / kBM * C::kParts) * sizeof(int), stream);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(order.data(), 0, order.bytes(), stream));
  }
  prepare(p, a, stats.as<float>(), stats.as<float>() + rows, m_blocks, stream);
  Bwd f{};
  f.dk = a.dk, f.dv = a.dv, f.sdk = a.sdk, f.sdv = a.sdv, f.dq_acc = dq_acc.as<float>();
  f.split = split_of(p);
  runtime::Scratch parts;  // split > 1: each part's dK and dV, [part][rows_k][heads_kv][D] each
  const int64_t heads_kv = p.heads_q / p.group, rows_k = p.cu_q ? p.total_k : p.batch * p.seq_k;
  if (f.split > 1) {
    f.part_stride = rows_k * heads_kv * D;
    parts = runtime::Scratch(std::size_t(2 * f.split * f.part_stride) * sizeof(float), stream);
    f.dk = parts.data(), f.dv = parts.as<float>() + f.split * f.part_stride;
    f.sdk = f.sdv = Strides{p.cu_q ? 0 : p.seq_k * heads_kv * D, heads_kv * D, D, 1};
  }
  f.order = order.as<int>();
  f.lse2 = stats.as<float>(), f.delta = stats.as<float>() + rows, f.m_blocks = m_blocks;
  f.seq_q = p.seq_q, f.seq_k = p.seq_k, f.cu_q = p.cu_q, f.cu_k = p.cu_k, f.group = int(p.group);
  f.scale = p.scale, f.softcap = p.softcap, f.mul = (p.softcap > 0 ? 1.f : p.scale) * kLog2e;
  f.causal = p.causal, f.window_left = p.window_left, f.window_right = p.window_right;
  f.alibi = p.alibi, f.alibi_b = p.alibi_b, f.alibi_h = p.alibi_h;
  const dim3 grid = grid_of(p);
  f.band = sm90::band_of(grid, p.device);
  const std::size_t smem = sizeof(Smem<T, C>) + 1024;
  const bool cap = p.softcap > 0, alibi = p.alibi != nullptr;
  auto kernel = cap ? (alibi ? attention_bwd_sm90_kernel<T, C, true, true>
                             : attention_bwd_sm90_kernel<T, C, true, false>)
                    : (alibi ? attention_bwd_sm90_kernel<T, C, false, true>
                             : attention_bwd_sm90_kernel<T, C, false, false>);
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, kThreads, smem, stream>>>(mq, mk, mv, mdo, f);
  TESSERA_LAUNCH_CHECK();
  finish_dq(p, a, dq_acc.as<float>(), m_blocks, stream);
  if (f.split > 1) sum_parts(p, a, static_cast<const float*>(f.dk), static_cast<const float*>(f.dv), f.split, stream);
}

}  // namespace sm90_bwd

bool Sm90BackwardTier::can_implement(const BackwardCall& c, const TierCtx& ctx) {
  using namespace sm90_bwd;
  const Params& p = c.p;
  const BackwardArgs& a = c.a;
  if (!ctx.allows(AttentionTier::sm90)) return false;
  if (p.dtype != DType::bfloat16 && p.dtype != DType::float16) return false;
  if (p.dim != p.dim_v || (p.dim != 64 && p.dim != 128)) return false;
  if (runtime::device_props(p.device).major != 9 ||
      !runtime::has_sm90a_code(kernel_of<__nv_bfloat16, Shape<128>>()))
    return false;
  if (p.heads_q > 65535 || p.batch > 65535 || std::max({p.seq_q, p.seq_k, p.total_q, p.total_k}) > INT32_MAX / 2)
    return false;
  // dK and dV are written, out (the forward's) read, 16 bytes a thread.
  const auto aligned = [](const void* ptr, const Strides& s) {
    return s.d == 1 && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.s % 8 == 0 && s.h % 8 == 0 && s.b % 8 == 0;
  };
  if (!aligned(a.dk, a.sdk) || !aligned(a.dv, a.sdv) || !aligned(p.out, p.so)) return false;
  const Maps mp = maps_of(p, a.sdo);
  return runtime::tma_can_map(p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, a.dout, mp.dout, runtime::TmaSwizzle::b128);
}

Sm90BackwardTier::Plan Sm90BackwardTier::plan(const BackwardCall& c, const TierCtx&) {
  return {sm90_bwd::grid_of(c.p), c.p.deterministic};
}

std::string Sm90BackwardTier::Plan::describe() const {
  return std::to_string(sm90_bwd::kBN) + " keys a CTA walking query tiles of " + std::to_string(sm90_bwd::kBM) +
         ", grid " + std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " + std::to_string(grid.z) +
         ", dq summed " + (deterministic ? "in a fixed order" : "in arrival order");
}

void Sm90BackwardTier::launch(const BackwardCall& c, const Plan&, cudaStream_t stream) {
  const Params& p = c.p;
  if (p.dim == 64) {
    if (p.dtype == DType::float16) sm90_bwd::launch_typed<__half, 64>(p, c.a, stream);
    else sm90_bwd::launch_typed<__nv_bfloat16, 64>(p, c.a, stream);
  } else {
    if (p.dtype == DType::float16) sm90_bwd::launch_typed<__half, 128>(p, c.a, stream);
    else sm90_bwd::launch_typed<__nv_bfloat16, 128>(p, c.a, stream);
  }
}

}  // namespace tessera::attn
