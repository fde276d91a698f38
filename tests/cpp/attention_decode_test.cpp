// The decode tier against the reference (a few queries, keys split into chunks and merged; the
// split's tuning), and attention over a KV cache, contiguous or paged, with its bad entries.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "attention_testing.hpp"
#include "gpu.hpp"
#include "ops/attention/attention_reference.hpp"
#include "runtime/memory.hpp"
#include "runtime/tuner.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/tune.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::expect_error;
namespace ref = tessera::reference;
using namespace tessera::testing::attention;

// The decode tier: a few queries, keys split into chunks and merged; lengths that leave chunks
// empty or partly masked, fully masked rows, ALiBi (per head, per sequence and head) at each row
// packing.
TEST(AttentionGpu, DecodeKernelMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  const std::vector<GpuCase> cases = {
      {1, 1, 4097, 4, 4, 128, 128, spec(false, -1, -1, 0), false},
      {2, 3, 1000, 8, 2, 64, 64, spec(true, -1, -1, 0), false},    // GQA, causal
      {1, 16, 300, 2, 1, 256, 256, spec(false, 20, 3, 0), true},   // window, SDPA layout
      {1, 1, 5, 2, 2, 128, 128, spec(false, -1, -1, 0), false},    // fewer keys than a chunk
      {1, 4, 2, 2, 2, 64, 64, spec(true, -1, -1, 0), false},       // fully masked rows
      {2, 2, 777, 4, 4, 128, 128, spec(true, 100, -1, 25.0), false},  // window + soft-cap
      {1, 1, 4097, 4, 4, 128, 128, with_alibi(spec(false, -1, -1, 0), 4), false},    // ALiBi, 1 row a CTA
      {2, 3, 1000, 8, 2, 64, 64, with_alibi(spec(true, -1, -1, 0), 16), false},      // 8 rows: GQA x queries
      {1, 16, 300, 2, 1, 256, 256, with_alibi(spec(false, 20, 3, 0), 2), true},      // window, SDPA layout
      {2, 2, 777, 4, 4, 128, 128, with_alibi(spec(true, 100, -1, 25.0), 8), false},  // 2 rows; soft-cap
      {1, 4, 2, 2, 2, 64, 64, with_alibi(spec(true, -1, -1, 0), 2), false},          // 4 rows; masked rows
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_gpu_case(c, DType::float16, 2e-3, tessera::AttentionTier::decode);
    run_gpu_case(c, DType::bfloat16, 1e-2, tessera::AttentionTier::decode);
  }
}

// Tuning on first use measures the decode tier's split counts and stores the choice; the tuned
// call's result still matches the reference (every candidate writes the whole output).
TEST(AttentionGpu, DecodeTuningStoresItsSplit) {
  TESSERA_REQUIRE_GPU();
  const bool was = tessera::autotune_enabled();
  tessera::set_autotune(true);
  // An odd key bucket, so that an earlier run's cache is unlikely to hold it already.
  run_gpu_case({1, 2, 1500, 4, 2, 64, 64, spec(true, -1, -1, 0), false}, DType::float16, 2e-3,
               tessera::AttentionTier::decode);
  tessera::set_autotune(was);
  bool found = false;
  for (const auto& r : tessera::runtime::tune_cache(0).list())
    if (r.op == "attention" && r.key.find("|decode|float16|d64|ctas2|rows4|k2048") != std::string::npos) {
      found = true;
      EXPECT_EQ(r.entry.config.rfind("splits=", 0), 0u) << r.entry.config;
    }
  EXPECT_TRUE(found);
  EXPECT_TRUE(tessera::runtime::has_tuned(0, "attention"));
}

// A KV cache, contiguous per sequence or paged (blocks handed out in a shuffled order), against
// the varlen reference over each sequence's first cache_seqlens[b] keys. Lengths: one full, one
// empty (its rows see no key), one that ends inside a block.
struct KvCase {
  int64_t seq_q, d, block_size;  // block_size 0: no block table
  ref::AttentionSpec spec;       // ALiBi's slopes: [hq] or [b, hq], against each sequence's length
};

