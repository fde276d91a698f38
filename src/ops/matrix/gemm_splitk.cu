// Split-K: the sm90 tier over chunks of K into float32 scratch, then an ordered sum of the chunks
// with the epilogue. For the shapes where the output tiles leave most SMs idle (a few rows
// against long K: the projections of a decoder at small batch), the chunks put those SMs to work;
// the scratch traffic (splits x M x N floats, written once and read once) is small beside the
// operands there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "runtime/scratch.hpp"

namespace tessera::matrix {
namespace {

constexpr int kTile = 128;
constexpr int kMinChunk = 1024;  // K per chunk, at least: shorter chunks spend more on the sum

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The sm90 kernel's stage depth: 128 bytes of K.
int64_t block_k(DType dt) { return 128 / int64_t(dtype_size(dt)); }

// The number of chunks: the tuner's where it chose (and K's blocks divide evenly); else as many
// as fill the SMs the output tiles leave idle, dividing K's blocks evenly (each chunk's map then
// ends exactly at its last block), each chunk kMinChunk at least; 1 where splitting does not pay.
int choose_splits(const GemmArgs& g, const GemmCtx& ctx) {
  const int64_t bk = block_k(g.dtype);
  if (g.batch != 1 || g.k % bk != 0 || g.config.splits == 1) return 1;
  const int64_t blocks = g.k / bk;
  if (g.config.splits >= 2) return blocks % g.config.splits == 0 ? g.config.splits : 1;
  const int64_t tiles = ceil_div(g.m, kTile) * ceil_div(g.n, kTile);
  if (2 * tiles > ctx.sms) return 1;
  const int64_t most = std::min<int64_t>(ctx.sms / tiles, g.k / kMinChunk);
  for (int64_t s = most; s >= 2; --s)
    if (blocks % s == 0) return int(s);
  return 1;
}

// The chunked problem: batch b is chunk b (its K offset b * chunk), into float32 `ws`.
GemmArgs chunked(const GemmArgs& g, int splits, void* ws) {
  GemmArgs s = g;
  const int64_t chunk = g.k / splits;
  s.batch = splits, s.k = chunk;
  s.a_sb = chunk * g.a_sk, s.b_sb = chunk * g.b_sk;
  s.c = ws, s.out_dtype = DType::float32;
  s.c_sb = g.m * g.n, s.c_sm = g.n, s.c_sn = 1;
  s.bias = nullptr, s.residual = nullptr;
  s.alpha = 1.0f, s.beta = 0.0f, s.activation = Activation::none;
  s.scale_a = s.scale_b = nullptr;
  return s;
}

// out = epilogue(sum of the chunks), in chunk order (the same bits every run), two columns a thread.
template <class OutT>
__global__ void split_k_sum(const float* __restrict__ ws, int splits, int64_t m, int64_t n,
                            const Epilogue<OutT> epi_args) {
  const Epilogue<OutT> epi = epi_args.resolved();
  const int64_t pairs = (n + 1) / 2, chunk = m * n;
  epi.template with_activation<!std::is_same_v<OutT, float>>([&](auto act) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * pairs;
         i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t row = i / pairs, col = 2 * (i % pairs);
      const bool both = col + 1 < n;
      const float* p = ws + row * n + col;
      float s0 = 0.0f, s1 = 0.0f;
      for (int c = 0; c < splits; ++c, p += chunk) {
        s0 += p[0];
        if (both) s1 += p[1];
      }
      epi.store_pair(epi.row(0, row), epi.cols(col, both), s0, s1, act);
    }
  });
}

template <class OutT>
void launch_sum(const GemmArgs& g, const float* ws, int splits, int sms, cudaStream_t stream) {
  const int64_t work = g.m * ((g.n + 1) / 2);
  const int blocks = int(std::min<int64_t>(ceil_div(work, 256), int64_t(sms) * 8));
  split_k_sum<OutT><<<blocks, 256, 0, stream>>>(ws, splits, g.m, g.n, Epilogue<OutT>::from(g));
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

std::string SplitKTier::Plan::describe() const {
  return std::to_string(splits) + " chunks of K = " + std::to_string(chunk) + " (" +
         inner.describe() + "), then their sum with the epilogue";
}

bool SplitKTier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major != 9 || g.k == 0) return false;
  const int splits = choose_splits(g, ctx);
  return splits >= 2 && Sm90Tier::can_implement(chunked(g, splits, nullptr), ctx);
}

SplitKTier::Plan SplitKTier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  Plan p;
  p.splits = choose_splits(g, ctx);
  p.chunk = g.k / p.splits;
  p.inner = Sm90Tier::plan(chunked(g, p.splits, nullptr), ctx);
  p.sms = ctx.sms;
  return p;
}

void SplitKTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  runtime::Scratch ws(std::size_t(p.splits) * std::size_t(g.m) * std::size_t(g.n) * sizeof(float),
                      stream);
  Sm90Tier::launch(chunked(g, p.splits, ws.data()), p.inner, stream);
  switch (g.out_dtype) {
    case DType::float32: launch_sum<float>(g, ws.as<float>(), p.splits, p.sms, stream); break;
    case DType::float16: launch_sum<__half>(g, ws.as<float>(), p.splits, p.sms, stream); break;
    default: launch_sum<__nv_bfloat16>(g, ws.as<float>(), p.splits, p.sms, stream); break;
  }
}

}  // namespace tessera::matrix
