// The sm90 GEMM's launch for inputs of type T on schedule S: the kernel's instance for the
// operands' layouts (K-major or not) and the output dtype. Included only by the translation units
// that instantiate launch_layout<T, S> (gemm_sm90_<type>_<schedule>.cu, gemm_sm90_narrow.cu), one
// (T, S) or a few each, and by dev/gemm_lab.cu.
#pragma once

#include "ops/matrix/gemm_sm90_launch.cuh"

namespace tessera::matrix::sm90 {

template <class T, class OutT, class S, bool KA, bool KB>
void launch_typed(const GemmArgs& g, const Sm90Tier::Plan& p, cudaStream_t stream) {
  constexpr int BN = S::BN;
  // Grouped: B's batches are the groups (A and C are 2-d).
  const int64_t b_batch = g.offs && !g.offs_over_k ? g.groups : g.batch;
  const CUtensorMap ma = operand_map(g.dtype, layout_a(g), g.batch, kBM);
  const CUtensorMap mb = operand_map(g.dtype, layout_b(g), b_batch, BN);
  const Operand a{g.a_sb != 0 && g.batch > 1}, b{g.b_sb != 0 && b_batch > 1};
  const OutPath path = out_path(g);
  OutMaps maps{};
  if (path != kDrain)
    maps.c = runtime::tma_map("matmul", g.out_dtype, g.c, out_shape(g), runtime::TmaSwizzle::b128);
  if (path != kDrain && g.z)
    maps.z = runtime::tma_map("matmul", g.out_dtype, g.z, out_shape(g, EpiMap::z), runtime::TmaSwizzle::b128);
  if (path != kDrain && g.residual)
    maps.add = runtime::tma_map("matmul", g.out_dtype, g.residual, out_shape(g, EpiMap::r), runtime::TmaSwizzle::b128);
  else if (path != kDrain && g.beta != 0.0f)
    maps.add = maps.c;
  Work work;
  work.tiles.tiles_m = int((g.m + kBM - 1) / kBM);
  work.tiles.tiles_n = int((g.n + BN - 1) / BN);
  work.tiles.group = p.group;
  work.tiles.batch = g.batch;
  work.k_blocks = int((g.k + kBK<T> - 1) / kBK<T>);
  work.whole = p.splits > 1 ? p.whole : work.tiles.count();
  work.splits = p.splits;
  // Split tiles: their counters (two per tile and consumer, lent zero and left zero) and partials,
  // kBM x BN floats per tile and chunk.
  const std::size_t split_tiles = std::size_t(work.tiles.count() - work.whole);
  const runtime::SplitScratch split(p.splits, split_tiles * p.splits * kBM * BN, 2 * split_tiles * kConsumers,
                                    stream);
  work.partials = split.partials();
  work.counters = split.counters();
  // Grouped: the units before each group, the groups' ends, and the deal's counter.
  runtime::Scratch units(g.offs ? std::size_t(2 * g.groups + 2) * sizeof(int) : 0, stream);
  if (g.offs) {
    int* next = units.as<int>() + 2 * g.groups + 1;
    grouped_prepare(g, kBM, BN, units.as<int>(), units.as<int>() + g.groups + 1, stream, next);
    work.ends = units.as<int>() + g.groups + 1;
    if (g.offs_over_k) work.depth = true, work.block_k = kBK<T>;  // the groups' K ranges
    else work.groups = int(g.groups), work.prefix = units.as<int>(), work.next = next;
  }
  // Grouped, TMA-stored, kGroupMaps: the groups' own output maps (128-byte aligned: one spare
  // map's room).
  const bool group_maps = kGroupMaps<S, OutT> && work.groups && path == kTma2;
  runtime::Scratch maps_g(group_maps ? std::size_t(g.groups + 1) * sizeof(CUtensorMap) : 0, stream);
  if (group_maps) {
    auto* first = reinterpret_cast<CUtensorMap*>((reinterpret_cast<uintptr_t>(maps_g.data()) + 127) & ~uintptr_t(127));
    group_out_maps(maps.c, work.ends, work.groups, first, stream);
    work.group_maps = first;
  }
  const std::size_t smem = sizeof(Smem<T, S>) + 1024;
  static_assert(sizeof(Smem<T, S>) + 1024 <= 227 * 1024, "the stages, staging and prefix fit");
  auto kernel = gemm_sm90_kernel<T, OutT, S, KA, KB>;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<p.grid, kThreads, smem, stream>>>(ma, mb, maps, a, b, path, Epilogue<OutT>::from(g),
                                             work, g.m, g.n);
  TESSERA_LAUNCH_CHECK();
}

// Outputs: the input's dtype or float32 for 16-bit inputs, float32 for tf32, bfloat16, float16 or
// float32 for fp8.
template <class T, class S, bool KA, bool KB>
void launch_out(const GemmArgs& g, const Sm90Tier::Plan& p, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_typed<T, float, S, KA, KB>(g, p, stream);
  else if constexpr (sizeof(T) == 2) launch_typed<T, T, S, KA, KB>(g, p, stream);
  else if constexpr (sizeof(T) == 1) {
    if (g.out_dtype == DType::float16) launch_typed<T, __half, S, KA, KB>(g, p, stream);
    else launch_typed<T, __nv_bfloat16, S, KA, KB>(g, p, stream);
  }
}

template <class T, class S>
void launch_layout(const GemmArgs& g, const Sm90Tier::Plan& p, cudaStream_t stream) {
  const bool ka = layout_a(g).k_major(), kb = layout_b(g).k_major();
  if constexpr (sizeof(T) == 2) {
    if (ka && kb) launch_out<T, S, true, true>(g, p, stream);
    else if (ka) launch_out<T, S, true, false>(g, p, stream);
    else if (kb) launch_out<T, S, false, true>(g, p, stream);
    else launch_out<T, S, false, false>(g, p, stream);
  } else {
    launch_out<T, S, true, true>(g, p, stream);  // operand_ok took K-major operands only
  }
}

}  // namespace tessera::matrix::sm90