void run_kvcache_case(const KvCase& c, DType dt, double tol, tessera::AttentionTier tier) {
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const std::vector<int64_t> lens = {1000, 0, 517};
  const int64_t b = 3, hq = 8, hk = 2, d = c.d, capacity = 1024;
  const int64_t bs = c.block_size ? c.block_size : capacity, max_blocks = capacity / bs;
  const int64_t num_blocks = c.block_size ? b * max_blocks + 5 : b;  // a few blocks no sequence uses
  std::vector<int32_t> table(size_t(b * max_blocks));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 7 + 3) % size_t(num_blocks));
  std::vector<double> q = randn(b * c.seq_q * hq * d, 51), k = randn(num_blocks * bs * hk * d, 52),
                      v = randn(num_blocks * bs * hk * d, 53);
  tessera::runtime::DeviceBuffer bq, bk, bv, bo, bl, bt, bn, ba;
  const TensorView tq = upload(bq, q, dt, b, c.seq_q, hq, d, false), tk = upload(bk, k, dt, num_blocks, bs, hk, d, false),
                   tv = upload(bv, v, dt, num_blocks, bs, hk, d, false);
  const TensorView to = alloc(bo, {b, c.seq_q, hq, d}, dt), tl = alloc(bl, {b, hq, c.seq_q}, DType::float32);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  bn = tessera::runtime::DeviceBuffer(lens32.size() * 4);
  bt = tessera::runtime::DeviceBuffer(table.size() * 4);
  ASSERT_EQ(cudaMemcpy(bn.data(), lens32.data(), lens32.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bt.data(), table.data(), table.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView tn = TensorView::contiguous(bn.data(), DType::int32, {b}, dev);
  const TensorView tt = TensorView::contiguous(bt.data(), DType::int32, {b, max_blocks}, dev);
  TensorView ta;
  tessera::AttentionOptions o = options_of(c.spec);
  o.tier = tier, o.alibi_slopes = device_slopes(ba, ta, c.spec, hq);
  tessera::attention_kvcache(tq, tk, tv, to, &tl, tn, c.block_size ? &tt : nullptr, o, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Each sequence's keys gathered into the packed layout the varlen reference takes.
  std::vector<double> rq = rounded(dt, q), rk = rounded(dt, k), rv = rounded(dt, v), pk, pv;
  std::vector<int64_t> cq = {0}, ck = {0};
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t j = 0; j < lens[size_t(s)]; ++j) {
      const int64_t blk = c.block_size ? table[size_t(s * max_blocks + j / bs)] : s, row = j % bs;
      const size_t at = size_t(((blk * bs + row) * hk) * d);
      pk.insert(pk.end(), rk.begin() + at, rk.begin() + at + hk * d);
      pv.insert(pv.end(), rv.begin() + at, rv.begin() + at + hk * d);
    }
    cq.push_back(cq.back() + c.seq_q), ck.push_back(ck.back() + lens[size_t(s)]);
  }
  const auto want = ref::attention_varlen_forward(host(rq, {b * c.seq_q, hq, d}), host(pk, {ck.back(), hk, d}),
                                                  host(pv, {ck.back(), hk, d}), cq, ck, c.spec);
  std::vector<float> lf(size_t(b * hq * c.seq_q));
  ASSERT_EQ(cudaMemcpy(lf.data(), bl.data(), lf.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<double> lse(lf.size()), want_lse(lf.size());  // ours [b, hq, seq_q]; the reference's [hq, b * seq_q]
  for (int64_t s = 0; s < b; ++s)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        lse[size_t((s * hq + h) * c.seq_q + i)] = lf[size_t((s * hq + h) * c.seq_q + i)];
        want_lse[size_t((s * hq + h) * c.seq_q + i)] = want.lse[size_t(h * b * c.seq_q + s * c.seq_q + i)];
      }
  EXPECT_LE(rel_err(download(dt, bo, want.out.size()), want.out), tol) << "out";
  EXPECT_LE(rel_err(lse, want_lse), 1e-5) << "lse";
}

TEST(AttentionGpu, KvCacheMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  const std::vector<KvCase> cases = {
      {1, 128, 256, spec(false, -1, -1, 0)},
      {1, 128, 0, spec(false, -1, -1, 0)},      // no block table
      {4, 64, 16, spec(true, -1, -1, 0)},       // a few queries, causal from the cache's end
      {3, 128, 48, spec(true, 100, -1, 30.0)},  // a block size that is no power of two; window, soft-cap
      {20, 256, 64, spec(true, -1, -1, 0)},     // more queries than the decode tier takes
      {1, 128, 256, with_alibi(spec(false, -1, -1, 0), 8)},      // ALiBi [hq]
      {4, 64, 16, with_alibi(spec(true, -1, -1, 0), 24)},        // ALiBi [b, hq], causal
      {3, 128, 0, with_alibi(spec(false, 100, 2, 30.0), 24)},    // ALiBi, window, soft-cap
      {20, 128, 48, with_alibi(spec(true, -1, -1, 0), 24)},      // ALiBi, the generic tier
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("seq_q " + std::to_string(c.seq_q) + " head_dim " + std::to_string(c.d) + " block_size " +
                 std::to_string(c.block_size) + (c.spec.causal ? " causal" : "") +
                 (c.spec.alibi_slopes.empty() ? "" : " alibi x" + std::to_string(c.spec.alibi_slopes.size())));
    for (auto tier : {tessera::AttentionTier::automatic, tessera::AttentionTier::generic}) {
      run_kvcache_case(c, DType::bfloat16, 1e-2, tier);
      run_kvcache_case(c, DType::float16, 2e-3, tier);
    }
    run_kvcache_case(c, DType::float32, 1e-5, tessera::AttentionTier::automatic);
  }
}

// Lengths past the cache and block ids outside it make that sequence's rows NaN (checked on the
// device); the other sequences' rows are untouched by it. Bad arguments name themselves.
TEST(AttentionGpu, KvCacheBadEntriesGiveNaN) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t b = 3, bs = 16, max_blocks = 4, num_blocks = 12, h = 2, d = 64;
  tessera::runtime::DeviceBuffer bq, bk, bo, bl, bt(b * max_blocks * 4), bn(b * 4);
  const TensorView q = upload(bq, randn(b * h * d, 61), DType::bfloat16, b, 1, h, d, false);
  const TensorView k = upload(bk, randn(num_blocks * bs * h * d, 62), DType::bfloat16, num_blocks, bs, h, d, false);
  const TensorView o = alloc(bo, {b, 1, h, d}, DType::bfloat16), l = alloc(bl, {b, h, 1}, DType::float32);
  // Sequence 0: fine; 1: a length past max_blocks * block_size; 2: a block id past the cache.
  const std::vector<int32_t> lens = {40, 65, 40}, table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 9, 10};
  ASSERT_EQ(cudaMemcpy(bn.data(), lens.data(), 12, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bt.data(), table.data(), 48, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView n = TensorView::contiguous(bn.data(), DType::int32, {b}, dev);
  const TensorView t = TensorView::contiguous(bt.data(), DType::int32, {b, max_blocks}, dev);
  for (auto tier : {tessera::AttentionTier::decode, tessera::AttentionTier::generic}) {
    tessera::AttentionOptions opt;
    opt.tier = tier;
    tessera::attention_kvcache(q, k, k, o, &l, n, &t, opt, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<double> out = download(DType::bfloat16, bo, size_t(b * h * d));
    std::vector<float> lse(size_t(b * h));
    ASSERT_EQ(cudaMemcpy(lse.data(), bl.data(), lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t s = 0; s < b; ++s)
      for (int64_t e = 0; e < h * d; ++e) EXPECT_EQ(std::isnan(out[size_t(s * h * d + e)]), s != 0) << s << " " << e;
    for (int64_t s = 0; s < b; ++s)
      for (int64_t e = 0; e < h; ++e) EXPECT_EQ(std::isnan(lse[size_t(s * h + e)]), s != 0) << s;
  }
  const TensorView nf = TensorView::contiguous(bn.data(), DType::float32, {b}, dev);
  expect_error([&] { tessera::attention_kvcache(q, k, k, o, nullptr, nf, &t, {}, nullptr); }, ErrorKind::type,
               {"attention_kvcache", "'cache_seqlens'"});
  const TensorView n2 = TensorView::contiguous(bn.data(), DType::int32, {2}, dev);
  expect_error([&] { tessera::attention_kvcache(q, k, k, o, nullptr, n2, &t, {}, nullptr); }, ErrorKind::value,
               {"'cache_seqlens'", "batch 3"});
  const TensorView t1 = TensorView::contiguous(bt.data(), DType::int32, {b * max_blocks}, dev);
  expect_error([&] { tessera::attention_kvcache(q, k, k, o, nullptr, n, &t1, {}, nullptr); }, ErrorKind::value,
               {"'block_table'", "max_blocks"});
  const TensorView k3 = TensorView::contiguous(bk.data(), DType::bfloat16, {num_blocks, bs, 3, d}, dev);
  expect_error([&] { tessera::attention_kvcache(q, k3, k3, o, nullptr, n, &t, {}, nullptr); }, ErrorKind::value,
               {"'k_cache'", "[num_blocks, block_size, heads_kv, head_dim]"});
  tessera::AttentionOptions sm90;
  sm90.tier = tessera::AttentionTier::sm90;
  expect_error([&] { tessera::attention_kvcache(q, k, k, o, nullptr, n, &t, sm90, nullptr); }, ErrorKind::value,
               {"'tier'"});
}

}  // namespace
