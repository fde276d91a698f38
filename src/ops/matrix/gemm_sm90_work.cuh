// The sm90 GEMM kernel's shapes and its units of work (gemm_sm90.cuh has the kernel): the tile and
// stage sizes, the schedules, shared memory, the epilogue's maps and paths, and Work, the
// persistent grid's units (whole tiles, split tiles' chunks of K, or a grouped call's tiles group
// by group).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ops/matrix/gemm.cuh"

namespace tessera::matrix::sm90 {

constexpr int kBM = 128, kConsumers = 2;
// A stage holds 128 bytes of K per row (the swizzle's width): 64 16-bit values, 32 tf32, 128 fp8.
template <class T>
constexpr int kBK = 128 / int(sizeof(T));
constexpr int kKSteps = 4;  // wgmma steps per stage, 32 bytes of K each
constexpr int kThreads = 128 * (kConsumers + 1);
// The epilogue passes a consumer's accumulators through shared memory kEpiCols columns at a
// time; rows padded to kEpiStride floats put a warp's fragment writes and its row reads on
// distinct banks.
constexpr int kEpiCols = 32, kEpiStride = kEpiCols + 8;
// Grouped calls (GemmArgs::offs) of at most this many groups: their units' prefix sums are held in
// shared memory, which the stages leave about 2 KB of.
constexpr int kMaxGroups = 256;
// Grouped calls deal their units from a counter (Work::next), not by a fixed stride: a tile that
// ends mid-group stores through drain, slower than a TMA store, so fixed strides let the CTAs
// drift apart and a group's M tiles at one N tile (which read the same B tile) stop meeting in
// L2. The producer takes each unit and hands it to the consumers through a ring of this many slots.
constexpr int kDealSlots = 8;

// How the consumers share the work; both walk the CTA's tiles (kBM x BN) in the same order.
//   cooperative  both consumers on each tile, rows 0-63 and 64-127 (64 x 256 accumulators each)
//   pingpong     each consumer a whole tile (two 64 x 128 fragments), the consumers on
//                alternate tiles and their main loops in turns: one's epilogue runs while the
//                other's main loop keeps the tensor cores busy
//   block-scaled cooperative on 128 x 128 tiles, for scaled_mm's block-wise scales: each stage
//                (one 128-deep block of K) multiplied into a second set of accumulators, which
//                are scaled and added to the first (64 x 128 each: both fit where 64 x 256
//                would not); a stage less than fits, for its columns' scales (col_scales)
template <int BN_, bool PingPong, bool Blocks = false>
struct Schedule {
  static constexpr int BN = BN_;
  static constexpr bool kPingPong = PingPong;
  static constexpr bool kBlocks = Blocks;
  static constexpr int kStages = PingPong || Blocks ? 5 : 4;         // as many as fit
  static constexpr int kRows = PingPong ? kBM : kBM / kConsumers;    // a consumer's tile rows
  static constexpr int kReaders = PingPong ? 1 : kConsumers;         // consumers reading a stage
};
using Cooperative = Schedule<256, false>;
using PingPong = Schedule<128, true>;
using BlockScaled = Schedule<128, false, true>;

// A tile's output in 128-byte column blocks (sub-tiles): TMA stores go one at a time, and a split
// tile's chunks store shares of them.
template <class S, class OutT>
constexpr int kSubtiles = S::BN * int(sizeof(OutT)) / 128;


template <class T, class S>
struct alignas(1024) Smem {
  T a[S::kStages][kBM * kBK<T>];    // each stage 1024-byte aligned (16 KB)
  T b[S::kStages][S::BN * kBK<T>];  // (16 or 32 KB)
  // Each consumer's output staging: two buffers of kRows 128-byte rows (TMA stores, store_tma),
  // or float32 rows of kEpiStride (drain).
  unsigned char out[kConsumers][2 * S::kRows * 128];
  static_assert(S::kRows * kEpiStride * sizeof(float) <= 2 * S::kRows * 128, "drain's rows fit");
  // Block-scaled, B's scales by columns (wgrad's): each stage's block of K's scales of the tile's
  // columns, copied with its operands (ColumnScales).
  float col_scales[S::kBlocks ? S::kStages : 1][S::kBlocks ? S::BN : 1];
  uint64_t full[S::kStages];
  uint64_t empty[S::kStages];
  uint64_t turn[kConsumers];  // pingpong: the other consumer's main loop is done, go
  uint64_t old[kConsumers][4];  // beta: a warp's rows of the old output have landed in staging
  int prefix[kMaxGroups + 1];   // grouped: Work::prefix
  int deal[kDealSlots];         // grouped: the units the producer dealt (deal_unit)
  uint64_t deal_full[kDealSlots];
  uint64_t deal_empty[kDealSlots];  // every consumer thread that reads the slot arrives
};

// The maps of the epilogue's TMA copies, side by side so that one pointer reaches them all: the
// output's and the pre-activation output's (where asked for) stores, and the loads of what the
// values are added to (`add`: the output's own map for beta, the residual's for a residual).
struct OutMaps {
  CUtensorMap c, z, add;
};

struct Operand {
  bool batched;  // a 3-d map, the batch its outer coordinate (a 2-d map is shared by all)
};

// How the output leaves: 0 through `drain` (any layout and epilogue); 2 or 3: TMA stores
// (store_tma) through the output's 2-d or 3-d (batched) map (out_path says which epilogues).
enum OutPath : int { kDrain = 0, kTma2 = 2, kTma3 = 3 };

// The kernels whose grouped tiles past their group's end store by TMA through the group's own map
// (Work::group_maps): a third copy of the epilogue spills in the others, which drain those tiles.
template <class S, class OutT>
constexpr bool kGroupMaps = sizeof(OutT) == 2 && !S::kPingPong && !S::kBlocks;

// Grouped over rows: into `out` (groups maps, 128-byte aligned) each group's copy of the output's
// 2-d map `c` with its rows cut at the group's end (`ends`, on the device). Stream-ordered.
void group_out_maps(const CUtensorMap& c, const int* ends, int groups, CUtensorMap* out, cudaStream_t stream);

// The persistent grid's units of work, in order: the first `whole` tiles (of TileOrder) whole,
// then every later tile as `splits` chunks of its K blocks, which consecutive CTAs take in the
// same wave. Where the tiles leave the last wave (or the only one) mostly empty, its tiles are
// split so that the SMs share them (split_k).
struct Work {
  TileOrder tiles;
  int64_t whole = 0;
  int splits = 1;
  int k_blocks = 0;  // of a whole tile
  // Where a split tile's chunks leave their float32 partial sums (per chunk and consumer, in the
  // accumulators' own order) and count themselves: the last to arrive sums them in chunk order.
  float* partials = nullptr;
  int* counters = nullptr;  // zero at launch and left zero: two per split tile and consumer
  // Grouped (GemmArgs::offs): the units are each group's tiles (of TileOrder with its rows) in
  // turn, whole; `prefix` (grouped_prepare's, copied into shared memory by the kernel) counts the
  // units before each group, `ends` holds the groups' clamped ends.
  int groups = 0;
  const int* prefix = nullptr;
  const int* ends = nullptr;
  int* next = nullptr;  // grouped: the units dealt so far past the first wave (zeroed by grouped_prepare)
  // Grouped, TMA-stored, kGroupMaps: each group's copy of the output's map, its rows cut at the
  // group's end (group_out_maps), through which a tile that ends mid-group stores.
  const CUtensorMap* group_maps = nullptr;
  // Grouped over K (GemmArgs::offs_over_k): tile order's batch b is group b, whose K range
  // [ends[b - 1], ends[b]) gives the unit's K blocks (of `block_k`); the blocks it shares with a
  // neighbour are masked in shared memory (mask_stage).
  bool depth = false;
  int block_k = 0;

