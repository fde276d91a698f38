// The Hopper GEMM kernel's host side (gemm_sm90.cuh has the kernel): the operands' and outputs'
// tensor maps, which output path the epilogue takes, the schedule and split chosen by estimated
// waves (choose), and the launch, whose kernels gemm_sm90_instance.cuh instantiates.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "ops/matrix/gemm_sm90.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tma.hpp"

namespace tessera::matrix::sm90 {

// How an operand of `rows` rows (M or N) and `k` columns lies in memory: K contiguous (row stride
// `sr`) or its rows contiguous (K stride `sk`), batch stride `sb` (0: shared).
struct OperandLayout {
  const void* p;
  int64_t rows, k, sr, sk, sb;
  bool k_major() const { return sk == 1; }
};

// Its map, in boxes of what one stage takes (`box_rows` rows): a 3-d map only where batches
// differ. K-major: kBK x box_rows boxes over (K, rows); MN-major: 64 x kBK boxes over (rows, K).
inline runtime::TmaShape operand_shape(DType dt, const OperandLayout& o, int64_t batch,
                                       int box_rows) {
  const uint32_t bk = 128 / uint32_t(dtype_size(dt));
  runtime::TmaShape sh;
  sh.rank = o.sb != 0 && batch > 1 ? 3 : 2;
  const bool km = o.k_major();
  sh.dims[0] = uint64_t(km ? o.k : o.rows), sh.dims[1] = uint64_t(km ? o.rows : o.k);
  sh.dims[2] = uint64_t(batch);
  sh.strides[0] = 1, sh.strides[1] = uint64_t(km ? o.sr : o.sk), sh.strides[2] = uint64_t(o.sb);
  sh.box[0] = km ? bk : 64, sh.box[1] = km ? uint32_t(box_rows) : bk, sh.box[2] = 1;
  return sh;
}

// MN-major operands are for 16-bit dtypes: wgmma transposes only those.
inline bool operand_ok(DType dt, const OperandLayout& o, int64_t batch, int box_rows) {
  if (!o.k_major() && (o.sr != 1 || dtype_size(dt) != 2)) return false;
  return o.rows <= INT32_MAX && o.k <= INT32_MAX && batch <= INT32_MAX &&
         runtime::tma_can_map(dt, o.p, operand_shape(dt, o, batch, box_rows), runtime::TmaSwizzle::b128);
}

inline CUtensorMap operand_map(DType dt, const OperandLayout& o, int64_t batch, int box_rows) {
  return runtime::tma_map("matmul", dt, o.p, operand_shape(dt, o, batch, box_rows),
                          runtime::TmaSwizzle::b128);
}

// The epilogue's maps: of the output, the pre-activation output (N columns) or the residual, for
// TMA copies in boxes of 128 bytes of columns by a warp's rows (kWarpRows), 3-d where batches
// differ.
enum class EpiMap { c, z, r };
inline runtime::TmaShape out_shape(const GemmArgs& g, EpiMap which = EpiMap::c) {
  const int rows = kWarpRows;
  runtime::TmaShape sh;
  sh.rank = g.batch > 1 ? 3 : 2;
  sh.dims[0] = uint64_t(which == EpiMap::z ? g.n : out_cols(g)), sh.dims[1] = uint64_t(g.m);
  sh.dims[2] = uint64_t(g.batch);
  sh.strides[0] = 1;
  sh.strides[1] = uint64_t(which == EpiMap::z ? g.z_sm : which == EpiMap::r ? g.r_sm : g.c_sm);
  sh.strides[2] = uint64_t(which == EpiMap::z ? g.z_sb : which == EpiMap::r ? g.r_sb : g.c_sb);
  sh.box[0] = 128 / uint32_t(dtype_size(g.out_dtype)), sh.box[1] = uint32_t(rows), sh.box[2] = 1;
  return sh;
}

// TMA stores (and, with beta, loads of the old output) take outputs with contiguous rows that the
// copy engine can address, without beta where there is an activation or a pre-activation output;
// a residual likewise (loaded as beta's old output is), without beta, an activation or a
// pre-activation output. The others go through drain.
inline OutPath out_path(const GemmArgs& g) {
  const bool plain = g.activation == Activation::none && !g.z;
  if ((g.beta != 0.0f && (!plain || g.residual)) || (g.residual && !plain) || g.c_sn != 1 ||
      (g.batch > 1 && g.c_sb == 0) || g.m > INT32_MAX || g.n > INT32_MAX || g.batch > INT32_MAX)
    return kDrain;
  const runtime::TmaShape sh = out_shape(g);
  if (!runtime::tma_can_map(g.out_dtype, g.c, sh, runtime::TmaSwizzle::b128)) return kDrain;
  if (g.z && (g.z_sn != 1 || !runtime::tma_can_map(g.out_dtype, g.z, out_shape(g, EpiMap::z),
                                                    runtime::TmaSwizzle::b128)))
    return kDrain;
  if (g.residual && (g.r_sn != 1 || (g.batch > 1 && g.r_sb == 0) ||
                     !runtime::tma_can_map(g.out_dtype, g.residual, out_shape(g, EpiMap::r), runtime::TmaSwizzle::b128)))
    return kDrain;
  return sh.rank == 3 ? kTma3 : kTma2;
}

inline OperandLayout layout_a(const GemmArgs& g) { return {g.a, g.m, g.k, g.a_sm, g.a_sk, g.a_sb}; }
inline OperandLayout layout_b(const GemmArgs& g) { return {g.b, g.n, g.k, g.b_sn, g.b_sk, g.b_sb}; }

// The output tiles of BN columns.
inline int64_t tiles(const GemmArgs& g, int bn) {
  return ((g.m + kBM - 1) / kBM) * ((g.n + bn - 1) / bn) * g.batch;
}

// A split tile's chunks are this many K blocks at least: each pays a pipeline fill and its share
// of the partial sums' traffic.
constexpr int64_t kMinChunkBlocks = 8;

// Pingpong's 128-wide tiles read more shared memory and L2 per FLOP than cooperative's 256-wide
// ones: the time of a tile's worth of work on pingpong, relative to cooperative.
constexpr double kPingPongCost = 1.08;

// A split tile's partial sums, written and read back through L2, cost about this many K blocks'
// worth of a tile's time.
constexpr double kSplitCost = 4.0;

struct Choice {
  bool pingpong = false;
  int splits = 1;
  int64_t whole = 0;
};

// Where tiles leave the last wave (or the only one) partly empty, cooperative splits that wave's
// tiles into chunks of K that share the SMs out (the count with the least estimated time, each
// chunk kMinChunkBlocks long at least; the tuner's count where it chose one);
// pingpong fills it with tiles half the size. Each schedule's time is estimated in cooperative
// tile-times: whole waves, plus the last wave's chunk, and the cheaper one runs. Pingpong is also
// taken where the tuner or TESSERA_MATMUL_SCHEDULE (pingpong or cooperative, for measuring them
// against each other) says so.
inline Choice choose(const GemmArgs& g, const GemmCtx& ctx) {
  // 0: by the estimate, 1: pingpong, 2: cooperative; read once per process.
  static const int forced = [] {
    const char* e = std::getenv("TESSERA_MATMUL_SCHEDULE");
    const std::string v = e ? e : "";
    return v == "pingpong" ? 1 : v == "cooperative" ? 2 : 0;
  }();
  const int64_t sms = std::max(1, ctx.sms), coop = tiles(g, Cooperative::BN);
  const int64_t k_blocks = (g.k * int64_t(dtype_size(g.dtype)) + 127) / 128;
  const int64_t rem = coop % sms;
  Choice c;
  // A tile's chunks wait for each other, so they must all be resident at once. Chunks store
  // shares of the tile's 128-byte column blocks; where there are more chunks than blocks, some
  // store nothing and only leave their partial sums, which pays where the chunks stay long
  // (kMinChunkBlocks twice over).
  const int64_t most = std::min<int64_t>(k_blocks, sms);
  const int64_t blocks_out = Cooperative::BN * int64_t(dtype_size(g.out_dtype)) / 128;
  auto coop_time = [&](int64_t splits) {  // in tile-times
    if (splits <= 1) return double((coop + sms - 1) / sms);
    return double(coop / sms) + 1.0 / splits + kSplitCost / k_blocks;
  };
  if (g.config.splits >= 1) {
    c.splits = int(std::min<int64_t>({g.config.splits, most, std::max<int64_t>(1, sms / std::max<int64_t>(rem, 1))}));
  } else if (rem) {
    // The chunks of a split tile wait for each other: all of them in one wave, else one waits
    // for a chunk that a later round runs.
    for (int64_t s = 2; s <= std::min(most, k_blocks / kMinChunkBlocks) && rem * s <= sms; ++s)
      if ((s <= blocks_out || k_blocks >= 2 * kMinChunkBlocks * s) && coop_time(s) < coop_time(c.splits))
        c.splits = int(s);
  }
  if (is_gated(g.activation)) c.splits = 1;  // store_swiglu stores whole tiles only
  c.whole = c.splits > 1 ? coop - rem : coop;
  const double pp_time = double((tiles(g, PingPong::BN) + sms - 1) / sms) / 2 * kPingPongCost;
  if (g.config.schedule) c.pingpong = g.config.schedule == 2;
  else if (forced) c.pingpong = forced == 1;
  // With beta and few K blocks (a gradient accumulated in place over a short K: the fused loss's
  // d_weight per chunk) the epilogue's read of C outweighs each tile's main loop; pingpong runs
  // one consumer's epilogue under the other's main loop.
  else c.pingpong = pp_time < coop_time(c.splits) || (g.beta != 0.0f && k_blocks <= 8);
  if (c.pingpong) c.splits = 1;
  return c;
}

// The launch for inputs of type T on schedule S (the kernel's instances for every operand layout
// and output dtype), defined in gemm_sm90_instance.cuh and instantiated once per (T, S) in a
// translation unit of its own (gemm_sm90_<type>_<schedule>.cu, gemm_sm90_narrow.cu), so that a
// build's cores share the kernels: the tier's host side (gemm_sm90.cu) compiles none of them.
template <class T, class S>
void launch_layout(const GemmArgs& g, const Sm90Tier::Plan& p, cudaStream_t stream);

// The launch for inputs of type T (bf16, fp16; float as tf32; fp8).
template <class T>
void launch_sm90(const GemmArgs& g, const Sm90Tier::Plan& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>)
    if (p.blocks) return launch_layout<T, BlockScaled>(g, p, stream);
  if (p.pingpong) launch_layout<T, PingPong>(g, p, stream);
  else launch_layout<T, Cooperative>(g, p, stream);
}

}  // namespace tessera::matrix::sm90
