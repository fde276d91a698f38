// The Hopper GEMM tier (sm90_wgmma): when it applies, and how it is planned (schedule, grid, raster
// group). The kernel itself is in gemm_sm90.cuh, its launch in gemm_sm90_launch.cuh; its instances
// compile apart (gemm_sm90_instance.cuh).
#include "ops/matrix/gemm_sm90_launch.cuh"

namespace tessera::matrix {
namespace sm90 {

// Compiled with the kernels' architectures: whether this library holds sm_90a code for the GPU.
__global__ void sm90a_probe() {}

constexpr int kMapWarps = 8;  // group_out_maps: a warp a group

__global__ void __launch_bounds__(32 * kMapWarps)
    group_out_maps_kernel(const __grid_constant__ CUtensorMap c, const int* ends, int groups, CUtensorMap* out) {
  __shared__ alignas(128) CUtensorMap tmp[kMapWarps];
  const int warp = int(threadIdx.x / 32), g = int(blockIdx.x) * kMapWarps + warp;
  if (g >= groups) return;  // the whole warp
  // An empty group has no tile: its map is never used, but an extent must be positive.
  tile::tma_map_with_extent<1>(out + g, &tmp[warp], c, uint32_t(max(ends[g], 1)));
}

void group_out_maps(const CUtensorMap& c, const int* ends, int groups, CUtensorMap* out, cudaStream_t stream) {
  group_out_maps_kernel<<<unsigned((groups + kMapWarps - 1) / kMapWarps), 32 * kMapWarps, 0, stream>>>(c, ends,
                                                                                                     groups, out);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace sm90

namespace {
using namespace sm90;

// Whether the kernels hold sm_90a code (the build asked for it) on this GPU: a process's GPUs
// that pass `major == 9` share the answer.
bool has_sm90a_code() {
  return runtime::has_sm90a_code(reinterpret_cast<const void*>(sm90a_probe));
}

bool out_ok(DType in, DType out) {
  if (out == DType::float32) return true;
  if (in == DType::float8_e4m3fn || in == DType::float8_e5m2)
    return out == DType::bfloat16 || out == DType::float16;
  return out == in && in != DType::float32;
}

// Activations swiglu and geglu (store_swiglu): the kernels that hold it (kSwigluKernel: a 16-bit output of
// the inputs' dtype, K-major operands), N whole 128-column blocks, nothing added after the
// activation, and both outputs stored by TMA in either schedule.
bool gated_ok(const GemmArgs& g) {
  return (g.dtype == DType::bfloat16 || g.dtype == DType::float16) && g.out_dtype == g.dtype &&
         layout_a(g).k_major() && layout_b(g).k_major() && g.n % 128 == 0 && !g.residual &&
         g.beta == 0.0f && out_path(g) != kDrain;
}

// Grouped calls: 16-bit inputs, the plain product (alpha aside). Over rows: up to kMaxGroups
// groups (their prefix sums in shared memory), a 2-d output, A K-major. Over K: both operands MN-major
// (mask_stage zeroes whole K rows), C's batch a group.
bool grouped_ok(const GemmArgs& g) {
  const bool plain = (g.dtype == DType::bfloat16 || g.dtype == DType::float16) && g.activation == Activation::none &&
                     !g.bias && !g.residual && !g.z && g.beta == 0.0f;
  if (g.offs_over_k)
    return plain && g.batch == g.groups && !layout_a(g).k_major() && !layout_b(g).k_major() && g.a_sb == 0 && g.b_sb == 0;
  // Over rows, A K-major: a group's tiles start at any row, and an M-major A's boxes would then start
  // at any M, its contiguous dimension, which faults.
  return plain && g.groups <= kMaxGroups && g.batch == 1 && layout_a(g).k_major();
}

}  // namespace

std::string Sm90Tier::Plan::describe() const {
  if (blocks)
    return "block-scaled cooperative, " + std::to_string(kBM) + " x " + std::to_string(BlockScaled::BN) +
           " tiles, " + std::to_string(BlockScaled::kStages) + " stages, group " + std::to_string(group) + ", " +
           std::to_string(grid) + " persistent CTAs";
  std::string split;
  if (splits > 1)
    split = ", the tiles from " + std::to_string(whole) + " on split into " + std::to_string(splits) +
            " chunks of K";
  return std::string(pingpong ? "pingpong, " : "cooperative, ") + std::to_string(kBM) + " x " +
         std::to_string(pingpong ? PingPong::BN : Cooperative::BN) + " tiles, " +
         std::to_string(pingpong ? PingPong::kStages : Cooperative::kStages) + " stages, group " +
         std::to_string(group) + split + ", " + std::to_string(grid) + " persistent CTAs" +
         (gated ? ", the gated activation in the epilogue" : "");
}

bool Sm90Tier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major != 9 || g.k == 0) return false;
  switch (g.dtype) {
    case DType::bfloat16: case DType::float16: case DType::float8_e4m3fn: case DType::float8_e5m2:
      break;
    case DType::float32:
      if (!g.allow_tf32) return false;
      break;
    default: return false;
  }
  if (!out_ok(g.dtype, g.out_dtype) || !has_sm90a_code()) return false;
  if (is_gated(g.activation) && !gated_ok(g)) return false;
  if (g.offs && !grouped_ok(g)) return false;
  // Block-wise scales: e4m3 (the block-scaled schedule's one instance), one matrix, no beta.
  if (g.scale_blockwise && (g.dtype != DType::float8_e4m3fn || g.batch != 1 || g.beta != 0.0f)) return false;
  const int64_t b_batch = g.offs ? g.groups : g.batch;
  return operand_ok(g.dtype, layout_a(g), g.batch, kBM) && operand_ok(g.dtype, layout_b(g), b_batch, 256);
}

Sm90Tier::Plan Sm90Tier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  if (g.scale_blockwise) {  // the block-scaled schedule, whole tiles
    Plan p;
    p.blocks = true;
    p.group = g.config.group > 0 ? g.config.group : 8;
    p.grid = int(std::max<int64_t>(1, std::min<int64_t>(tiles(g, BlockScaled::BN), ctx.sms)));
    return p;
  }
  if (g.offs && g.offs_over_k) {  // cooperative (its units' K blocks differ), whole tiles
    Plan p;
    p.group = g.config.group > 0 ? g.config.group : 8;
    p.grid = int(std::max<int64_t>(1, std::min<int64_t>(tiles(g, Cooperative::BN), ctx.sms)));
    return p;
  }
  if (g.offs) {
    // Grouped: whole tiles; the schedule chosen as for the rows padded by half a tile a group,
    // the grid the SMs or the most tiles there can be.
    GemmArgs padded = g;
    padded.m = g.m + g.groups * kBM / 2;
    padded.config.splits = 1;
    Plan p;
    p.pingpong = choose(padded, ctx).pingpong;
    p.group = g.config.group > 0 ? g.config.group : 8;
    const int bn = p.pingpong ? PingPong::BN : Cooperative::BN;
    const int64_t most = (g.m / kBM + g.groups) * ((g.n + bn - 1) / bn);
    p.grid = int(std::max<int64_t>(1, std::min<int64_t>(most, ctx.sms)));
    return p;
  }
  const Choice c = choose(g, ctx);
  Plan p;
  p.pingpong = c.pingpong;
  p.gated = is_gated(g.activation);
  p.splits = c.splits;
  p.whole = c.whole;
  p.group = g.config.group > 0 ? g.config.group : 8;
  const int64_t t = tiles(g, p.pingpong ? PingPong::BN : Cooperative::BN);
  const int64_t units = p.splits > 1 ? p.whole + (t - p.whole) * p.splits : t;
  p.grid = int(std::max<int64_t>(1, std::min<int64_t>(units, ctx.sms)));
  return p;
}

void Sm90Tier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  switch (g.dtype) {
    case DType::float16: launch_sm90<__half>(g, p, stream); break;
    case DType::float32: launch_sm90<float>(g, p, stream); break;
    case DType::float8_e4m3fn: launch_sm90<__nv_fp8_e4m3>(g, p, stream); break;
    case DType::float8_e5m2: launch_sm90<__nv_fp8_e5m2>(g, p, stream); break;
    default: launch_sm90<__nv_bfloat16>(g, p, stream); break;
  }
}

}  // namespace tessera::matrix