  __host__ __device__ int64_t count() const { return whole + (tiles.count() - whole) * splits; }
  // `prefix`: the shared-memory copy of prefix.
  __device__ __forceinline__ int64_t count(const int* prefix_s) const {
    return groups ? prefix_s[groups] : count();
  }

  struct Unit {
    int64_t batch;
    int tm, tn;
    int kb0, kb1;     // the K blocks [kb0, kb1)
    int64_t split;    // the split tile's index (-1: whole)
    int chunk;
    int m0;           // the tile's first row (TMA's coordinates are 32-bit)
    int m_end;        // rows from here on are not the unit's (grouped: its group's end)
    int k_begin, k_end;  // depth: the group's K range
  };
  __device__ __forceinline__ Unit at(int64_t u, const int* prefix_s) const {
    if (groups) return grouped_at(int(u), prefix_s);
    Unit w = at(u);
    w.m0 = w.tm * kBM;
    w.m_end = INT32_MAX;
    if (depth) {
      w.k_begin = w.batch ? ends[w.batch - 1] : 0, w.k_end = ends[w.batch];
      w.kb0 = w.k_begin / block_k, w.kb1 = (w.k_end + block_k - 1) / block_k;
    }
    return w;
  }
  // Unit u of a grouped call: its group (the last g with prefix_s[g] <= u), then its tile in the
  // group's own TileOrder.
  __device__ __forceinline__ Unit grouped_at(int u, const int* prefix_s) const {
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix_s[mid] <= u) lo = mid;
      else hi = mid - 1;
    }
    const TileOrder own{(prefix_s[lo + 1] - prefix_s[lo]) / tiles.tiles_n, tiles.tiles_n, tiles.group, 1};
    Unit w;
    int64_t b;
    own.at(u - prefix_s[lo], b, w.tm, w.tn);
    w.batch = lo;
    w.kb0 = 0, w.kb1 = k_blocks, w.split = -1, w.chunk = 0;
    w.m0 = (lo ? ends[lo - 1] : 0) + w.tm * kBM;
    w.m_end = ends[lo];
    return w;
  }
  __device__ __forceinline__ Unit at(int64_t u) const {
    Unit w;
    w.split = u < whole ? -1 : (u - whole) / splits;
    w.chunk = u < whole ? 0 : int((u - whole) % splits);
    tiles.at(u < whole ? u : whole + w.split, w.batch, w.tm, w.tn);
    const int parts = u < whole ? 1 : splits;
    w.kb0 = int(int64_t(k_blocks) * w.chunk / parts);
    w.kb1 = int(int64_t(k_blocks) * (w.chunk + 1) / parts);
    return w;
  }
};

}  // namespace tessera::matrix::sm90
